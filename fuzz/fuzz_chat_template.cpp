// Chat templates: the input is a Jinja source and a messages JSON, split at the first NUL byte.
// The source is parsed (or refused by name), then rendered with the messages if they parse (or
// refused); nothing else may happen. Rendering is bounded by the interpreter's own limits.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "text/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* p = reinterpret_cast<const char*>(data);
  const char* nul = static_cast<const char*>(std::memchr(p, 0, size));
  const std::string source(p, nul ? nul : p + size);
  const std::string messages_text = nul ? std::string(nul + 1, p + size) : std::string("[]");
  try {
    auto tmpl = duet::ChatTemplate::from_source(source, "<s>", "</s>", "fuzz");
    nlohmann::ordered_json messages =
        nlohmann::ordered_json::parse(messages_text, nullptr, /*allow_exceptions=*/false);
    if (messages.is_discarded()) {
      messages = nlohmann::ordered_json::array(
          {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "ok"}}});
    }
    tmpl->render(messages, true, nlohmann::ordered_json::object());
  } catch (const duet::Error&) {
  }
  return 0;
}
