#include "text/tokenizer_normalizer.h"

#include "core/error.h"
#include "text/tokenizer_json.h"
#include "text/tokenizer_nfc.h"
#include "text/tokenizer_utf8.h"

namespace duet {

namespace {

using json = nlohmann::json;


}  // namespace

void TextNormalizer::parse(const json& j, const std::string& source) {
  const std::string type = component_type(j);
  if (type == "null") return;
  if (type == "Sequence") {
    for (const json& n : j.at("normalizers")) parse(n, source);
    return;
  }
  Step step;
  if (type == "NFC") {
    step.kind = Kind::kNfc;
  } else if (type == "Prepend") {
    step.kind = Kind::kPrepend;
    step.text = j.at("prepend").get<std::string>();
  } else if (type == "Replace") {
    step.kind = Kind::kReplace;
    const json& pattern = j.at("pattern");
    step.content = j.at("content").get<std::string>();
    if (pattern.contains("String")) {
      step.text = pattern.at("String").get<std::string>();
      if (step.text.empty()) DUET_ERROR(source << ": normalizer Replace with an empty pattern");
    } else if (pattern.contains("Regex")) {
      step.regex =
          std::make_shared<TokenRegex>(pattern.at("Regex").get<std::string>(), false, source);
    } else {
      DUET_ERROR(source << ": unsupported normalizer Replace pattern " << pattern.dump()
                        << " (supported: String, Regex)");
    }
  } else if (type == "Strip") {
    step.kind = Kind::kStrip;
    step.strip_left = j.value("strip_left", true);
    step.strip_right = j.value("strip_right", true);
  } else {
    DUET_ERROR(source << ": unsupported normalizer '" << type
                      << "' (supported: NFC, Prepend, Replace, Strip, Sequence)");
  }
  steps_.push_back(std::move(step));
}

bool TextNormalizer::apply_step(const Step& step, std::string_view s, std::string* out) {
  switch (step.kind) {
    case Kind::kNfc:
      if (nfc::is_quick_nfc(s)) return false;
      *out = nfc::normalize(s);
      return true;
    case Kind::kPrepend:
      // As Hugging Face: an empty string stays empty.
      if (s.empty()) return false;
      *out = step.text;
      out->append(s);
      return true;
    case Kind::kReplace: {
      std::vector<TextSpan> matches;
      if (step.regex != nullptr) {
        step.regex->find_all(s, &matches);
      } else {
        for (size_t pos = s.find(step.text); pos != std::string_view::npos;
             pos = s.find(step.text, pos + step.text.size())) {
          matches.push_back({pos, pos + step.text.size()});
        }
      }
      if (matches.empty()) return false;
      out->clear();
      size_t prev = 0;
      for (const TextSpan& m : matches) {
        out->append(s.substr(prev, m.begin - prev));
        out->append(step.content);
        prev = m.end;
      }
      out->append(s.substr(prev));
      return true;
    }
    case Kind::kStrip: {
      size_t begin = 0, end = s.size();
      if (step.strip_left) {
        while (begin < end) {
          size_t i = begin;
          if (!utf8::is_whitespace(utf8::next(s, &i))) break;
          begin = i;
        }
      }
      if (step.strip_right) {
        while (end > begin) {
          size_t start = end - 1;
          while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
          size_t i = start;
          if (!utf8::is_whitespace(utf8::next(s, &i))) break;
          end = start;
        }
      }
      if (begin == 0 && end == s.size()) return false;
      *out = std::string(s.substr(begin, end - begin));
      return true;
    }
  }
  return false;
}

bool TextNormalizer::apply(std::string_view text, std::string* out) const {
  bool changed = false;
  std::string next;
  for (const Step& step : steps_) {
    if (!apply_step(step, changed ? std::string_view(*out) : text, &next)) continue;
    out->swap(next);
    changed = true;
  }
  return changed;
}

}  // namespace duet
