// SentencePiece-style BPE (Llama-2 / Mistral / Mixtral): Prepend + Replace normalizers or a
// Metaspace pre-tokenizer, byte_fallback, unk_token, and the Replace / ByteFallback / Fuse /
// Strip or Metaspace decoders, on a hand-written tokenizer.json with hand-computed ids.
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "error_of.h"
#include "text/tokenizer.h"

namespace duet {
namespace {

using json = nlohmann::json;
using Ids = std::vector<int32_t>;

const std::string kMeta = "\u2581";  // ▁

// ids: 0 <unk>, 1 <s>, 2 </s>, 3 + b: <0xBB>, then the pieces below from 259 on.
constexpr int32_t kByte0 = 3;
constexpr int32_t kMetaId = 259, kH = 260, kE = 261, kL = 262, kO = 263, kLl = 269, kHello = 272,
                  kWorld = 277;
int32_t byte_id(int b) {
  return kByte0 + b;
}

json llama_doc(bool with_byte_tokens = true) {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  if (with_byte_tokens) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      vocab[name] = byte_id(b);
    }
  }
  const std::vector<std::string> pieces = {kMeta,
                                           "H",
                                           "e",
                                           "l",
                                           "o",
                                           "w",
                                           "r",
                                           "d",
                                           "é",
                                           kMeta + "H",
                                           "ll",
                                           kMeta + "He",
                                           kMeta + "Hell",
                                           kMeta + "Hello",
                                           kMeta + "w",
                                           "or",
                                           kMeta + "wor",
                                           "ld",
                                           kMeta + "world"};
  for (size_t k = 0; k < pieces.size(); ++k) vocab[pieces[k]] = int32_t(259 + k);
  json merges = json::array({kMeta + " H", "l l", kMeta + "H e", kMeta + "He ll", kMeta + "Hell o",
                             kMeta + " w", "o r", kMeta + "w or", "l d", kMeta + "wor ld"});
  json added = json::array();
  for (int id = 0; id < 3; ++id) {
    added.push_back({{"id", id},
                     {"content", id == 0   ? "<unk>"
                                 : id == 1 ? "<s>"
                                           : "</s>"},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer",
           {{"type", "Sequence"},
            {"normalizers",
             {{{"type", "Prepend"}, {"prepend", kMeta}},
              {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMeta}}}}}},
          {"pre_tokenizer", nullptr},
          {"post_processor", nullptr},
          {"decoder",
           {{"type", "Sequence"},
            {"decoders",
             {{{"type", "Replace"}, {"pattern", {{"String", kMeta}}}, {"content", " "}},
              {{"type", "ByteFallback"}},
              {{"type", "Fuse"}},
              {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", "<unk>"},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", true},
            {"byte_fallback", with_byte_tokens},
            {"vocab", vocab},
            {"merges", merges}}}};
}

std::unique_ptr<Tokenizer> make(const json& doc) {
  return Tokenizer::from_json(doc.dump(), "llama.json");
}

// Streams `ids` through an IncrementalDecoder; checks every piece is whole UTF-8 and that the
// pieces concatenate to decode(ids). Returns the pieces (the finish() piece last).
std::vector<std::string> stream(const Tokenizer& tok, const Ids& ids, bool skip_special = false) {
  IncrementalDecoder d(tok, skip_special);
  std::vector<std::string> pieces;
  std::string all;
  for (int32_t id : ids) pieces.push_back(d.step(id));
  pieces.push_back(d.finish());
  for (const std::string& p : pieces) {
    EXPECT_EQ(utf8_lossy(p), p) << "a piece ends inside a character";
    all += p;
  }
  EXPECT_EQ(all, tok.decode(ids, skip_special));
  return pieces;
}

TEST(SpmTokenizerTest, EncodesWithPrependAndMerges) {
  auto tok = make(llama_doc());
  EXPECT_EQ(tok->encode("Hello world"), (Ids{kHello, kWorld}));
  EXPECT_EQ(tok->encode(""), Ids{});
  EXPECT_EQ(tok->encode("Hell"), (Ids{kHello - 1}));
  // Each stretch between added tokens gets the prefix (Hugging Face's legacy Llama behavior).
  EXPECT_EQ(tok->encode("<s>Hello</s>"), (Ids{1, kHello, 2}));
  EXPECT_EQ(tok->encode("lol"), (Ids{kMetaId, kL, kO, kL}));
  EXPECT_EQ(tok->encode("Hello  world"), (Ids{kHello, kMetaId, kWorld}));
}

TEST(SpmTokenizerTest, ByteFallbackAndUnk) {
  auto tok = make(llama_doc());
  // 中 is not in the vocab: its UTF-8 bytes E4 B8 AD.
  EXPECT_EQ(tok->encode("Hello 中"),
            (Ids{kHello, kMetaId, byte_id(0xE4), byte_id(0xB8), byte_id(0xAD)}));
  EXPECT_EQ(tok->encode("é"), (Ids{kMetaId, 267}));  // in the vocab as a character
  // Without byte tokens: unk, consecutive ones fused.
  json doc = llama_doc(false);
  EXPECT_EQ(make(doc)->encode("Hello 中中"), (Ids{kHello, kMetaId, 0}));
  doc["model"]["fuse_unk"] = false;
  EXPECT_EQ(make(doc)->encode("Hello 中中"), (Ids{kHello, kMetaId, 0, 0}));
}

TEST(SpmTokenizerTest, DecodesLikeHuggingFace) {
  auto tok = make(llama_doc());
  EXPECT_EQ(tok->decode({kHello, kWorld}), "Hello world");        // Strip drops one leading space
  EXPECT_EQ(tok->decode({kMetaId, kMetaId, kHello}), "  Hello");  // one of three spaces dropped
  EXPECT_EQ(tok->decode({1, kHello, 2}), "<s> Hello</s>");
  EXPECT_EQ(tok->decode({1, kHello, 2}, /*skip_special=*/true), "Hello");
  EXPECT_EQ(tok->decode({byte_id(0xE4), byte_id(0xB8), byte_id(0xAD)}), "中");
  // A run of byte tokens that is not valid UTF-8 becomes one U+FFFD per byte, as in
  // Hugging Face's ByteFallback (a lenient decoder would give "中" + one U+FFFD).
  EXPECT_EQ(tok->decode({byte_id(0xE4), byte_id(0xB8), byte_id(0xAD), byte_id(0xE4)}),
            "\ufffd\ufffd\ufffd\ufffd");
  EXPECT_EQ(tok->decode({byte_id(0xE4), kHello}), "\ufffd Hello");
  for (const char* text : {"Hello world", "Hello 中 world", " é lol "}) {
    EXPECT_EQ(tok->decode(tok->encode(text)), text) << text;
  }
  // The prefix added after <s> comes back as a space, as with Hugging Face's legacy Llama.
  EXPECT_EQ(tok->decode(tok->encode("<s>Hello</s>")), "<s> Hello</s>");
}

TEST(SpmTokenizerTest, IncrementalHoldsByteRunsAndStripsOnce) {
  auto tok = make(llama_doc());
  const Ids ids = {kHello, kMetaId, byte_id(0xE4), byte_id(0xB8), byte_id(0xAD), kWorld};
  EXPECT_EQ(stream(*tok, ids),
            (std::vector<std::string>{"Hello", " ", "", "", "", "中 world", ""}));
  // The leading-space strip applies to the first text of the whole output only.
  EXPECT_EQ(stream(*tok, {kMetaId, kWorld}), (std::vector<std::string>{"", " world", ""}));
  EXPECT_EQ(stream(*tok, {1, kWorld}, /*skip_special=*/true),
            (std::vector<std::string>{"", "world", ""}));
  // A run cut at the end is flushed by finish(), as decode() replaces it.
  EXPECT_EQ(stream(*tok, {kHello, byte_id(0xE4), byte_id(0xB8)}),
            (std::vector<std::string>{"Hello", "", "", "\ufffd\ufffd"}));
  // Every prefix of a longer sequence streams to its own whole decode.
  const Ids long_ids = tok->encode("Hello 中 world é <s> lol 中中");
  for (size_t n = 0; n <= long_ids.size(); ++n) {
    stream(*tok, Ids(long_ids.begin(), long_ids.begin() + n));
    stream(*tok, Ids(long_ids.begin(), long_ids.begin() + n), /*skip_special=*/true);
  }
}

TEST(SpmTokenizerTest, CuttingBeforeMetaspaceGivesTheSameIds) {
  // With no merge across "x|▁", BPE runs on pieces cut before each ▁ (fast path). A merge that
  // could cross ("é" + "▁") turns the fast path off; on text without é both must agree.
  json doc = llama_doc();
  auto fast = make(doc);
  doc["model"]["vocab"]["é" + kMeta] = 278;
  doc["model"]["merges"].push_back("é " + kMeta);
  auto whole = make(doc);
  std::string text;
  for (int k = 0; k < 300; ++k)
    text += k % 7 == 0 ? "  Hello\n" : k % 3 == 0 ? "world 中 " : "lol Hell ";
  EXPECT_EQ(fast->encode(text), whole->encode(text));
  EXPECT_EQ(whole->encode("é  Hello"), (Ids{kMetaId, 278, kHello}));  // the crossing merge
}

TEST(SpmTokenizerTest, MetaspacePreTokenizerAndDecoder) {
  json doc = llama_doc();
  doc["normalizer"] = nullptr;
  doc["pre_tokenizer"] = {
      {"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "first"}, {"split", true}};
  doc["decoder"] = {{"type", "Sequence"},
                    {"decoders",
                     {{{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "first"}},
                      {{"type", "ByteFallback"}},
                      {{"type", "Fuse"}}}}};
  auto tok = make(doc);
  EXPECT_EQ(tok->encode("Hello world"), (Ids{kHello, kWorld}));
  // "first": only the text at the very start of the input gets the prefix.
  EXPECT_EQ(tok->encode("<s>Hello"), (Ids{1, kH, kE, kLl, kO}));
  EXPECT_EQ(tok->decode({kHello, kWorld}), "Hello world");
  EXPECT_EQ(tok->decode({kWorld, kHello}), "world Hello");
  stream(*tok, {kHello, kWorld, byte_id(0xE4), byte_id(0xB8), byte_id(0xAD), kHello});

  doc["pre_tokenizer"]["prepend_scheme"] = "always";
  EXPECT_EQ(make(doc)->encode("<s>Hello"), (Ids{1, kHello}));
}

using test::error_of;

TEST(SpmTokenizerTest, RefusesUnsupportedComponentsByName) {
  json doc = llama_doc();
  doc["decoder"]["decoders"].erase(2);  // Strip without Fuse before it strips every token
  EXPECT_EQ(error_of([&] { make(doc); }),
            "llama.json: unsupported decoder order: 'Strip' before Fuse (per-token strip)");
  doc = llama_doc();
  doc["decoder"]["decoders"][3]["stop"] = 1;
  EXPECT_EQ(error_of([&] { make(doc); }),
            "llama.json: unsupported decoder Strip with stop 1 (supported: 0)");
  doc = llama_doc();
  doc["normalizer"]["normalizers"].push_back({{"type", "Lowercase"}});
  EXPECT_EQ(error_of([&] { make(doc); }),
            "llama.json: unsupported normalizer 'Lowercase' (supported: NFC, Prepend, Replace, "
            "Strip, Sequence)");
  doc = llama_doc();
  doc["decoder"] = nullptr;
  EXPECT_NE(error_of([&] { make(doc); }).find("unsupported decoder 'null'"), std::string::npos);
  doc = llama_doc();
  doc["model"]["type"] = "Unigram";
  EXPECT_EQ(error_of([&] { make(doc); }),
            "llama.json: unsupported model type 'Unigram' (supported: BPE)");
}

}  // namespace
}  // namespace duet
