// Texts and conversations on which duet must match the JavaScript references exactly.

const longWhitespace = "a" + " ".repeat(37) + "b\n\n\n\n\t\t\t  \n" + " ".repeat(200) + "c" + "\t".repeat(9);

export const texts = [
  "",
  " ",
  "a",
  "Hello world",
  " Hello world",
  "  leading and trailing spaces  ",
  "The quick brown fox jumps over the lazy dog. It's 3:45 p.m.; they'll arrive at 5!",
  "In the history of science, few ideas have been as productive as the notion that nature can be described by simple rules. " +
    "Galileo measured the time it took for a ball to roll down an inclined plane; Newton generalized those measurements.\n\n" +
    "\"You're up early again,\" said Thomas. \"I'm always up early,\" she answered. DON'T Won'T I'M we'LL they'RE.",
  "int main() {\n  std::vector<int> v = {1, 2, 3};\n  for (auto& x : v) x *= 2;\n  return v[0] + 42;  // done\n}\n",
  "def load(path):\n    \"\"\"Reads JSON.\"\"\"\n    with open(path) as f:\n        return json.load(f)\n\n\nclass A:\n\tpass\r\n",
  "<html><body class=\"x\">&nbsp;<a href='https://example.com/a?b=1&c=2#frag'>link</a></body></html>",
  "{\"model\": \"small\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi!\"}], \"max_tokens\": 128, \"temperature\": 0.7}",
  "中文测试，你好世界。今天天气很好，我们去公园散步吧！机器学习和自然语言处理是人工智能的重要分支。",
  "日本語のテキストです。カタカナとひらがな、そして漢字が混ざっています。東京は日本の首都です。ｶﾀｶﾅ",
  "한국어 텍스트입니다. 안녕하세요!",
  "Русский текст: Съешь же ещё этих мягких французских булок, да выпей чаю.",
  "العربية: مرحبا بالعالم. हिन्दी: नमस्ते दुनिया। ไทย: สวัสดีชาวโลก Ελληνικά: Γειά σου Κόσμε",
  "emoji 🎉🚀👍🏽 and families 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 keycap 1️⃣ ❤️ 🤖🦄",
  "accents: café naïve Straße Ωμέγα résumé façade São Paulo Zürich",
  "combining: e\u0301 a\u0308 A\u030a \u1100\u1161\u11a8 \u212b x\u0323\u0307",
  longWhitespace,
  "\n\n\n\n\n\n\n\nx\r\n\r\n  \t \u00a0\u2003\u3000 y",
  "1234567890 3.14159 1,000,000 0x1F 2024-06-01 12:30:45 -42 +7 1e-10 ١٢٣ ４５６ ⅫⅣ",
  "99999999999999999999999999 0000 007 3.0.1 v1.2.3-rc.4",
  "Mixed: English中文日本語한국어English again, 123abc四五六, emoji🙂text",
  "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHi<|im_end|>",
  "<|endoftext|><|endoftext|> <|im_end|>x<|im_start|",
  "<｜begin▁of▁sentence｜>You are helpful.<｜User｜>What is 2+2?<｜Assistant｜>4<｜end▁of▁sentence｜>",
  "<s>[INST] Hello [/INST] Hi there</s><s>[INST] again </s> <unk>",
  "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call> <think>x</think>",
  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
  "Pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism supercalifragilistic",
  "x=1;y=2;z=x+y;print(f'{z:.3f}')  # → 3.000 ≤ ≥ ≠ ∑ ∫ √ ∞ ± × ÷",
  "| col1 | col2 |\n|------|------|\n| *a*  | **b** |\n\n> quote\n\n- item\n  - nested\n",
  "Tabs\tand\u000bvertical\u000cform feeds, zero\u200bwidth and\u00adsoft hyphen, bom\ufeffhere",
  "▁already▁has▁metaspace ▁ ▁▁",
  "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D",
  "ＡＢＣ１２３ fullwidth、句読点。「括弧」『二重』【隅付き】",
];

export const conversations = [
  {messages: [{role: "user", content: "Hello!"}], add_generation_prompt: true},
  {messages: [{role: "user", content: "Hello!"}], add_generation_prompt: false},
  {
    messages: [
      {role: "system", content: "You are a helpful assistant."},
      {role: "user", content: "What is the capital of France?"},
    ],
    add_generation_prompt: true,
  },
  {
    messages: [
      {role: "system", content: "You are terse."},
      {role: "user", content: "2+2?"},
      {role: "assistant", content: "4"},
      {role: "user", content: "And 3+3? 中文回答。"},
    ],
    add_generation_prompt: true,
  },
  {
    messages: [
      {role: "user", content: "Tell me a joke 😀"},
      {role: "assistant", content: "Why did the chicken cross the road?"},
      {role: "user", content: "Why?"},
      {role: "assistant", content: "To get to the other side."},
    ],
    add_generation_prompt: false,
  },
  {
    // Reasoning in the content: the Qwen3 template moves it into a <think> block.
    messages: [
      {role: "user", content: "Think first."},
      {role: "assistant", content: "<think>\nSome reasoning.\nMore.\n</think>\n\nThe answer is 42."},
    ],
    add_generation_prompt: false,
  },
  {
    messages: [
      {role: "user", content: "First question"},
      {role: "assistant", content: "<think>\nold reasoning\n</think>\n\nold answer"},
      {role: "user", content: "Second question"},
    ],
    add_generation_prompt: true,
  },
  {
    messages: [
      {role: "system", content: "Line one\nLine two\n\nLine four"},
      {role: "user", content: "  spaces around  "},
      {role: "assistant", content: "ok"},
      {role: "user", content: "<|im_start|> literal specials <｜User｜> [INST]"},
    ],
    add_generation_prompt: true,
  },
  {messages: [{role: "user", content: ""}], add_generation_prompt: true},
  {
    messages: [{role: "user", content: "No thinking please."}],
    add_generation_prompt: true,
    chat_template_kwargs: {enable_thinking: false},
  },
  {
    messages: [
      {role: "system", content: "sys A"},
      {role: "system", content: "sys B"},
      {role: "user", content: "two system messages"},
    ],
    add_generation_prompt: true,
  },
  {
    // Tool calls (arguments as an object and as a string) and tool results.
    messages: [
      {role: "user", content: "Weather in Paris?"},
      {
        role: "assistant",
        content: "",
        tool_calls: [
          {type: "function", function: {name: "get_weather", arguments: {city: "Paris", days: 3}}},
          {type: "function", function: {name: "get_time", arguments: "{\"tz\": \"CET\"}"}},
        ],
      },
      {role: "tool", content: "{\"temp\": 21}"},
      {role: "tool", content: "12:00"},
      {role: "assistant", content: "It is 21 degrees at noon."},
    ],
    add_generation_prompt: false,
    chat_template_kwargs: {
      tools: [
        {
          type: "function",
          function: {
            name: "get_weather",
            description: "Weather forecast",
            parameters: {type: "object", properties: {city: {type: "string"}, days: {type: "integer"}}, required: ["city"]},
          },
        },
      ],
    },
  },
];

// DeepSeek-V3's template reads tool calls with arguments as strings and content null.
export const deepseekToolConversation = {
  messages: [
    {role: "user", content: "Weather in Paris?"},
    {
      role: "assistant",
      content: null,
      tool_calls: [
        {type: "function", function: {name: "get_weather", arguments: "{\"city\": \"Paris\"}"}},
        {type: "function", function: {name: "get_time", arguments: "{}"}},
      ],
    },
    {role: "tool", content: "{\"temp\": 21}"},
    {role: "tool", content: "12:00"},
    {role: "assistant", content: "Sunny, 21 degrees."},
    {role: "user", content: "Thanks"},
  ],
  add_generation_prompt: true,
};

// Mixtral-8x7B-Instruct-v0.1's chat template.
export const mixtralTemplate =
  "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}";

// Llama-2-chat's template (system prompt folded into the first user turn).
export const llama2ChatTemplate =
  "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";
