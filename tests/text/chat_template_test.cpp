#include "text/chat_template.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "error_of.h"

namespace duet {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// Mixtral-8x7B-Instruct-v0.1's chat template.
const char* kMixtral =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ "
    "'[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ "
    "message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant "
    "roles are supported!') }}{% endif %}{% endfor %}";

using test::error_of;

// A template read as raw bytes (chat_template.jinja) may hold ill-formed UTF-8: printing a list
// shows each string as Python's repr, character by character; an ill-formed byte is kept as it
// is and the next character is read from the next byte (here the newline, escaped), never past
// the string (found by fuzz_chat_template: the lead byte's length was trusted).
TEST(ChatTemplateTest, IllFormedUtf8InTheSourceIsSteppedOver) {
  auto t = ChatTemplate::from_source("{{ ['\xe0\n'] }}|{{ ['a\xe2\x82'] }}", "<s>", "</s>",
                                     "raw.jinja");
  EXPECT_EQ(t->render(nlohmann::json::array(), false), "['\xe0\\n']|['a\xe2\x82']");
}

TEST(ChatTemplateTest, MixtralInstruct) {
  auto t = ChatTemplate::from_source(kMixtral, "<s>", "</s>", "mixtral.jinja");
  const json messages = json::parse(R"([{"role": "user", "content": "Hello"},
      {"role": "assistant", "content": "Hi"}, {"role": "user", "content": "How are you?"}])");
  EXPECT_EQ(t->render(messages, true), "<s>[INST] Hello [/INST]Hi</s>[INST] How are you? [/INST]");
  EXPECT_EQ(t->render(json::array(), false), "<s>");
  EXPECT_EQ(
      error_of([&] { t->render(json::parse(R"([{"role": "system", "content": "x"}])"), true); }),
      "mixtral.jinja: Conversation roles must alternate user/assistant/user/assistant/...");
}

TEST(ChatTemplateTest, VariablesContentPartsAndKeyOrder) {
  auto t = ChatTemplate::from_source(
      "{% for m in messages %}{{ m.content }}|{{ m.args | tojson }}\n{% endfor %}"
      "{%- if enable_thinking is defined and enable_thinking is false %}no-think{% endif %}",
      "", "", "t.jinja");
  const ordered_json messages = ordered_json::parse(
      R"([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
           "args": {"zeta": 1, "alpha": [true, null, 2.5, "é"]}}])");
  EXPECT_EQ(t->render(messages, false, ordered_json::object()),
            "a\nb|{\"zeta\": 1, \"alpha\": [true, null, 2.5, \"é\"]}\n");
  EXPECT_EQ(t->render(messages, false, ordered_json{{"enable_thinking", false}}),
            "a\nb|{\"zeta\": 1, \"alpha\": [true, null, 2.5, \"é\"]}\nno-think");
  EXPECT_EQ(error_of([&] { t->render(json::parse(R"([{"content": "x"}])"), false); }),
            "messages[0] must be an object with a string \"role\"");
  EXPECT_EQ(error_of([&] {
              t->render(json::parse(R"([{"role": "user", "content": [{"type": "image_url"}]}])"),
                        false);
            }),
            "messages[0].content: only parts of type \"text\" are supported");
}

class ChatTemplateLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("duet_chat_template_test_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write_config(const ordered_json& config) {
    std::ofstream(dir_ / "tokenizer_config.json") << config.dump();
  }
  std::filesystem::path dir_;
};

TEST_F(ChatTemplateLoadTest, ReadsConfigTemplateAndTokens) {
  write_config({{"bos_token", {{"__type", "AddedToken"}, {"content", "<s>"}}},
                {"eos_token", "</s>"},
                {"chat_template",
                 {{{"name", "tool_use"}, {"template", "tools"}},
                  {{"name", "default"}, {"template", kMixtral}}}}});
  auto t = ChatTemplate::load(dir_.string());
  EXPECT_EQ(t->render(json::parse(R"([{"role": "user", "content": "Hi"}])"), true),
            "<s>[INST] Hi [/INST]");
}

TEST_F(ChatTemplateLoadTest, RefusesUnsupportedTemplateAtLoad) {
  write_config({{"chat_template", "{% for m in messages %}{% include 'x' %}{% endfor %}"}});
  EXPECT_EQ(error_of([&] { ChatTemplate::load(dir_.string()); }),
            (dir_ / "tokenizer_config.json").string() +
                ": chat_template: line 1: unsupported Jinja statement 'include'");
  write_config({{"eos_token", "</s>"}});
  EXPECT_EQ(error_of([&] { ChatTemplate::load(dir_.string()); }),
            (dir_ / "tokenizer_config.json").string() +
                ": no chat_template (and no chat_template.jinja beside it)");
  std::ofstream(dir_ / "chat_template.jinja") << "{{ messages[0]['content'] }}!\n";
  EXPECT_EQ(ChatTemplate::load(dir_.string())
                ->render(json::parse(R"([{"role": "user", "content": "x"}])"), false),
            "x!");
}

}  // namespace
}  // namespace duet
