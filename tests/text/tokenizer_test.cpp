#include "text/tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "core/error.h"
#include "error_of.h"
#include "text/tokenizer_bpe.h"
#include "text/tokenizer_nfc.h"

namespace duet {
namespace {

using json = nlohmann::json;
using Ids = std::vector<int32_t>;

const std::vector<std::string> kSpecials = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

// Texts every tokenizer must round-trip exactly.
const std::vector<std::string> kRoundTripTexts = {
    "",
    "a",
    "The quick brown fox jumps over the lazy dog. It's 3:45 p.m.; they'll arrive at 5!",
    "int main() {\n  std::vector<int> v = {1, 2, 3};\n  return v[0] + 42;  // done\n}\n",
    "def f(x):\n\treturn x ** 2\n\n\n",
    "    four leading spaces, trailing ones    ",
    "\n\n\r\n  \n\t\t  mixed\u00a0whitespace  \n",
    "中文测试，你好世界。日本語のテキストです。カタカナ 한국어",
    "emoji 🎉🚀👍🏽 and accents: café naïve Straße Ωμέγα",
    "DON'T Won'T I'M we'LL they'RE 's 'd",
    "1234567890 3.14159 1,000,000 0x1F",
    "\xff\xfe invalid \xc3 utf-8 \xe2\x82",  // stray bytes: encoded byte by byte
};

// decode(encode(t)): the text itself, with invalid UTF-8 replaced as Hugging Face's decode does.
std::string round_trip(const Tokenizer& tok, const std::string& text) {
  return tok.decode(tok.encode(text));
}

// ---- Built tokenizer (vocab 512, as the tiny test models use) ----------------------------

class BuiltTokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tok_ = Tokenizer::from_json(build_bpe_tokenizer_json(512, kSpecials), "built.json").release();
  }
  static void TearDownTestSuite() { delete tok_; }
  static Tokenizer* tok_;
};
Tokenizer* BuiltTokenizerTest::tok_ = nullptr;

TEST_F(BuiltTokenizerTest, VocabSizeAndLayout) {
  EXPECT_EQ(tok_->vocab_size(), 512);
  EXPECT_EQ(tok_->id_to_token(0), "\u0100");     // byte 0 -> U+0100
  EXPECT_EQ(tok_->id_to_token(' '), "\u0120");   // 'Ġ'
  EXPECT_EQ(tok_->id_to_token('\n'), "\u010a");  // 'Ċ'
  EXPECT_EQ(tok_->id_to_token('a'), "a");
  EXPECT_EQ(tok_->token_to_id("<|endoftext|>"), 509);
  EXPECT_EQ(tok_->token_to_id("<|im_start|>"), 510);
  EXPECT_EQ(tok_->token_to_id("<|im_end|>"), 511);
  EXPECT_EQ(tok_->token_to_id("no such token"), -1);
  EXPECT_EQ(tok_->bos_id(), -1);
}

TEST_F(BuiltTokenizerTest, RoundTrips) {
  for (const std::string& text : kRoundTripTexts) {
    EXPECT_EQ(round_trip(*tok_, text), utf8_lossy(text)) << text;
  }
  EXPECT_TRUE(tok_->encode("").empty());
}

TEST_F(BuiltTokenizerTest, LearnedMergesCompressEnglish) {
  EXPECT_EQ(tok_->encode(" the").size(), 1u);
  const std::string prose = "The children played by the water, and the shopkeepers opened late.";
  EXPECT_LT(tok_->encode(prose).size(), prose.size() / 2);
  // Non-Latin text falls back to single bytes.
  EXPECT_EQ(tok_->encode("\xe4\xb8\xad").size(), 3u);  // 中
}

TEST_F(BuiltTokenizerTest, SpecialTokensInText) {
  const std::string text = "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>";
  Ids ids = tok_->encode(text);
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids.front(), 510);
  EXPECT_EQ(ids.back(), 509);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 511), 1);
  EXPECT_EQ(tok_->decode(ids), text);
  EXPECT_EQ(tok_->decode(ids, /*skip_special=*/true), "user\nhi\n");
  // A partial special string is ordinary text.
  Ids partial = tok_->encode("<|im_start");
  EXPECT_EQ(std::count(partial.begin(), partial.end(), 510), 0);
  EXPECT_EQ(tok_->decode(partial), "<|im_start");
}

TEST_F(BuiltTokenizerTest, UnknownIdThrows) {
  EXPECT_THROW(tok_->decode({0, 512}), Error);
  EXPECT_THROW(tok_->decode({-1}), Error);
  EXPECT_THROW(tok_->id_to_token(600), Error);
}

TEST_F(BuiltTokenizerTest, EncodeIsThreadSafe) {
  std::vector<Ids> expected;
  for (const std::string& text : kRoundTripTexts) expected.push_back(tok_->encode(text));
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int round = 0; round < 50; ++round) {
        for (size_t i = 0; i < kRoundTripTexts.size(); ++i) {
          if (tok_->encode(kRoundTripTexts[i] + std::to_string(round)) !=
              tok_->encode(kRoundTripTexts[i] + std::to_string(round))) {
            ++mismatches;
          }
          if (tok_->encode(kRoundTripTexts[i]) != expected[i]) ++mismatches;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(TokenizerBuilderTest, IsDeterministic) {
  EXPECT_EQ(build_bpe_tokenizer_json(700, kSpecials), build_bpe_tokenizer_json(700, kSpecials));
}

TEST(TokenizerBuilderTest, RejectsTooSmallVocab) {
  EXPECT_NO_THROW(build_bpe_tokenizer_json(259, kSpecials));
  try {
    build_bpe_tokenizer_json(258, kSpecials);
    FAIL() << "expected duet::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocab_size 258"), std::string::npos) << e.what();
  }
  EXPECT_THROW(build_bpe_tokenizer_json(512, {"<a>", "<a>"}), Error);
}

TEST(TokenizerBuilderTest, BenchmarkVocabIsFastAndValid) {
  auto start = std::chrono::steady_clock::now();
  const std::string text = build_bpe_tokenizer_json(32000, kSpecials);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 2.0);

  json doc = json::parse(text);
  EXPECT_EQ(doc["model"]["vocab"].size() + doc["added_tokens"].size(), 32000u);
  EXPECT_EQ(doc["model"]["merges"].size(), 32000u - 256 - 3);  // every merge made a new token
  auto tok = Tokenizer::from_json(text, "built32k.json");
  ASSERT_EQ(tok->vocab_size(), 32000);
  std::set<std::string> tokens;
  for (int32_t id = 0; id < tok->vocab_size(); ++id) tokens.insert(tok->id_to_token(id));
  EXPECT_EQ(tokens.size(), 32000u);
  for (const std::string& t : kRoundTripTexts) EXPECT_EQ(round_trip(*tok, t), utf8_lossy(t)) << t;
  EXPECT_EQ(tok->encode("<|im_end|>"), Ids{31999});
}

// ---- Hand-written tokenizer.json with known merges ---------------------------------------

// vocab ids: h e l o Ġ w r d | he ll hell hello Ġw or Ġwor ld Ġworld | a m s ... added <mask>
json tiny_doc(bool pair_merges) {
  json vocab = {{"h", 0},
                {"e", 1},
                {"l", 2},
                {"o", 3},
                {"\u0120", 4},
                {"w", 5},
                {"r", 6},
                {"d", 7},
                {"he", 8},
                {"ll", 9},
                {"hell", 10},
                {"hello", 11},
                {"\u0120w", 12},
                {"or", 13},
                {"\u0120wor", 14},
                {"ld", 15},
                {"\u0120world", 16},
                {"a", 17}};
  std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"},        {"he", "ll"}, {"hell", "o"},      {"\u0120", "w"},
      {"o", "r"}, {"\u0120w", "or"}, {"l", "d"},   {"\u0120wor", "ld"}};
  json merge_list = json::array();
  for (const auto& [a, b] : merges) {
    if (pair_merges) {
      merge_list.push_back({a, b});
    } else {
      merge_list.push_back(a + " " + b);
    }
  }
  return {{"version", "1.0"},
          {"added_tokens",
           {{{"id", 18},
             {"content", "<mask>"},
             {"special", true},
             {"lstrip", true},
             {"rstrip", false},
             {"single_word", false},
             {"normalized", false}},
            {{"id", 19}, {"content", "<mask>!"}, {"special", false}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             {{{"type", "Split"},
               {"pattern",
                {{"Regex",
                  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
                  "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
                  "\\s+(?!\\S)|\\s+"}}},
               {"behavior", "Isolated"},
               {"invert", false}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"byte_fallback", false},
            {"vocab", vocab},
            {"merges", merge_list}}}};
}

std::unique_ptr<Tokenizer> tiny(const json& doc) {
  return Tokenizer::from_json(doc.dump(), "tiny.json");
}

TEST(TinyTokenizerTest, HandComputedIds) {
  for (bool pair_merges : {false, true}) {
    auto tok = tiny(tiny_doc(pair_merges));
    EXPECT_EQ(tok->vocab_size(), 20);
    EXPECT_EQ(tok->encode("hello world"), (Ids{11, 16}));
    EXPECT_EQ(tok->encode("hellohello"), (Ids{11, 11}));
    EXPECT_EQ(tok->encode("hold"), (Ids{0, 3, 15}));     // only "l d" applies
    EXPECT_EQ(tok->encode("lll"), (Ids{9, 2}));          // leftmost "l l" first
    EXPECT_EQ(tok->encode("world"), (Ids{5, 13, 15}));   // no "w or" merge without Ġ
    EXPECT_EQ(tok->encode("  hello"), (Ids{4, 4, 11}));  // " " then " hello": no "Ġ hello"
    EXPECT_EQ(tok->decode({11, 16}), "hello world");
  }
}

TEST(TinyTokenizerTest, AddedTokens) {
  auto tok = tiny(tiny_doc(false));
  EXPECT_EQ(tok->encode("a <mask>"), (Ids{17, 18}));       // lstrip eats the space
  EXPECT_EQ(tok->encode("a<mask>!a"), (Ids{17, 19, 17}));  // longest match wins
  EXPECT_EQ(tok->decode({17, 18, 19}), "a<mask><mask>!");
  EXPECT_EQ(tok->decode({17, 18, 19}, /*skip_special=*/true), "a<mask>!");
  EXPECT_EQ(tok->token_to_id("<mask>"), 18);
  EXPECT_EQ(tok->id_to_token(16), "\u0120world");
}

TEST(TinyTokenizerTest, IgnoreMerges) {
  json doc = tiny_doc(false);
  doc["model"]["merges"] = {"h e"};
  EXPECT_EQ(tiny(doc)->encode("hello"), (Ids{8, 2, 2, 3}));
  doc["model"]["ignore_merges"] = true;
  EXPECT_EQ(tiny(doc)->encode("hello"), (Ids{11}));
  EXPECT_EQ(tiny(doc)->encode("helo"), (Ids{8, 2, 3}));
}

TEST(TinyTokenizerTest, ByteLevelRegexWithPrefixSpace) {
  json doc = tiny_doc(false);
  doc["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  auto tok = tiny(doc);
  EXPECT_EQ(tok->encode("hello world"), (Ids{4, 11, 16}));
  EXPECT_EQ(tok->decode(tok->encode("hello world")), " hello world");
}

TEST(TinyTokenizerTest, SplitBehaviors) {
  json doc = tiny_doc(false);
  // Split on "l": Removed drops the l's, MergedWithPrevious keeps them on the left piece.
  auto with_split = [&](const char* behavior) {
    doc["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Split"},
                                                {"pattern", {{"String", "l"}}},
                                                {"behavior", behavior},
                                                {"invert", false}};
    return tiny(doc)->encode("hello");
  };
  EXPECT_EQ(with_split("Isolated"), (Ids{8, 2, 2, 3}));
  EXPECT_EQ(with_split("Removed"), (Ids{8, 3}));
  EXPECT_EQ(with_split("MergedWithPrevious"), (Ids{8, 2, 2, 3}));  // "hel" "l" "o"
  EXPECT_EQ(with_split("MergedWithNext"), (Ids{8, 2, 2, 3}));      // "he" "l" "lo"
  EXPECT_EQ(with_split("Contiguous"), (Ids{8, 9, 3}));             // "he" "ll" "o"
}

using test::error_of;

TEST(TinyTokenizerTest, ErrorsNameSourceAndComponent) {
  json doc = tiny_doc(false);
  doc["model"]["type"] = "Unigram";
  EXPECT_EQ(error_of([&] { tiny(doc); }),
            "tiny.json: unsupported model type 'Unigram' (supported: BPE)");

  doc = tiny_doc(false);
  doc["pre_tokenizer"] = {{"type", "Whitespace"}};
  EXPECT_EQ(error_of([&] { tiny(doc); }),
            "tiny.json: unsupported pre_tokenizer 'Whitespace' (supported: ByteLevel, Split, "
            "Metaspace, Sequence)");

  doc = tiny_doc(false);
  doc["decoder"] = {{"type", "WordPiece"}};
  EXPECT_EQ(error_of([&] { tiny(doc); }),
            "tiny.json: unsupported decoder 'WordPiece' (supported: ByteLevel, Replace, "
            "Metaspace, ByteFallback, Fuse, Strip, Sequence)");

  doc = tiny_doc(false);
  doc["normalizer"] = {{"type", "NFKC"}};
  EXPECT_EQ(error_of([&] { tiny(doc); }),
            "tiny.json: unsupported normalizer 'NFKC' (supported: NFC, Prepend, Replace, Strip, "
            "Sequence)");

  doc = tiny_doc(false);
  doc["decoder"] = {{"type", "Fuse"}};
  EXPECT_EQ(error_of([&] { tiny(doc); }),
            "tiny.json: unsupported combination: ByteLevel pre_tokenizer without ByteLevel "
            "decoder");

  doc = tiny_doc(false);
  doc["model"]["merges"] = {"h x"};
  EXPECT_NE(error_of([&] { tiny(doc); }).find("tiny.json: merge 0 uses 'x'"), std::string::npos);

  doc = tiny_doc(false);
  doc["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  EXPECT_NE(error_of([&] { tiny(doc); }).find("tiny.json: bad regex '(unclosed'"),
            std::string::npos);

  std::string malformed = error_of([] { Tokenizer::from_json("{\"model\": [", "broken.json"); });
  EXPECT_EQ(malformed.rfind("broken.json: malformed JSON", 0), 0u) << malformed;

  std::string missing = error_of([] { Tokenizer::load("/nonexistent/model"); });
  EXPECT_EQ(missing, "cannot open /nonexistent/model/tokenizer.json");
}

TEST(TokenizerLoadTest, ReadsDirectoryAndConfig) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("duet_tokenizer_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << build_bpe_tokenizer_json(400, kSpecials);
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"bos_token": null, "eos_token": {"content": "<|im_end|>", "special": true}})";
  auto tok = Tokenizer::load(dir.string());
  EXPECT_EQ(tok->vocab_size(), 400);
  EXPECT_EQ(tok->bos_id(), -1);
  EXPECT_EQ(tok->eos_id(), 399);
  std::filesystem::remove_all(dir);
}

// ---- NFC normalizer --------------------------------------------------------------------

TEST(NfcTest, NormalizesLikeUnicode) {
  EXPECT_EQ(nfc::normalize("A\u030a"), "\u00c5");              // composes
  EXPECT_EQ(nfc::normalize("\u212b"), "\u00c5");               // singleton (Angstrom)
  EXPECT_EQ(nfc::normalize("\u1100\u1161\u11a8"), "\uac01");   // Hangul L V T
  EXPECT_EQ(nfc::normalize("a\u0307\u0323"), "\u1ea1\u0307");  // reorders, then composes
  EXPECT_EQ(nfc::normalize("\u304b\u3099"), "\u304c");         // kana voiced mark
  EXPECT_EQ(nfc::normalize("e\u0301\u0301"), "\u00e9\u0301");  // second mark is blocked
  EXPECT_TRUE(nfc::is_quick_nfc("plain ascii, caf\u00e9, \u4e2d\u6587, \U0001f389"));
  EXPECT_FALSE(nfc::is_quick_nfc("cafe\u0301"));
}

TEST(NfcTest, NormalizerAppliesBeforePreTokenizing) {
  json doc = json::parse(build_bpe_tokenizer_json(512, kSpecials));
  doc["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}}}};
  auto tok = Tokenizer::from_json(doc.dump(), "nfc.json");
  EXPECT_EQ(tok->encode("cafe\u0301 <|im_end|>"), tok->encode("caf\u00e9 <|im_end|>"));
  EXPECT_EQ(tok->decode(tok->encode("e\u0301")), "\u00e9");
  doc["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array()}};  // DeepSeek-V3
  EXPECT_EQ(Tokenizer::from_json(doc.dump(), "seq.json")->decode({'e', 0xCC, 0x81}), "e\u0301");
}

// ---- BPE merge step ------------------------------------------------------------------------

TEST(BpeMergesTest, ScanAndHeapAgree) {
  // Random merge tables over 6 symbols; ids >= 6 are merge results.
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 50; ++trial) {
    BpeMerges merges;
    int32_t next_id = 6;
    for (int32_t rank = 0; rank < 30; ++rank) {
      int32_t a = int32_t(rng() % next_id), b = int32_t(rng() % next_id);
      merges.add(a, b, rank, next_id++);
    }
    for (int len : {0, 1, 2, 7, 40, 200}) {
      Ids word(len);
      for (int32_t& s : word) s = int32_t(rng() % 6);
      Ids scan = word, heap = word;
      merges.apply_scan(&scan);
      merges.apply_heap(&heap);
      EXPECT_EQ(scan, heap) << "trial " << trial << " len " << len;
    }
  }
}

}  // namespace
}  // namespace duet

namespace duet {
namespace {

TEST(Utf8LossyTest, ReplacesInvalidSequencesOnly) {
  EXPECT_EQ(utf8_lossy("plain"), "plain");
  EXPECT_EQ(utf8_lossy("\xe4\xbd\xa0\xe5\xa5\xbd"), "\xe4\xbd\xa0\xe5\xa5\xbd");  // 你好
  EXPECT_EQ(utf8_lossy("a\xe4\xbd"), "a\xef\xbf\xbd");  // cut short: one replacement
  EXPECT_EQ(utf8_lossy("\xff"
                       "b"),
            "\xef\xbf\xbd"
            "b");
  EXPECT_EQ(utf8_lossy("\xc0\xaf"), "\xef\xbf\xbd\xef\xbf\xbd");                  // overlong '/'
  EXPECT_EQ(utf8_lossy("\xed\xa0\x80"), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // surrogate
}

}  // namespace
}  // namespace duet

#include "model/make_model.h"
#include "test_util.h"

namespace duet {
namespace {

// tokenizer_config.json's add_bos_token is read at load (DeepSeek and Llama set it, Qwen not).
TEST(TokenizerConfigTest, ReadsAddBosToken) {
  for (const auto& [arch, want] : {std::pair{"deepseek_v2", true}, std::pair{"qwen3_moe", false}}) {
    MakeModelOptions opt;
    opt.dir = test::make_temp_dir("duet-tokcfg-");
    opt.arch = arch;
    make_model(opt);
    auto tok = Tokenizer::load(opt.dir);
    EXPECT_EQ(tok->add_bos_token(), want) << arch;
    EXPECT_GE(tok->bos_id(), 0) << arch;
  }
}

}  // namespace
}  // namespace duet

namespace duet {
namespace {

// Token ids in tokenizer.json must be integers in [0, 2^30): a float (found by
// fuzz_tokenizer_json: 5e98 made the conversion undefined), a negative or a huge id is refused
// naming the token.
TEST(TokenizerJsonTest, BadTokenIdsAreRefusedByName) {
  for (const char* bad : {"5.05333e+98", "1.0", "-3", "4294967296"}) {
    nlohmann::json doc = nlohmann::json::parse(build_bpe_tokenizer_json(512, {"<s>"}));
    doc["model"]["vocab"]["a"] = nlohmann::json::parse(bad);
    try {
      Tokenizer::from_json(doc.dump(), "bad.json");
      FAIL() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'a'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace duet
