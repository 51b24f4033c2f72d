#include "server/protocol.h"

#include <limits>
#include <set>

#include "server/api_error.h"
#include "text/tokenizer_utf8.h"

namespace duet {

namespace {

using nlohmann::json;

// Reads an object's fields with type checks and remembers which exist, so that what is left
// at the end is unknown. A null value counts as absent, as OpenAI treats it.
class Fields {
 public:
  explicit Fields(const json& obj) : obj_(obj) {}

  const json* get(const std::string& name) {
    seen_.insert(name);
    auto it = obj_.find(name);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  std::optional<double> number(const std::string& name) {
    const json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_number()) throw_bad_field(name, "'" + name + "' must be a number");
    return v->get<double>();
  }
  std::optional<int64_t> integer(const std::string& name) {
    const json* v = get(name);
    if (!v) return std::nullopt;
    return to_int(*v, name);
  }
  std::optional<bool> boolean(const std::string& name) {
    const json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) throw_bad_field(name, "'" + name + "' must be a boolean");
    return v->get<bool>();
  }
  std::optional<std::string> string(const std::string& name) {
    const json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_string()) throw_bad_field(name, "'" + name + "' must be a string");
    return v->get<std::string>();
  }
  void reject_unknown() const {
    for (auto it = obj_.begin(); it != obj_.end(); ++it)
      if (!seen_.count(it.key()))
        throw_bad_field(excerpt(it.key()),
                        "Unrecognized request argument supplied: " + excerpt(it.key()));
  }

  static int64_t to_int(const json& v, const std::string& name) {
    if (v.is_number_integer() && !v.is_number_unsigned()) return v.get<int64_t>();
    if (v.is_number_unsigned() && v.get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max()))
      return static_cast<int64_t>(v.get<uint64_t>());
    if (v.is_number_unsigned()) throw_bad_field(name, "'" + name + "' is too large");
    throw_bad_field(name, "'" + name + "' must be an integer");
  }

 private:
  const json& obj_;
  std::set<std::string> seen_;
};

std::vector<int32_t> token_ids(const json& arr, const std::string& name) {
  std::vector<int32_t> ids;
  for (const json& v : arr) {
    const int64_t id = Fields::to_int(v, name);
    if (id < 0 || id > std::numeric_limits<int32_t>::max())
      throw_bad_field(name, "'" + name + "' holds token id " + std::to_string(id) + ", out of range");
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

void parse_prompt(const json& p, ApiRequest& r) {
  if (p.is_string()) {
    r.prompt_text = p.get<std::string>();
  } else if (p.is_array() && p.empty()) {
    throw_bad_field("prompt", "the prompt is empty");
  } else if (p.is_array() && !p.empty() && p[0].is_number()) {
    r.prompt_ids = token_ids(p, "prompt");
    r.prompt_is_ids = true;
  } else if (p.is_array() && p.size() == 1 && (p[0].is_string() || p[0].is_array())) {
    parse_prompt(p[0], r);
  } else if (p.is_array() && p.size() > 1) {
    throw_bad_field("prompt", "only one prompt per request is supported");
  } else {
    throw_bad_field("prompt", "'prompt' must be a string or an array of token ids");
  }
  if (r.prompt_text.empty() && r.prompt_ids.empty()) throw_bad_field("prompt", "the prompt is empty");
}

// messages → [{role, content: string}]; content parts of type "text" are joined.
json parse_messages(const json& m) {
  if (!m.is_array()) throw_bad_field("messages", "'messages' must be an array");
  if (m.empty()) throw_bad_field("messages", "'messages' must not be empty");
  static const std::set<std::string> kRoles = {"system", "developer", "user", "assistant", "tool"};
  json out = json::array();
  for (const json& msg : m) {
    if (!msg.is_object()) throw_bad_field("messages", "each message must be an object");
    auto role = msg.find("role");
    if (role == msg.end() || !role->is_string() || !kRoles.count(role->get<std::string>()))
      throw_bad_field("messages", "each message needs a role: system, user, assistant or tool");
    std::string text;
    auto content = msg.find("content");
    if (content == msg.end() || content->is_null()) {
    } else if (content->is_string()) {
      text = content->get<std::string>();
    } else if (content->is_array()) {
      for (const json& part : *content) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string())
          throw_bad_field("messages", "only content parts of type 'text' are supported");
        text += part["text"].get<std::string>();
      }
    } else {
      throw_bad_field("messages", "message content must be a string or an array of parts");
    }
    json o = msg;
    o["content"] = text;
    out.push_back(o);
  }
  return out;
}

constexpr size_t kMaxStopBytes = 1024;  // per stop string

std::vector<std::string> parse_stop(const json& s) {
  std::vector<std::string> out;
  if (s.is_string()) {
    out.push_back(s.get<std::string>());
  } else if (s.is_array()) {
    for (const json& v : s) {
      if (!v.is_string()) throw_bad_field("stop", "'stop' must be a string or an array of strings");
      out.push_back(v.get<std::string>());
    }
  } else {
    throw_bad_field("stop", "'stop' must be a string or an array of strings");
  }
  if (out.size() > 16) throw_bad_field("stop", "at most 16 stop strings are supported");
  for (const std::string& x : out) {
    if (x.empty()) throw_bad_field("stop", "stop strings must not be empty");
    if (x.size() > kMaxStopBytes) {
      throw_bad_field("stop", "a stop string is " + std::to_string(x.size()) +
                                  " bytes long; at most " + std::to_string(kMaxStopBytes) +
                                  " are supported");
    }
  }
  return out;
}

// Fields accepted only at their neutral value.
void require_neutral(Fields& f) {
  for (const char* name : {"presence_penalty", "frequency_penalty"}) {
    auto v = f.number(name);
    if (v && *v != 0.0) throw_bad_field(name, std::string("'") + name + "' is not supported");
  }
  if (auto v = f.number("repetition_penalty"); v && *v != 1.0)
    throw_bad_field("repetition_penalty", "'repetition_penalty' is not supported");
  if (const json* v = f.get("logprobs"); v && !(v->is_boolean() && !v->get<bool>()))
    throw_bad_field("logprobs", "'logprobs' is not supported");
  if (const json* v = f.get("top_logprobs"); v && !(v->is_number() && v->get<double>() == 0))
    throw_bad_field("top_logprobs", "'top_logprobs' is not supported");
  if (auto v = f.boolean("echo"); v && *v) throw_bad_field("echo", "'echo' is not supported");
  if (auto v = f.integer("best_of"); v && *v != 1)
    throw_bad_field("best_of", "'best_of' must be 1");
  if (const json* v = f.get("logit_bias"); v && !(v->is_object() && v->empty()))
    throw_bad_field("logit_bias", "'logit_bias' is not supported");
  if (auto v = f.string("suffix"); v && !v->empty())
    throw_bad_field("suffix", "'suffix' is not supported");
  f.string("user");
}

}  // namespace

ApiRequest parse_api_request(const std::string& body, bool chat) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw ApiError(400, "the request body is not valid JSON");
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
  ApiRequest r;
  r.chat = chat;
  Fields f(j);
  if (auto m = f.string("model")) r.model = *m;
  if (chat) {
    const json* m = f.get("messages");
    if (!m) throw_bad_field("messages", "'messages' is required");
    r.messages = parse_messages(*m);
  } else {
    const json* p = f.get("prompt");
    if (!p) throw_bad_field("prompt", "'prompt' is required");
    parse_prompt(*p, r);
  }
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    if (!chat && std::string(name) == "max_completion_tokens") continue;
    if (auto v = f.integer(name)) {
      if (*v < 1) throw_bad_field(name, std::string("'") + name + "' must be at least 1");
      r.max_tokens = *v;
    }
  }
  if (auto v = f.number("temperature")) {
    if (!(*v >= 0 && *v <= 2)) throw_bad_field("temperature", "'temperature' must be in [0, 2]");
    r.sampling.temperature = static_cast<float>(*v);
  } else {
    r.sampling.temperature = 1.0f;  // OpenAI's default
  }
  if (auto v = f.number("top_p")) {
    if (!(*v > 0 && *v <= 1)) throw_bad_field("top_p", "'top_p' must be in (0, 1]");
    r.sampling.top_p = static_cast<float>(*v);
  }
  if (auto v = f.integer("top_k")) {
    if (*v < -1 || *v > std::numeric_limits<int32_t>::max())
      throw_bad_field("top_k", "'top_k' must be -1, 0 or a positive integer");
    r.sampling.top_k = static_cast<int32_t>(*v);
  }
  if (auto v = f.integer("seed")) r.sampling.seed = static_cast<uint64_t>(*v);
  if (const json* v = f.get("stop")) r.stop = parse_stop(*v);
  if (const json* v = f.get("stop_token_ids")) {
    if (!v->is_array()) throw_bad_field("stop_token_ids", "'stop_token_ids' must be an array");
    r.stop_token_ids = token_ids(*v, "stop_token_ids");
  }
  if (auto v = f.boolean("ignore_eos")) r.ignore_eos = *v;
  if (auto v = f.integer("n"); v && *v != 1) throw_bad_field("n", "only n = 1 is supported");
  if (auto v = f.boolean("stream")) r.stream = *v;
  if (const json* so = f.get("stream_options")) {
    if (!r.stream) throw_bad_field("stream_options", "'stream_options' needs 'stream': true");
    if (!so->is_object()) throw_bad_field("stream_options", "'stream_options' must be an object");
    Fields sf(*so);
    if (auto v = sf.boolean("include_usage")) r.include_usage = *v;
    sf.boolean("continuous_usage_stats");
    sf.reject_unknown();
  }
  require_neutral(f);
  f.reject_unknown();
  return r;
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

namespace {
json reason_json(const std::string& r) { return r.empty() ? json(nullptr) : json(r); }

json envelope(const ResponseMeta& m, const char* object) {
  return {{"id", m.id}, {"object", object}, {"created", m.created}, {"model", m.model}};
}
}  // namespace

json response_json(const ResponseMeta& m, const std::string& text, const std::string& finish_reason,
                   const Usage& u) {
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", reason_json(finish_reason)}};
  if (m.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  json out = envelope(m, m.chat ? "chat.completion" : "text_completion");
  out["choices"] = json::array({choice});
  out["usage"] = usage_json(u);
  return out;
}

json chunk_json(const ResponseMeta& m, const std::string& text, const std::string& finish_reason,
                bool first_chat_chunk, bool include_usage) {
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", reason_json(finish_reason)}};
  if (m.chat) {
    json delta = json::object();
    if (first_chat_chunk) delta["role"] = "assistant";
    if (!text.empty() || first_chat_chunk) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  json out = envelope(m, m.chat ? "chat.completion.chunk" : "text_completion");
  out["choices"] = json::array({choice});
  if (include_usage) out["usage"] = nullptr;
  return out;
}

namespace {

// s as a JSON string, escaped as nlohmann::json's dump() escapes it (valid UTF-8 passes through;
// quote, backslash and control characters escaped, short forms where JSON has them).
void append_json_string(std::string& out, const std::string& s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

}  // namespace

std::string chunk_event(const ResponseMeta& m, const std::string& text,
                        const std::string& finish_reason, bool first_chat_chunk,
                        bool include_usage) {
  if (!utf8::is_valid(text) || !utf8::is_valid(m.id) || !utf8::is_valid(m.model)) {
    return "data: " + chunk_json(m, text, finish_reason, first_chat_chunk, include_usage).dump() +
           "\n\n";
  }
  // nlohmann::json objects keep their keys sorted: the same order here.
  std::string out;
  out.reserve(160 + m.id.size() + m.model.size() + text.size() + text.size() / 8);
  out += "data: {\"choices\":[{";
  if (m.chat) {
    out += "\"delta\":{";
    const bool content = !text.empty() || first_chat_chunk;
    if (content) {
      out += "\"content\":";
      append_json_string(out, text);
    }
    if (first_chat_chunk) out += content ? ",\"role\":\"assistant\"" : "\"role\":\"assistant\"";
    out += "},";
  }
  out += "\"finish_reason\":";
  if (finish_reason.empty()) {
    out += "null";
  } else {
    append_json_string(out, finish_reason);
  }
  out += ",\"index\":0,\"logprobs\":null";
  if (!m.chat) {
    out += ",\"text\":";
    append_json_string(out, text);
  }
  out += "}],\"created\":";
  out += std::to_string(m.created);
  out += ",\"id\":";
  append_json_string(out, m.id);
  out += ",\"model\":";
  append_json_string(out, m.model);
  out += ",\"object\":";
  out += m.chat ? "\"chat.completion.chunk\"" : "\"text_completion\"";
  if (include_usage) out += ",\"usage\":null";
  out += "}\n\n";
  return out;
}

json usage_chunk_json(const ResponseMeta& m, const Usage& u) {
  json out = envelope(m, m.chat ? "chat.completion.chunk" : "text_completion");
  out["choices"] = json::array();
  out["usage"] = usage_json(u);
  return out;
}

}  // namespace duet
