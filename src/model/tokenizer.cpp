// Byte-level BPE tokenizer. Loading turns tokenizer.json into the parts that encode() runs in
// order: an added-token matcher on the raw text, the NFC normalizer if asked for, a
// pre-tokenizer pipeline (Split regexes, then ByteLevel) that cuts each stretch between added
// tokens into pre-tokens, and a BPE merge table that turns each pre-token into ids. BPE works on
// raw bytes: the byte-level alphabet is undone once at load time, so encode() never maps text
// into it.
#include "model/tokenizer.h"

#include <algorithm>
#include <climits>
#include <deque>
#include <fstream>
#include <mutex>
#include <queue>
#include <sstream>
#include <string_view>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/tokenizer_bpe.h"
#include "model/tokenizer_byte_level.h"
#include "model/tokenizer_nfc.h"
#include "model/tokenizer_regex.h"

namespace duet {

// ---- UTF-8 and regexes --------------------------------------------------------------------

size_t valid_utf8_prefix(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    } else {
      return i;
    }
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      unsigned char cc = s[i + k];
      if ((cc & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr uint32_t kMinForLen[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLen[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return n;
}

TokenRegex::TokenRegex(const std::string& pattern, bool literal, const std::string& source_name) {
  // PCRE2_UCP may not be combined with PCRE2_LITERAL (and a literal needs no classes anyway).
  uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &err,
                        &err_offset, nullptr);
  if (code_ == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(err, message, sizeof(message));
    DUET_ERROR(source_name << ": bad regex '" << pattern << "': "
                           << reinterpret_cast<char*>(message) << " at offset " << err_offset);
  }
  pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // without JIT, pcre2_match interprets
}

TokenRegex::~TokenRegex() {
  pcre2_code_free(code_);
}

void TokenRegex::find_all(std::string_view text, std::vector<TextSpan>* out) const {
  struct MatchDataDeleter {
    void operator()(pcre2_match_data* md) const { pcre2_match_data_free(md); }
  };
  // One ovector pair is enough: only the whole match is used.
  thread_local std::unique_ptr<pcre2_match_data, MatchDataDeleter> match_data(
      pcre2_match_data_create(1, nullptr));
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t offset = 0;
  while (offset < n) {
    // The caller validated the UTF-8 once; without NO_UTF_CHECK PCRE2 would re-check per call.
    int rc = pcre2_match(code_, subject, n, offset, PCRE2_NO_UTF_CHECK, match_data.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      DUET_ERROR("tokenizer regex match failed: " << reinterpret_cast<char*>(message));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data.get());
    size_t begin = ovector[0], end = ovector[1];
    if (end > begin) {
      out->push_back({begin, end});
      offset = end;
    } else {  // an empty match yields no piece; step over one character
      offset = end + 1;
      while (offset < n && (static_cast<unsigned char>(text[offset]) & 0xC0) == 0x80) ++offset;
    }
  }
}

// ---- BPE merges -----------------------------------------------------------------------------

void BpeMerges::add(int32_t left, int32_t right, int32_t rank, int32_t result) {
  map_[key(left, right)] = Merge{rank, result};
}

void BpeMerges::apply(std::vector<int32_t>* ids) const {
  if (ids->size() <= kScanMaxSymbols) {
    apply_scan(ids);
  } else {
    apply_heap(ids);
  }
}

void BpeMerges::apply_scan(std::vector<int32_t>* ids) const {
  std::vector<int32_t>& v = *ids;
  if (v.size() < 2) return;
  // [v.size() - 1] merge of each adjacent pair, nullptr if none
  std::vector<const Merge*> pair(v.size() - 1);
  for (size_t i = 0; i + 1 < v.size(); ++i) pair[i] = find(v[i], v[i + 1]);
  for (;;) {
    size_t best = SIZE_MAX;
    int32_t best_rank = INT32_MAX;
    for (size_t i = 0; i < pair.size(); ++i) {
      if (pair[i] != nullptr && pair[i]->rank < best_rank) best_rank = pair[i]->rank, best = i;
    }
    if (best == SIZE_MAX) return;
    v[best] = pair[best]->result;
    v.erase(v.begin() + best + 1);
    pair.erase(pair.begin() + best);
    if (best > 0) pair[best - 1] = find(v[best - 1], v[best]);
    if (best < pair.size()) pair[best] = find(v[best], v[best + 1]);
  }
}

void BpeMerges::apply_heap(std::vector<int32_t>* ids) const {
  std::vector<int32_t>& v = *ids;
  const int32_t n = static_cast<int32_t>(v.size());
  if (n < 2) return;
  // Symbols form a linked list over the original positions; a merged-away symbol becomes -1.
  std::vector<int32_t> prev(n), next(n);  // next == n: no next symbol
  for (int32_t i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1;
  struct Candidate {
    int32_t rank, pos, left, right;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push = [&](int32_t i, int32_t j) {
    if (const Merge* m = find(v[i], v[j])) heap.push({m->rank, i, v[i], v[j]});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i, i + 1);
  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    // Stale if either symbol changed since the push: a symbol only changes by growing, and its
    // right neighbour only goes away by merging into it, so comparing ids is enough.
    int32_t i = c.pos, j = next[c.pos];
    if (v[i] != c.left || j >= n || v[j] != c.right) continue;
    v[i] = find(c.left, c.right)->result;
    v[j] = -1;
    next[i] = next[j];
    if (next[i] < n) prev[next[i]] = i;
    if (prev[i] >= 0) push(prev[i], i);
    if (next[i] < n) push(i, next[i]);
  }
  v.erase(std::remove(v.begin(), v.end(), -1), v.end());
}

// ---- Tokenizer ------------------------------------------------------------------------------

namespace {

using json = nlohmann::json;

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

// One pre-tokenizer step. ByteLevel is always the last one (BPE then works on its bytes).
struct PreTokStep {
  bool byte_level = false;            // false: Split
  std::unique_ptr<TokenRegex> regex;  // Split pattern; GPT-2 regex for ByteLevel use_regex
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // ByteLevel only: prepend ' ' to a piece not starting with one
};

struct AddedToken {
  int32_t id;
  std::string content;
  bool special, single_word, lstrip, rstrip;
};

enum class IdKind : uint8_t { kNone, kModel, kAdded, kSpecial };

[[noreturn]] void unsupported(const std::string& source, const char* component,
                              const std::string& type, const char* supported) {
  DUET_ERROR(source << ": unsupported " << component << " '" << type
                    << "' (supported: " << supported << ")");
}

std::string type_name(const json& j) {
  if (j.is_null()) return "null";
  if (!j.is_object() || !j.contains("type")) return j.dump();
  return j.at("type").get<std::string>();
}

bool is_ascii_space(char c) {
  return c == ' ' || (c >= '\t' && c <= '\r');
}
bool is_word_byte(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         (static_cast<unsigned char>(c) & 0x80);
}

constexpr size_t kMaxCacheEntries = 1 << 16;
constexpr size_t kMaxCachedWordBytes = 64;

}  // namespace

struct Tokenizer::Impl {
  std::string source;

  // [n_vocab] per id: the token string as written in tokenizer.json, the raw bytes it decodes
  // to, and what kind of token it is (kNone: no token has this id).
  std::vector<std::string> id_token;
  std::vector<std::string> id_bytes;
  std::vector<IdKind> id_kind;
  StringMap<int32_t> token_ids;  // token string -> id (added tokens win)

  // BPE model on raw bytes.
  std::array<int32_t, 256> byte_ids;  // single-byte token ids, -1 if absent
  BpeMerges merges;
  bool ignore_merges = false;
  StringMap<int32_t> word_ids;  // raw bytes -> model id; filled only when ignore_merges
  int32_t unk_id = -1;

  bool nfc = false;  // normalizer NFC: applied to each stretch between added tokens
  std::vector<PreTokStep> steps;

  // Added tokens; candidates per first byte of content, longest first.
  std::vector<AddedToken> added;
  std::array<std::vector<int32_t>, 256> added_by_byte;

  int32_t bos_id = -1;
  int32_t eos_id = -1;

  mutable std::mutex cache_mutex;
  mutable StringMap<std::vector<int32_t>> cache;  // GUARDED_BY(cache_mutex): word -> ids

  void parse(const json& doc);
  void parse_normalizer(const json& j);
  void parse_pre_tokenizer(const json& j);
  void parse_decoder(const json& j);
  void parse_model(const json& j);
  void parse_added_tokens(const json& j);
  void resize_ids(const json& model, const json& added_tokens);
  void set_token(int64_t id, const std::string& token, IdKind kind);

  bool match_added(std::string_view text, size_t pos, size_t seg_begin, TextSpan* span,
                   int32_t* id) const;
  void encode_segment(std::string_view seg, std::vector<int32_t>* out) const;
  void encode_valid_utf8(std::string_view seg, std::vector<int32_t>* out) const;
  void encode_word(std::string_view word, std::vector<int32_t>* out) const;
};

// ---- Loading --------------------------------------------------------------------------------

void Tokenizer::Impl::parse(const json& doc) {
  if (!doc.is_object()) DUET_ERROR(source << ": expected a JSON object at the top level");
  if (!doc.contains("model")) DUET_ERROR(source << ": missing 'model'");
  const json& model = doc.at("model");
  const json added_tokens = doc.value("added_tokens", json::array());
  resize_ids(model, added_tokens);
  parse_model(model);
  parse_added_tokens(added_tokens);
  parse_normalizer(doc.value("normalizer", json()));
  const json pre_tokenizer = doc.value("pre_tokenizer", json());
  if (pre_tokenizer.is_null()) {
    unsupported(source, "pre_tokenizer", "null", "ByteLevel, Split, Sequence");
  }
  parse_pre_tokenizer(pre_tokenizer);
  if (steps.empty() || !steps.back().byte_level) {
    DUET_ERROR(source << ": unsupported pre_tokenizer without ByteLevel (only byte-level BPE is "
                         "supported)");
  }
  parse_decoder(doc.value("decoder", json()));
  // post_processor only adds special tokens around encodings; encode() never adds any.
}

void Tokenizer::Impl::parse_normalizer(const json& j) {
  const std::string type = type_name(j);
  if (type == "null") return;
  if (type == "NFC") {
    nfc = true;
  } else if (type == "Sequence") {
    for (const json& n : j.at("normalizers")) parse_normalizer(n);
  } else {
    unsupported(source, "normalizer", type, "NFC, Sequence");
  }
}

void Tokenizer::Impl::parse_pre_tokenizer(const json& j) {
  const std::string type = type_name(j);
  if (type == "Sequence") {
    for (const json& p : j.at("pretokenizers")) parse_pre_tokenizer(p);
    return;
  }
  if (type != "Split" && type != "ByteLevel") {
    unsupported(source, "pre_tokenizer", type, "ByteLevel, Split, Sequence");
  }
  if (!steps.empty() && steps.back().byte_level) {
    DUET_ERROR(source << ": unsupported pre_tokenizer order: '" << type
                      << "' after ByteLevel (ByteLevel must be last)");
  }
  PreTokStep step;
  if (type == "ByteLevel") {
    // Defaults as in Hugging Face's ByteLevel: add_prefix_space and use_regex true.
    step.byte_level = true;
    step.add_prefix_space = j.value("add_prefix_space", true);
    if (j.value("use_regex", true)) {
      step.regex = std::make_unique<TokenRegex>(kGpt2Pattern, false, source);
    }
    steps.push_back(std::move(step));
    return;
  }
  const json& pattern = j.at("pattern");
  if (pattern.contains("Regex")) {
    step.regex =
        std::make_unique<TokenRegex>(pattern.at("Regex").get<std::string>(), false, source);
  } else if (pattern.contains("String")) {
    step.regex =
        std::make_unique<TokenRegex>(pattern.at("String").get<std::string>(), true, source);
  } else {
    DUET_ERROR(source << ": unsupported Split pattern " << pattern.dump()
                      << " (supported: Regex, String)");
  }
  const std::string behavior = j.at("behavior").get<std::string>();
  if (behavior == "Isolated") {
    step.behavior = SplitBehavior::kIsolated;
  } else if (behavior == "Removed") {
    step.behavior = SplitBehavior::kRemoved;
  } else if (behavior == "MergedWithPrevious") {
    step.behavior = SplitBehavior::kMergedWithPrevious;
  } else if (behavior == "MergedWithNext") {
    step.behavior = SplitBehavior::kMergedWithNext;
  } else if (behavior == "Contiguous") {
    step.behavior = SplitBehavior::kContiguous;
  } else {
    unsupported(source, "Split behavior", behavior,
                "Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous");
  }
  step.invert = j.value("invert", false);
  steps.push_back(std::move(step));
}

void Tokenizer::Impl::parse_decoder(const json& j) {
  const std::string type = type_name(j);
  if (type != "ByteLevel") unsupported(source, "decoder", type, "ByteLevel");
}

void Tokenizer::Impl::resize_ids(const json& model, const json& added_tokens) {
  int64_t max_id = -1;
  if (model.contains("vocab") && model.at("vocab").is_object()) {
    for (const auto& [token, id] : model.at("vocab").items()) {
      max_id = std::max(max_id, id.get<int64_t>());
    }
  }
  for (const json& t : added_tokens) max_id = std::max(max_id, t.at("id").get<int64_t>());
  if (max_id >= (int64_t(1) << 30)) {
    DUET_ERROR(source << ": token id " << max_id << " is too large");
  }
  id_token.resize(max_id + 1);
  id_bytes.resize(max_id + 1);
  id_kind.assign(max_id + 1, IdKind::kNone);
  token_ids.reserve(max_id + 1);
}

void Tokenizer::Impl::set_token(int64_t id, const std::string& token, IdKind kind) {
  if (id < 0 || id >= int64_t(id_kind.size())) {
    DUET_ERROR(source << ": bad id " << id << " for token '" << token << "'");
  }
  id_token[id] = token;
  id_kind[id] = kind;
  token_ids[token] = int32_t(id);
  std::string raw;
  if (kind != IdKind::kModel || !byte_level::decode_token(token, &raw)) {
    // Added tokens decode to their content; so does a model token outside the byte-level
    // alphabet, as in Hugging Face's ByteLevel decoder. BPE can never produce the latter.
    id_bytes[id] = token;
    return;
  }
  if (raw.size() == 1) byte_ids[static_cast<unsigned char>(raw[0])] = int32_t(id);
  if (ignore_merges) word_ids[raw] = int32_t(id);
  id_bytes[id] = std::move(raw);
}

void Tokenizer::Impl::parse_model(const json& j) {
  const std::string type = j.value("type", std::string("BPE"));  // older files omit it
  if (type != "BPE") unsupported(source, "model type", type, "BPE");
  if (j.value("byte_fallback", false)) {
    DUET_ERROR(source << ": unsupported model option byte_fallback true (only byte-level BPE)");
  }
  if (j.contains("dropout") && !j.at("dropout").is_null() && j.at("dropout").get<double>() > 0) {
    DUET_ERROR(source << ": unsupported model option dropout " << j.at("dropout").dump());
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (j.contains(key) && j.at(key).is_string() && !j.at(key).get<std::string>().empty()) {
      DUET_ERROR(source << ": unsupported model option " << key << " " << j.at(key).dump());
    }
  }
  ignore_merges = j.value("ignore_merges", false);
  if (!j.contains("vocab") || !j.at("vocab").is_object()) {
    DUET_ERROR(source << ": model.vocab must be an object (token -> id)");
  }
  byte_ids.fill(-1);
  for (const auto& [token, id] : j.at("vocab").items())
    set_token(id.get<int64_t>(), token, IdKind::kModel);
  if (j.contains("unk_token") && j.at("unk_token").is_string()) {
    auto it = token_ids.find(j.at("unk_token").get<std::string>());
    if (it != token_ids.end()) unk_id = it->second;
  }

  auto id_of = [&](const std::string& token, size_t rank) {
    auto it = token_ids.find(token);
    if (it == token_ids.end()) {
      DUET_ERROR(source << ": merge " << rank << " uses '" << token
                        << "', which is not in the vocab");
    }
    return it->second;
  };
  static const json kNoMerges = json::array();
  const json& list = j.contains("merges") ? j.at("merges") : kNoMerges;
  merges.reserve(list.size());
  for (size_t rank = 0; rank < list.size(); ++rank) {
    const json& m = list[rank];
    std::string left, right;
    if (m.is_string()) {  // "left right"
      const std::string& s = m.get_ref<const std::string&>();
      size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        DUET_ERROR(source << ": merge " << rank << " '" << s
                          << "' is not two tokens split by a space");
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2) {  // ["left", "right"]
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      DUET_ERROR(source << ": merge " << rank << " " << m.dump()
                        << " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    const int32_t left_id = id_of(left, rank);
    const int32_t right_id = id_of(right, rank);
    merges.add(left_id, right_id, int32_t(rank), id_of(left + right, rank));
  }
}

void Tokenizer::Impl::parse_added_tokens(const json& j) {
  for (const json& t : j) {
    AddedToken a{int32_t(t.at("id").get<int64_t>()), t.at("content").get<std::string>(),
                 t.value("special", false),          t.value("single_word", false),
                 t.value("lstrip", false),           t.value("rstrip", false)};
    if (a.content.empty()) DUET_ERROR(source << ": added token " << a.id << " has empty content");
    set_token(a.id, a.content, a.special ? IdKind::kSpecial : IdKind::kAdded);
    added_by_byte[static_cast<unsigned char>(a.content[0])].push_back(int32_t(added.size()));
    added.push_back(std::move(a));
  }
  for (auto& candidates : added_by_byte) {
    std::stable_sort(candidates.begin(), candidates.end(), [&](int32_t a, int32_t b) {
      return added[a].content.size() > added[b].content.size();
    });
  }
}

// ---- Encoding -------------------------------------------------------------------------------

namespace {

// Cuts piece p at its regex matches as Hugging Face's Split does for `behavior` and `invert`;
// appends the non-empty pieces to *out.
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

}  // namespace

bool Tokenizer::Impl::match_added(std::string_view text, size_t pos, size_t seg_begin,
                                  TextSpan* span, int32_t* id) const {
  for (int32_t index : added_by_byte[static_cast<unsigned char>(text[pos])]) {
    const AddedToken& t = added[index];
    if (text.compare(pos, t.content.size(), t.content) != 0) continue;
    size_t begin = pos, end = pos + t.content.size();
    if (t.single_word && ((begin > 0 && is_word_byte(text[begin - 1])) ||
                          (end < text.size() && is_word_byte(text[end])))) {
      continue;
    }
    if (t.lstrip) {
      while (begin > seg_begin && is_ascii_space(text[begin - 1])) --begin;
    }
    if (t.rstrip) {
      while (end < text.size() && is_ascii_space(text[end])) ++end;
    }
    *span = {begin, end};
    *id = t.id;
    return true;
  }
  return false;
}

void Tokenizer::Impl::encode_segment(std::string_view seg, std::vector<int32_t>* out) const {
  // The regexes need valid UTF-8. A stray byte (or a cut-off character) becomes a pre-token of
  // its own; the valid stretches around it are encoded as usual.
  while (!seg.empty()) {
    size_t n = valid_utf8_prefix(seg);
    encode_valid_utf8(seg.substr(0, n), out);
    if (n == seg.size()) return;
    encode_word(seg.substr(n, 1), out);
    seg.remove_prefix(n + 1);
  }
}

void Tokenizer::Impl::encode_valid_utf8(std::string_view seg, std::vector<int32_t>* out) const {
  if (seg.empty()) return;
  std::string normalized;
  if (nfc && !nfc::is_quick_nfc(seg)) {
    normalized = nfc::normalize(seg);
    seg = normalized;
  }
  std::vector<std::string_view> pieces{seg}, next;
  std::vector<std::unique_ptr<std::string>> owned;  // pieces that got a prefix space
  std::vector<TextSpan> matches;
  for (const PreTokStep& step : steps) {
    next.clear();
    for (std::string_view p : pieces) {
      if (step.add_prefix_space && p[0] != ' ') {
        owned.push_back(std::make_unique<std::string>(" " + std::string(p)));
        p = *owned.back();
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
  for (std::string_view p : pieces) encode_word(p, out);
}

void Tokenizer::Impl::encode_word(std::string_view word, std::vector<int32_t>* out) const {
  if (ignore_merges) {  // Llama-3: a pre-token that is itself a token is taken whole
    auto it = word_ids.find(word);
    if (it != word_ids.end()) {
      out->push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() > 1 && word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex);
    auto it = cache.find(word);
    if (it != cache.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  ids.reserve(word.size());
  for (unsigned char c : word) {
    // A byte missing from the vocab becomes unk_token, or is dropped without one (as in HF).
    int32_t id = byte_ids[c] >= 0 ? byte_ids[c] : unk_id;
    if (id >= 0) ids.push_back(id);
  }
  merges.apply(&ids);
  out->insert(out->end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (cache.size() >= kMaxCacheEntries) cache.clear();
    cache.emplace(std::string(word), std::move(ids));
  }
}

// ---- Public API -----------------------------------------------------------------------------

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) DUET_ERROR("cannot open " << path);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) DUET_ERROR("cannot read " << path);
  return text.str();
}

// The token named by a tokenizer_config.json entry: "name", {"content": "name", ...} or null.
std::string config_token_name(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content")) return v.at("content").get<std::string>();
  return "";
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  std::unique_ptr<Tokenizer> tok = from_json(read_file(path), path);
  const std::string config_path = dir + "/tokenizer_config.json";
  if (!std::ifstream(config_path)) return tok;
  try {
    const json config = json::parse(read_file(config_path));
    for (auto [key, slot] : {std::pair{"bos_token", &tok->impl_->bos_id},
                             std::pair{"eos_token", &tok->impl_->eos_id}}) {
      const std::string name = config_token_name(config.value(key, json()));
      if (name.empty()) continue;
      *slot = tok->token_to_id(name);
      if (*slot < 0) DUET_ERROR(config_path << ": " << key << " '" << name << "' is not a token");
    }
  } catch (const json::exception& e) {
    DUET_ERROR(config_path << ": malformed JSON: " << e.what());
  }
  return tok;
}

std::unique_ptr<Tokenizer> Tokenizer::from_json(const std::string& tokenizer_json_text,
                                                const std::string& source_name) {
  json doc;
  try {
    doc = json::parse(tokenizer_json_text);
  } catch (const json::exception& e) {
    DUET_ERROR(source_name << ": malformed JSON: " << e.what());
  }
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  tok->impl_->source = source_name;
  try {
    tok->impl_->parse(doc);
  } catch (const json::exception& e) {
    DUET_ERROR(source_name << ": bad tokenizer.json: " << e.what());
  }
  return tok;
}

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  const Impl& m = *impl_;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  const std::string_view t(text);
  size_t seg_begin = 0;  // start of the text not yet encoded
  for (size_t pos = 0; pos < t.size(); ++pos) {
    if (m.added_by_byte[static_cast<unsigned char>(t[pos])].empty()) continue;
    TextSpan span;
    int32_t id;
    if (!m.match_added(t, pos, seg_begin, &span, &id)) continue;
    m.encode_segment(t.substr(seg_begin, span.begin - seg_begin), &ids);
    ids.push_back(id);
    seg_begin = span.end;
    pos = span.end - 1;
  }
  m.encode_segment(t.substr(seg_begin), &ids);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  const Impl& m = *impl_;
  std::string text;
  for (int32_t id : ids) {
    if (id < 0 || size_t(id) >= m.id_kind.size() || m.id_kind[id] == IdKind::kNone) {
      DUET_ERROR(m.source << ": cannot decode unknown token id " << id << " (vocab size "
                          << m.id_kind.size() << ")");
    }
    if (skip_special && m.id_kind[id] == IdKind::kSpecial) continue;
    text += m.id_bytes[id];
  }
  return text;
}

int32_t Tokenizer::vocab_size() const {
  return int32_t(impl_->id_kind.size());
}

int32_t Tokenizer::token_to_id(const std::string& token) const {
  auto it = impl_->token_ids.find(token);
  return it == impl_->token_ids.end() ? -1 : it->second;
}

const std::string& Tokenizer::id_to_token(int32_t id) const {
  const Impl& m = *impl_;
  if (id < 0 || size_t(id) >= m.id_kind.size() || m.id_kind[id] == IdKind::kNone) {
    DUET_ERROR(m.source << ": unknown token id " << id << " (vocab size " << m.id_kind.size()
                        << ")");
  }
  return m.id_token[id];
}

int32_t Tokenizer::bos_id() const {
  return impl_->bos_id;
}
int32_t Tokenizer::eos_id() const {
  return impl_->eos_id;
}

}  // namespace duet
