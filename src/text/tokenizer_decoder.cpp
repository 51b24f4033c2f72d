#include "text/tokenizer_decoder.h"

#include "core/error.h"
#include "text/tokenizer_json.h"
#include "text/tokenizer.h"
#include "text/tokenizer_byte_level.h"
#include "text/tokenizer_utf8.h"

namespace duet {

namespace {

using json = nlohmann::json;


// The byte of a "<0xAB>" token (either case of hex digits, as Hugging Face's ByteFallback
// decoder reads it); -1 for any other token.
int16_t byte_token_value(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return -1;
  int value = 0;
  for (char c : token.substr(3, 2)) {
    int digit = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return int16_t(value);
}

void replace_all(std::string* s, const std::string& from, const std::string& to) {
  if (from.empty() || s->find(from) == std::string::npos) return;
  std::string out;
  size_t prev = 0;
  for (size_t pos = s->find(from); pos != std::string::npos; pos = s->find(from, prev)) {
    out.append(*s, prev, pos - prev);
    out += to;
    prev = pos + from.size();
  }
  out.append(*s, prev);
  s->swap(out);
}

}  // namespace

void TokenDecoder::parse(const json& j, const std::string& source) {
  source_ = source;
  const std::string type = component_type(j);
  const json steps = type == "Sequence" ? j.at("decoders") : json::array({j});
  auto refuse_order = [&](const std::string& step, const char* after) {
    DUET_ERROR(source << ": unsupported decoder order: '" << step << "' after " << after);
  };
  for (const json& step : steps) {
    const std::string t = component_type(step);
    if (t == "ByteLevel") {
      if (steps.size() != 1) {
        DUET_ERROR(source << ": unsupported decoder: ByteLevel combined with other decoders");
      }
      byte_level_ = true;
    } else if (t == "Replace" || t == "Metaspace") {
      if (byte_fallback_) refuse_order(t, "ByteFallback");
      if (fused_) refuse_order(t, "Fuse");
      TokenStep ts;
      if (t == "Replace") {
        const json& pattern = step.at("pattern");
        if (!pattern.contains("String")) {
          DUET_ERROR(source << ": unsupported decoder Replace pattern " << pattern.dump()
                            << " (supported: String)");
        }
        ts.from = pattern.at("String").get<std::string>();
        ts.to = step.at("content").get<std::string>();
      } else {
        ts.from = step.value("replacement", std::string("\xe2\x96\x81"));
        ts.to.assign(1, ' ');  // (not = " ": GCC 12 warns falsely)
        const std::string scheme = step.value("prepend_scheme", std::string("always"));
        const bool never = scheme == "never" || (step.contains("add_prefix_space") &&
                                                 !step.at("add_prefix_space").get<bool>());
        ts.metaspace = !never;
      }
      token_steps_.push_back(std::move(ts));
    } else if (t == "ByteFallback") {
      if (fused_) refuse_order(t, "Fuse");
      byte_fallback_ = true;
    } else if (t == "Fuse") {
      fused_ = true;
    } else if (t == "Strip") {
      if (!fused_) {
        DUET_ERROR(source << ": unsupported decoder order: 'Strip' before Fuse (per-token strip)");
      }
      if (step.value("stop", 0) != 0) {
        DUET_ERROR(source << ": unsupported decoder Strip with stop " << step.at("stop").dump()
                          << " (supported: 0)");
      }
      strip_content_ = step.at("content").get<std::string>();
      strip_start_ = step.value("start", 0);
    } else {
      DUET_ERROR(source << ": unsupported decoder '" << t
                        << "' (supported: ByteLevel, Replace, Metaspace, ByteFallback, Fuse, "
                           "Strip, Sequence)");
    }
  }
}

std::string TokenDecoder::apply_token_steps(std::string token, bool first) const {
  for (const TokenStep& step : token_steps_) {
    replace_all(&token, step.from, step.metaspace && first ? std::string() : step.to);
  }
  return token;
}

void TokenDecoder::prepare(const Vocab& vocab) {
  vocab_ = &vocab;
  const int32_t n = vocab.size();
  piece_.assign(n, std::string());
  byte_.assign(n, -1);
  bool any_metaspace = false;
  for (const TokenStep& step : token_steps_) any_metaspace |= step.metaspace;
  if (any_metaspace) first_piece_.assign(n, std::string());
  std::string raw;
  for (int32_t id = 0; id < n; ++id) {
    if (!vocab.valid(id)) continue;
    const std::string& token = vocab.id_token[id];
    if (byte_level_) {
      // A token with a character outside the alphabet (an added token such as "<｜User｜>")
      // decodes to its own bytes, as in Hugging Face's ByteLevel decoder.
      piece_[id] = byte_level::decode_token(token, &raw) ? raw : token;
      continue;
    }
    piece_[id] = apply_token_steps(token, false);
    if (any_metaspace) first_piece_[id] = apply_token_steps(token, true);
    if (byte_fallback_) byte_[id] = byte_token_value(piece_[id]);
  }
}

DecodeState TokenDecoder::begin() const {
  DecodeState state;
  state.strip_left = strip_start_;
  return state;
}

void TokenDecoder::emit(DecodeState* state, std::string_view text, std::string* out) const {
  size_t pos = 0;
  if (state->strip_left > 0) {
    while (state->strip_left > 0 && pos < text.size() &&
           text.substr(pos, strip_content_.size()) == strip_content_) {
      pos += strip_content_.size();
      --state->strip_left;
    }
    if (pos < text.size()) state->strip_left = 0;  // the text has started
  }
  out->append(text.substr(pos));
}

void TokenDecoder::flush_bytes(DecodeState* state, std::string* out) const {
  if (state->pending.empty()) return;
  std::string text;
  if (utf8::is_valid(state->pending)) {
    text.swap(state->pending);
  } else {
    for (size_t i = 0; i < state->pending.size(); ++i) text += utf8::kReplacementChar;
  }
  state->pending.clear();
  emit(state, text, out);
}

void TokenDecoder::push(DecodeState* state, int32_t id, bool skip_special, std::string* out) const {
  if (!vocab_->valid(id)) {
    DUET_ERROR(source_ << ": cannot decode unknown token id " << id << " (vocab size "
                       << vocab_->size() << ")");
  }
  if (skip_special && vocab_->id_kind[id] == IdKind::kSpecial) return;
  const bool first = state->n_tokens++ == 0;
  if (byte_level_) {
    state->pending += piece_[id];
    const size_t end = utf8::stable_end(state->pending);
    if (end == 0) return;
    out->append(utf8_lossy(state->pending.substr(0, end)));
    state->pending.erase(0, end);
    return;
  }
  if (byte_fallback_ && byte_[id] >= 0) {
    state->pending.push_back(char(byte_[id]));
    return;
  }
  flush_bytes(state, out);
  emit(state, first && !first_piece_.empty() ? first_piece_[id] : piece_[id], out);
}

void TokenDecoder::finish(DecodeState* state, std::string* out) const {
  if (byte_level_) {
    if (!state->pending.empty()) out->append(utf8_lossy(state->pending));
    state->pending.clear();
    return;
  }
  flush_bytes(state, out);
}

}  // namespace duet
