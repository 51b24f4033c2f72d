#include "text/tokenizer_pretokenizer.h"

#include <algorithm>

#include "core/error.h"
#include "text/tokenizer_json.h"

namespace duet {

namespace {

using json = nlohmann::json;


SplitBehavior parse_behavior(const std::string& behavior, const std::string& source) {
  if (behavior == "Isolated") return SplitBehavior::kIsolated;
  if (behavior == "Removed") return SplitBehavior::kRemoved;
  if (behavior == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (behavior == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (behavior == "Contiguous") return SplitBehavior::kContiguous;
  DUET_ERROR(source << ": unsupported Split behavior '" << behavior
                    << "' (supported: Isolated, Removed, MergedWithPrevious, MergedWithNext, "
                       "Contiguous)");
}

}  // namespace

void split_piece(std::string_view p, const std::vector<TextSpan>& matches, SplitBehavior behavior,
                 bool invert, std::vector<std::string_view>* out) {
  if (behavior == SplitBehavior::kIsolated && !invert) {  // the common case, without copies
    size_t prev = 0;
    for (const TextSpan& m : matches) {
      if (m.begin > prev) out->push_back(p.substr(prev, m.begin - prev));
      out->push_back(p.substr(m.begin, m.end - m.begin));
      prev = m.end;
    }
    if (prev < p.size()) out->push_back(p.substr(prev));
    return;
  }
  struct Part {
    size_t begin, end;
    bool is_match;
  };
  std::vector<Part> parts;  // p cut into gaps and matches, in order
  size_t prev = 0;
  for (const TextSpan& m : matches) {
    if (m.begin > prev) parts.push_back({prev, m.begin, invert});
    parts.push_back({m.begin, m.end, !invert});
    prev = m.end;
  }
  if (prev < p.size()) parts.push_back({prev, p.size(), invert});

  std::vector<Part> kept;
  bool prev_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      kept = parts;
      break;
    case SplitBehavior::kRemoved:
      for (const Part& part : parts) {
        if (!part.is_match) kept.push_back(part);
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Part& part : parts) {
        if (part.is_match && !prev_match && !kept.empty()) {
          kept.back().end = part.end;
        } else {
          kept.push_back(part);
        }
        prev_match = part.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->is_match && !prev_match && !kept.empty()) {
          kept.back().begin = it->begin;
        } else {
          kept.push_back(*it);
        }
        prev_match = it->is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    case SplitBehavior::kContiguous:
      for (const Part& part : parts) {
        if (part.is_match == prev_match && !kept.empty()) {
          kept.back().end = part.end;
        } else {
          kept.push_back(part);
        }
        prev_match = part.is_match;
      }
      break;
  }
  for (const Part& part : kept) out->push_back(p.substr(part.begin, part.end - part.begin));
}

void PreTokenizer::parse(const json& j, const std::string& source) {
  const std::string type = component_type(j);
  if (type == "null") return;
  if (type == "Sequence") {
    for (const json& p : j.at("pretokenizers")) parse(p, source);
    return;
  }
  if (type != "Split" && type != "ByteLevel" && type != "Metaspace") {
    DUET_ERROR(source << ": unsupported pre_tokenizer '" << type
                      << "' (supported: ByteLevel, Split, Metaspace, Sequence)");
  }
  if (byte_level()) {
    DUET_ERROR(source << ": unsupported pre_tokenizer order: '" << type
                      << "' after ByteLevel (ByteLevel must be last)");
  }
  parse_step(j, type, source);
}

void PreTokenizer::parse_step(const json& j, const std::string& type, const std::string& source) {
  Step step;
  if (type == "ByteLevel") {
    // Defaults as in Hugging Face's ByteLevel: add_prefix_space and use_regex true.
    step.kind = Kind::kByteLevel;
    step.add_prefix_space = j.value("add_prefix_space", true);
    if (j.value("use_regex", true)) {
      step.regex = std::make_shared<TokenRegex>(kGpt2Pattern, false, source);
    }
  } else if (type == "Metaspace") {
    step.kind = Kind::kMetaspace;
    step.replacement = j.value("replacement", std::string("\xe2\x96\x81"));
    if (step.replacement.empty()) DUET_ERROR(source << ": Metaspace with an empty replacement");
    const std::string scheme = j.value("prepend_scheme", std::string("always"));
    if (scheme == "always") {
      step.prepend = Prepend::kAlways;
    } else if (scheme == "first") {
      step.prepend = Prepend::kFirst;
    } else if (scheme == "never") {
      step.prepend = Prepend::kNever;
    } else {
      DUET_ERROR(source << ": unsupported Metaspace prepend_scheme '" << scheme
                        << "' (supported: always, first, never)");
    }
    // Files from before prepend_scheme say add_prefix_space false for "never".
    if (j.contains("add_prefix_space") && !j.at("add_prefix_space").get<bool>()) {
      step.prepend = Prepend::kNever;
    }
    step.metaspace_split = j.value("split", true);
  } else {
    step.kind = Kind::kSplit;
    const json& pattern = j.at("pattern");
    if (pattern.contains("Regex")) {
      step.regex =
          std::make_shared<TokenRegex>(pattern.at("Regex").get<std::string>(), false, source);
    } else if (pattern.contains("String")) {
      step.regex =
          std::make_shared<TokenRegex>(pattern.at("String").get<std::string>(), true, source);
    } else {
      DUET_ERROR(source << ": unsupported Split pattern " << pattern.dump()
                        << " (supported: Regex, String)");
    }
    step.behavior = parse_behavior(j.at("behavior").get<std::string>(), source);
    step.invert = j.value("invert", false);
  }
  steps_.push_back(std::move(step));
}

void PreTokenizer::metaspace(const Step& step, std::string_view p, bool first,
                             std::deque<std::string>* arena,
                             std::vector<std::string_view>* out) const {
  std::string& s = arena->emplace_back();
  s.reserve(p.size() + 8);
  const std::string_view rep = step.replacement;
  const bool starts_with_rep = p.substr(0, rep.size()) == rep || (!p.empty() && p[0] == ' ');
  if (!starts_with_rep &&
      (step.prepend == Prepend::kAlways || (step.prepend == Prepend::kFirst && first))) {
    s.append(rep);
  }
  for (char c : p) {
    if (c == ' ') {
      s.append(rep);
    } else {
      s.push_back(c);
    }
  }
  const std::string_view text(s);
  if (!step.metaspace_split) {
    if (!text.empty()) out->push_back(text);
    return;
  }
  // Split before every replacement (MergedWithNext).
  size_t begin = 0;
  for (size_t pos = text.find(rep, 1); pos != std::string_view::npos;
       pos = text.find(rep, pos + rep.size())) {
    out->push_back(text.substr(begin, pos - begin));
    begin = pos;
  }
  if (begin < text.size()) out->push_back(text.substr(begin));
}

void PreTokenizer::split(std::string_view text, bool at_input_start, std::deque<std::string>* arena,
                         std::vector<std::string_view>* words) const {
  if (text.empty()) return;
  std::vector<std::string_view> pieces{text}, next;
  // Start of the piece that begins the input, if any (Metaspace "first").
  const char* input_start = at_input_start ? text.data() : nullptr;
  std::vector<TextSpan> matches;
  for (const Step& step : steps_) {
    next.clear();
    for (std::string_view p : pieces) {
      const bool first = input_start != nullptr && p.data() == input_start;
      if (step.kind == Kind::kMetaspace) {
        const size_t n = next.size();
        metaspace(step, p, first, arena, &next);
        if (first && next.size() > n) input_start = next[n].data();
        continue;
      }
      if (step.add_prefix_space && p[0] != ' ') {
        std::string& owned = arena->emplace_back(" ");
        owned.append(p);
        p = owned;
        if (first) input_start = p.data();
      }
      if (step.regex == nullptr) {
        next.push_back(p);
        continue;
      }
      matches.clear();
      step.regex->find_all(p, &matches);
      split_piece(p, matches, step.behavior, step.invert, &next);
    }
    pieces.swap(next);
  }
  words->insert(words->end(), pieces.begin(), pieces.end());
}

}  // namespace duet
