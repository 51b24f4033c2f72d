// Tokenizer: loading tokenizer.json into its parts, and encode() running them in Hugging Face's
// order: added tokens found in the raw text; each stretch between them normalized; normalized
// added tokens found in that; each remaining piece pre-tokenized into words; each word BPE'd.
// decode() and IncrementalDecoder run the same TokenDecoder stream.
#include "text/tokenizer.h"

#include <algorithm>
#include <deque>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "core/error.h"
#include "text/tokenizer_added.h"
#include "text/tokenizer_decoder.h"
#include "text/tokenizer_json.h"
#include "text/tokenizer_model.h"
#include "text/tokenizer_normalizer.h"
#include "text/tokenizer_pretokenizer.h"
#include "text/tokenizer_regex.h"
#include "text/tokenizer_vocab.h"

namespace duet {

namespace {

using json = nlohmann::json;

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

struct Tokenizer::Impl {
  std::string source;
  Vocab vocab;
  TextNormalizer normalizer;
  PreTokenizer pre_tokenizer;
  BpeModel model;
  AddedTokenMatcher raw_added;         // matched in the raw text
  AddedTokenMatcher normalized_added;  // matched in normalized text ("normalized": true)
  TokenDecoder decoder;
  int32_t bos_id = -1;
  bool add_bos_token = false;  // tokenizer_config.json: prepend BOS to prompts (Llama, DeepSeek)
  int32_t eos_id = -1;

  void parse(const json& doc);
  void size_vocab(const json& model, const json& added_tokens);
  void parse_added_tokens(const json& added_tokens);

  void encode_stretch(std::string_view text, bool at_input_start, std::vector<int32_t>* out) const;
  void encode_piece(std::string_view text, bool at_input_start, std::vector<int32_t>* out) const;
  void encode_words(std::string_view text, bool at_input_start, std::vector<int32_t>* out) const;
};

// ---- Loading --------------------------------------------------------------------------------

void Tokenizer::Impl::parse(const json& doc) {
  if (!doc.is_object()) DUET_ERROR(source << ": expected a JSON object at the top level");
  if (!doc.contains("model")) DUET_ERROR(source << ": missing 'model'");
  const json added_tokens = doc.value("added_tokens", json::array());
  normalizer.parse(doc.value("normalizer", json()), source);
  pre_tokenizer.parse(doc.value("pre_tokenizer", json()), source);
  size_vocab(doc.at("model"), added_tokens);
  model.parse(doc.at("model"), pre_tokenizer.byte_level(), &vocab, source);
  parse_added_tokens(added_tokens);
  const json decoder_doc = doc.value("decoder", json());
  decoder.parse(decoder_doc, source);
  if (pre_tokenizer.byte_level() !=
      (decoder_doc.is_object() && decoder_doc.value("type", "") == std::string("ByteLevel"))) {
    DUET_ERROR(source << ": unsupported combination: ByteLevel "
                      << (pre_tokenizer.byte_level() ? "pre_tokenizer without ByteLevel decoder"
                                                     : "decoder without ByteLevel pre_tokenizer"));
  }
  decoder.prepare(vocab);
  // post_processor only adds special tokens around encodings; encode() never adds any.
}

void Tokenizer::Impl::size_vocab(const json& model, const json& added_tokens) {
  int64_t max_id = -1;
  if (model.contains("vocab") && model.at("vocab").is_object()) {
    for (const auto& [token, id] : model.at("vocab").items()) {
      max_id = std::max<int64_t>(max_id, token_id_of(id, source + ": vocab '" + token + "'"));
    }
  }
  for (const json& t : added_tokens)
    max_id = std::max<int64_t>(max_id, token_id_of(t.at("id"), source + ": added token"));
  if (max_id >= (int64_t(1) << 30))
    DUET_ERROR(source << ": token id " << max_id << " is too large");
  vocab.id_token.resize(max_id + 1);
  vocab.id_kind.assign(max_id + 1, IdKind::kNone);
  vocab.token_ids.reserve(max_id + 1);
}

void Tokenizer::Impl::parse_added_tokens(const json& added_tokens) {
  for (const json& t : added_tokens) {
    const bool special = t.value("special", false);
    AddedToken a{token_id_of(t.at("id"), source + ": added token"),
                 t.at("content").get<std::string>(),
                 special,
                 t.value("single_word", false),
                 t.value("lstrip", false),
                 t.value("rstrip", false),
                 t.value("normalized", !special)};
    if (a.content.empty()) DUET_ERROR(source << ": added token " << a.id << " has empty content");
    if (a.id < 0 || a.id >= vocab.size()) DUET_ERROR(source << ": bad added token id " << a.id);
    vocab.id_token[a.id] = a.content;
    vocab.id_kind[a.id] = special ? IdKind::kSpecial : IdKind::kAdded;
    vocab.token_ids[a.content] = a.id;
    if (a.normalized && !normalizer.empty()) {
      // As Hugging Face: a normalized token is searched for in normalized text, by its
      // normalized content.
      std::string content;
      if (!normalizer.apply(a.content, &content)) content = a.content;
      normalized_added.add(a, std::move(content));
    } else {
      raw_added.add(a, a.content);
    }
  }
}

// ---- Encoding -------------------------------------------------------------------------------

void Tokenizer::Impl::encode_stretch(std::string_view text, bool at_input_start,
                                     std::vector<int32_t>* out) const {
  if (text.empty()) return;
  if (model.byte_level()) {
    // The regexes need valid UTF-8. A stray byte (or a cut-off character) becomes a word of its
    // own; the valid stretches around it are encoded as usual.
    while (!text.empty()) {
      const size_t n = valid_utf8_prefix(text);
      encode_piece(text.substr(0, n), at_input_start, out);
      if (n == text.size()) return;
      model.encode_word(text.substr(n, 1), out);
      text.remove_prefix(n + 1);
      at_input_start = false;
    }
    return;
  }
  if (valid_utf8_prefix(text) == text.size()) {
    encode_piece(text, at_input_start, out);
  } else {  // characters mode works on text: invalid bytes are read as U+FFFD
    const std::string valid = utf8_lossy(std::string(text));
    encode_piece(valid, at_input_start, out);
  }
}

void Tokenizer::Impl::encode_piece(std::string_view text, bool at_input_start,
                                   std::vector<int32_t>* out) const {
  if (text.empty()) return;
  std::string normalized;
  if (normalizer.apply(text, &normalized)) text = normalized;
  if (normalized_added.empty()) {
    encode_words(text, at_input_start, out);
    return;
  }
  std::vector<AddedTokenMatcher::Piece> pieces;
  normalized_added.split(text, &pieces);
  for (const AddedTokenMatcher::Piece& p : pieces) {
    if (p.id >= 0) {
      out->push_back(p.id);
    } else {
      encode_words(text.substr(p.begin, p.end - p.begin), at_input_start && p.begin == 0, out);
    }
  }
}

void Tokenizer::Impl::encode_words(std::string_view text, bool at_input_start,
                                   std::vector<int32_t>* out) const {
  std::deque<std::string> arena;
  std::vector<std::string_view> words;
  pre_tokenizer.split(text, at_input_start, &arena, &words);
  for (std::string_view w : words) model.encode_word(w, out);
}

// ---- Public API -----------------------------------------------------------------------------

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;

namespace {

// Kimi's tiktoken tokenizer (no tokenizer.json; its class in Python code): the tokenizer.json
// text equal to it, from the ranks at ranks_path and `config`, the directory's
// tokenizer_config.json (null without one), which must name the class.
std::string kimi_tokenizer_json(const json& config, const std::string& config_path,
                                const std::string& ranks_path) {
  constexpr int32_t kReservedSpecials = 256;  // tokenization_kimi.py's num_reserved_special_tokens
  if (config.is_null()) {
    DUET_ERROR(ranks_path << ": there is no tokenizer.json, and no tokenizer_config.json to say "
                             "which tiktoken tokenizer this is (duet reads Kimi's)");
  }
  std::string cls;
  const json* am =
      config.is_object() && config.contains("auto_map") ? &config.at("auto_map") : nullptr;
  if (am && am->is_object() && am->contains("AutoTokenizer")) {
    const json& at = am->at("AutoTokenizer");
    const json& first = at.is_array() && !at.empty() ? at[0] : at;
    if (first.is_string()) cls = first.get<std::string>();
  }
  if (cls != "tokenization_kimi.TikTokenTokenizer") {
    DUET_ERROR(config_path << ": auto_map.AutoTokenizer is '" << cls
                           << "'; of the tiktoken tokenizers duet reads Kimi's "
                              "(tokenization_kimi.TikTokenTokenizer), whose regex it knows");
  }
  std::map<int64_t, std::string> named;
  if (config.contains("added_tokens_decoder")) {
    for (const auto& [key, v] : config.at("added_tokens_decoder").items()) {
      const std::string name = config_token_name(v);
      size_t used = 0;
      int64_t id = -1;
      try {
        id = std::stoll(key, &used);
      } catch (const std::exception&) {
      }
      if (used != key.size() || id < 0 || name.empty()) {
        DUET_ERROR(config_path << ": added_tokens_decoder entry '" << key
                               << "' is not an id with a content");
      }
      named[id] = name;
    }
  }
  return tiktoken_tokenizer_json(read_file(ranks_path), ranks_path, named, kReservedSpecials,
                                 kKimiPattern);
}

}  // namespace

bool Tokenizer::exists(const std::string& dir) {
  return std::ifstream(dir + "/tokenizer.json") || std::ifstream(dir + "/tiktoken.model");
}

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  const std::string ranks_path = dir + "/tiktoken.model";
  const std::string config_path = dir + "/tokenizer_config.json";
  json config;  // tokenizer_config.json, read once; null without one
  try {
    if (std::ifstream(config_path)) config = json::parse(read_file(config_path));
    std::unique_ptr<Tokenizer> tok =
        !std::ifstream(path) && std::ifstream(ranks_path)
            ? from_json(kimi_tokenizer_json(config, config_path, ranks_path), ranks_path)
            : from_json(read_file(path), path);
    if (config.is_object() && config.contains("add_bos_token") &&
        config.at("add_bos_token").is_boolean())
      tok->impl_->add_bos_token = config.at("add_bos_token").get<bool>();
    if (!config.is_null()) {
      for (auto [key, slot] : {std::pair{"bos_token", &tok->impl_->bos_id},
                               std::pair{"eos_token", &tok->impl_->eos_id}}) {
        const std::string name = config_token_name(config.value(key, json()));
        if (name.empty()) continue;
        *slot = tok->token_to_id(name);
        if (*slot < 0) DUET_ERROR(config_path << ": " << key << " '" << name << "' is not a token");
      }
    }
    return tok;
  } catch (const json::exception& e) {
    DUET_ERROR(config_path << ": malformed JSON: " << e.what());
  }
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
  if (m.raw_added.empty()) {
    m.encode_stretch(t, true, &ids);
    return ids;
  }
  std::vector<AddedTokenMatcher::Piece> pieces;
  m.raw_added.split(t, &pieces);
  for (const AddedTokenMatcher::Piece& p : pieces) {
    if (p.id >= 0) {
      ids.push_back(p.id);
    } else {
      m.encode_stretch(t.substr(p.begin, p.end - p.begin), p.begin == 0, &ids);
    }
  }
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  const TokenDecoder& d = impl_->decoder;
  DecodeState state = d.begin();
  std::string text;
  for (int32_t id : ids) d.push(&state, id, skip_special, &text);
  d.finish(&state, &text);
  return text;
}

int32_t Tokenizer::vocab_size() const {
  return impl_->vocab.size();
}

int32_t Tokenizer::token_to_id(const std::string& token) const {
  return impl_->vocab.find(token);
}

const std::string& Tokenizer::id_to_token(int32_t id) const {
  const Vocab& v = impl_->vocab;
  if (!v.valid(id)) {
    DUET_ERROR(impl_->source << ": unknown token id " << id << " (vocab size " << v.size() << ")");
  }
  return v.id_token[id];
}

bool Tokenizer::add_bos_token() const { return impl_->add_bos_token; }

int32_t Tokenizer::bos_id() const {
  return impl_->bos_id;
}
int32_t Tokenizer::eos_id() const {
  return impl_->eos_id;
}

// ---- IncrementalDecoder ---------------------------------------------------------------------

struct IncrementalDecoder::State {
  DecodeState decode;
};

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(&tokenizer),
      skip_special_(skip_special),
      state_(std::make_unique<State>(State{tokenizer.impl_->decoder.begin()})) {}
IncrementalDecoder::~IncrementalDecoder() = default;
IncrementalDecoder::IncrementalDecoder(IncrementalDecoder&&) noexcept = default;
IncrementalDecoder& IncrementalDecoder::operator=(IncrementalDecoder&&) noexcept = default;

std::string IncrementalDecoder::step(int32_t id) {
  std::string text;
  tokenizer_->impl_->decoder.push(&state_->decode, id, skip_special_, &text);
  return text;
}

std::string IncrementalDecoder::finish() {
  std::string text;
  tokenizer_->impl_->decoder.finish(&state_->decode, &text);
  return text;
}

}  // namespace duet
