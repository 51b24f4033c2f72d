// ChatTemplate: the template parsed once at load by the Jinja interpreter (jinja_*.cpp), rendered
// per request with the variables Hugging Face's apply_chat_template passes.
#include "text/chat_template.h"

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "text/jinja_eval.h"
#include "text/jinja_parser.h"

namespace duet {

namespace {

using ordered_json = nlohmann::ordered_json;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) DUET_ERROR("cannot open " << path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A tokenizer_config.json token entry: "name", {"content": "name", ...} or null.
std::string token_name(const ordered_json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v.at("content").is_string()) {
    return v.at("content").get<std::string>();
  }
  return "";
}

// OpenAI content parts -> one string (text parts joined by "\n", as vLLM does for text models).
ordered_json flatten_content(const ordered_json& content, size_t index) {
  if (!content.is_array()) return content;
  std::string text;
  bool first = true;
  for (const ordered_json& part : content) {
    if (!part.is_object() || part.value("type", "") != std::string("text") ||
        !part.contains("text") || !part.at("text").is_string()) {
      DUET_ERROR("messages[" << index << "].content: only parts of type \"text\" are supported");
    }
    if (!first) text += "\n";
    first = false;
    text += part.at("text").get<std::string>();
  }
  return text;
}

class JinjaChatTemplate : public ChatTemplate {
 public:
  JinjaChatTemplate(const std::string& source, jinja::ValueDict tokens, std::string source_name)
      : source_name_(std::move(source_name)), tokens_(std::move(tokens)) {
    try {
      body_ = jinja::parse_template(source);
    } catch (const Error& e) {
      DUET_ERROR(source_name_ << ": chat_template: " << e.what());
    }
  }

  std::string render(const nlohmann::json& messages, bool add_generation_prompt) const override {
    return render(ordered_json::parse(messages.dump()), add_generation_prompt,
                  ordered_json::object());
  }

  std::string render(const ordered_json& messages, bool add_generation_prompt,
                     const ordered_json& variables) const override {
    if (!messages.is_array()) DUET_ERROR("messages must be an array");
    ordered_json checked = ordered_json::array();
    for (size_t k = 0; k < messages.size(); ++k) {
      const ordered_json& m = messages[k];
      if (!m.is_object() || !m.contains("role") || !m.at("role").is_string()) {
        DUET_ERROR("messages[" << k << "] must be an object with a string \"role\"");
      }
      ordered_json copy = m;
      if (copy.contains("content")) copy["content"] = flatten_content(copy.at("content"), k);
      checked.push_back(std::move(copy));
    }
    if (!variables.is_object()) DUET_ERROR("chat template variables must be an object");
    jinja::ValueDict globals = tokens_;
    globals.set("messages", jinja::from_json(checked));
    globals.set("add_generation_prompt", jinja::Value::boolean(add_generation_prompt));
    for (const auto& [key, value] : variables.items()) globals.set(key, jinja::from_json(value));
    try {
      return jinja::render(body_, globals);
    } catch (const Error& e) {
      DUET_ERROR(source_name_ << ": " << e.what());
    }
  }

 private:
  std::string source_name_;
  jinja::ValueDict tokens_;  // bos_token, eos_token, ...
  jinja::Body body_;
};

}  // namespace

std::unique_ptr<ChatTemplate> ChatTemplate::load(const std::string& model_dir) {
  const std::string path = model_dir + "/tokenizer_config.json";
  ordered_json config;
  try {
    config = ordered_json::parse(read_text(path));
  } catch (const ordered_json::exception& e) {
    DUET_ERROR(path << ": malformed JSON: " << e.what());
  }
  std::string source;
  std::string source_name = path;
  const ordered_json templ = config.value("chat_template", ordered_json());
  if (templ.is_string()) {
    source = templ.get<std::string>();
  } else if (templ.is_array()) {
    for (const ordered_json& t : templ) {
      if (t.is_object() && t.value("name", "") == std::string("default") &&
          t.contains("template")) {
        source = t.at("template").get<std::string>();
      }
    }
    if (source.empty()) DUET_ERROR(path << ": chat_template has no template named \"default\"");
  } else if (std::ifstream(model_dir + "/chat_template.jinja")) {
    source_name = model_dir + "/chat_template.jinja";
    source = read_text(source_name);
  } else {
    DUET_ERROR(path << ": no chat_template (and no chat_template.jinja beside it)");
  }
  jinja::ValueDict tokens;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    const std::string name = token_name(config.value(key, ordered_json()));
    if (!name.empty()) tokens.set(key, jinja::Value::string(name));
  }
  return std::make_unique<JinjaChatTemplate>(source, std::move(tokens), source_name);
}

std::unique_ptr<ChatTemplate> ChatTemplate::from_source(const std::string& jinja_source,
                                                        const std::string& bos_token,
                                                        const std::string& eos_token,
                                                        const std::string& source_name) {
  jinja::ValueDict tokens;
  tokens.set("bos_token", jinja::Value::string(bos_token));
  tokens.set("eos_token", jinja::Value::string(eos_token));
  return std::make_unique<JinjaChatTemplate>(jinja_source, std::move(tokens), source_name);
}

}  // namespace duet
