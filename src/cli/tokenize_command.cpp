// `duet tokenize MODEL_DIR`: the model's tokenizer and chat template on standard input.
//   (default)  text -> token ids as a JSON array (no special tokens added)
//   --decode   token ids (a JSON array, or numbers separated by spaces/commas) -> text
//   --chat     OpenAI-style messages (a JSON array, or {"messages": [...],
//              "add_generation_prompt": bool, "chat_template_kwargs": {...}}) -> rendered prompt
//   --jsonl    one JSON input per line, one JSON result per line (for scripts and tests):
//              encode: "text" -> [ids]; decode: [ids] -> {"text", "pieces"} where pieces are the
//              IncrementalDecoder's; chat: as above -> "prompt"
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "core/error.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace duet {

namespace {

using ordered_json = nlohmann::ordered_json;

struct TokenizeOptions {
  std::string model_dir;
  bool decode = false;
  bool chat = false;
  bool jsonl = false;
  bool skip_special = false;
  bool add_generation_prompt = false;
  std::string chat_template;  // a template file replacing the model's
};

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      DUET_ERROR("--decode: malformed JSON: " << e.what());
    }
    for (const auto& v : j) {
      if (!v.is_number_integer()) DUET_ERROR("--decode: " << v.dump() << " is not a token id");
      ids.push_back(v.get<int32_t>());
    }
    return ids;
  }
  std::string item;
  std::stringstream ss(text);
  while (ss >> item) {
    std::stringstream parts(item);
    std::string part;
    while (std::getline(parts, part, ',')) {
      if (part.empty()) continue;
      size_t used = 0;
      long v = 0;
      try {
        v = std::stol(part, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != part.size()) DUET_ERROR("--decode: '" << part << "' is not a token id");
      ids.push_back(int32_t(v));
    }
  }
  return ids;
}

std::unique_ptr<ChatTemplate> load_template(const TokenizeOptions& o) {
  if (o.chat_template.empty()) return ChatTemplate::load(o.model_dir);
  std::ifstream in(o.chat_template, std::ios::binary);
  if (!in) DUET_ERROR("cannot open " << o.chat_template);
  std::string source((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string bos, eos;
  std::ifstream config_in(o.model_dir + "/tokenizer_config.json");
  if (config_in) {
    const ordered_json config = ordered_json::parse(config_in, nullptr, false);
    auto name = [&](const char* key) {
      const ordered_json v =
          config.is_object() ? config.value(key, ordered_json()) : ordered_json();
      if (v.is_string()) return v.get<std::string>();
      if (v.is_object() && v.contains("content")) return v.at("content").get<std::string>();
      return std::string();
    };
    bos = name("bos_token");
    eos = name("eos_token");
  }
  return ChatTemplate::from_source(source, bos, eos, o.chat_template);
}

std::string render_chat(const ChatTemplate& t, const ordered_json& input, bool add_generation) {
  if (input.is_array()) return t.render(input, add_generation, ordered_json::object());
  if (!input.is_object() || !input.contains("messages")) {
    DUET_ERROR("--chat: expected a messages array or {\"messages\": [...], ...}");
  }
  return t.render(input.at("messages"), input.value("add_generation_prompt", add_generation),
                  input.value("chat_template_kwargs", ordered_json::object()));
}

ordered_json parse_json(const std::string& text, const char* what) {
  try {
    return ordered_json::parse(text);
  } catch (const ordered_json::exception& e) {
    DUET_ERROR(what << ": malformed JSON: " << e.what());
  }
}

void run_jsonl(const TokenizeOptions& o) {
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<ChatTemplate> chat;
  if (o.chat) {
    chat = load_template(o);
  } else {
    tok = Tokenizer::load(o.model_dir);
  }
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    const ordered_json input = parse_json(line, "--jsonl");
    ordered_json result;
    try {  // a bad input (or a template's raise_exception) answers {"error": ...} on its line
      if (o.chat) {
        result = render_chat(*chat, input, o.add_generation_prompt);
      } else if (o.decode) {
        std::vector<int32_t> ids = input.get<std::vector<int32_t>>();
        IncrementalDecoder stream(*tok, o.skip_special);
        ordered_json pieces = ordered_json::array();
        for (int32_t id : ids) pieces.push_back(stream.step(id));
        pieces.push_back(stream.finish());
        result = {{"text", tok->decode(ids, o.skip_special)}, {"pieces", pieces}};
      } else {
        result = tok->encode(input.get<std::string>());
      }
    } catch (const Error& e) {
      result = {{"error", e.what()}};
    } catch (const ordered_json::exception& e) {
      result = {{"error", e.what()}};
    }
    std::printf("%s\n", result.dump().c_str());
  }
}

void run_tokenize(const TokenizeOptions& o) {
  if (o.jsonl) {
    run_jsonl(o);
    return;
  }
  const std::string input((std::istreambuf_iterator<char>(std::cin)),
                          std::istreambuf_iterator<char>());
  if (o.chat) {
    const std::string prompt =
        render_chat(*load_template(o), parse_json(input, "--chat"), o.add_generation_prompt);
    std::fwrite(prompt.data(), 1, prompt.size(), stdout);
    return;
  }
  std::unique_ptr<Tokenizer> tok = Tokenizer::load(o.model_dir);
  if (o.decode) {
    const std::string text = tok->decode(parse_ids(input), o.skip_special);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return;
  }
  std::printf("%s\n", nlohmann::json(tok->encode(input)).dump().c_str());
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  CLI::App* cmd =
      app.add_subcommand("tokenize",
                         "Encode standard input to token ids, decode ids (--decode) or render chat "
                         "messages with the chat template (--chat)");
  cmd->add_option("model_dir", o->model_dir,
                  "Directory with tokenizer.json (or Kimi's tiktoken.model)")
      ->required();
  auto* decode = cmd->add_flag("--decode", o->decode, "Read token ids, print text");
  auto* chat = cmd->add_flag("--chat", o->chat, "Read messages JSON, print the rendered prompt");
  decode->excludes(chat);
  cmd->add_flag("--skip-special-tokens", o->skip_special, "--decode: drop special tokens");
  cmd->add_flag("--add-generation-prompt", o->add_generation_prompt,
                "--chat: end with the assistant's turn opener");
  cmd->add_option("--chat-template", o->chat_template,
                  "--chat: a Jinja template file instead of the model's");
  cmd->add_flag("--jsonl", o->jsonl, "One JSON input per line, one JSON result per line");
  cmd->callback([o] { run_tokenize(*o); });
}

}  // namespace duet
