// Chat templates: the Jinja chat_template of tokenizer_config.json applied to OpenAI-style
// messages, with the same output as Hugging Face's apply_chat_template.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace duet {

class ChatTemplate {
 public:
  // Reads MODEL_DIR/tokenizer_config.json: chat_template (a string, or a list of
  // {"name", "template"} where "default" is used; else MODEL_DIR/chat_template.jinja), bos_token,
  // eos_token, unk_token, pad_token. Throws duet::Error naming the file if there is no template
  // or it uses a construct the interpreter does not support (refused at load, never rendered
  // wrong).
  static std::unique_ptr<ChatTemplate> load(const std::string& model_dir);
  static std::unique_ptr<ChatTemplate> from_source(const std::string& jinja_source,
                                                   const std::string& bos_token,
                                                   const std::string& eos_token,
                                                   const std::string& source_name);
  virtual ~ChatTemplate() = default;

  // messages: a JSON array of {"role": ..., "content": ...} (OpenAI style). Throws duet::Error on
  // malformed messages or a template error (raise_exception in the template).
  virtual std::string render(const nlohmann::json& messages, bool add_generation_prompt) const = 0;

  // render() with extra template variables: an object such as {"enable_thinking": false} or
  // {"tools": [...]} (vLLM's chat_template_kwargs). Ordered JSON keeps the client's key order,
  // which tojson shows as Hugging Face does; nlohmann::json sorts keys. A message's content may
  // also be a list of {"type": "text", "text": ...} parts, joined with "\n" as vLLM does.
  virtual std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                             const nlohmann::ordered_json& variables) const = 0;
};

}  // namespace duet
