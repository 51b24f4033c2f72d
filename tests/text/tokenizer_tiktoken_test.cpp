// Kimi K2's tiktoken tokenizer (tiktoken.model + tokenizer_config.json) and the Oniguruma class
// intersections of its regex. Against tiktoken itself on real vocabularies: tests/npm/tokenizer.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "error_of.h"
#include "test_util.h"
#include "text/tokenizer.h"
#include "text/tokenizer_regex.h"

namespace duet {
namespace {

using json = nlohmann::json;
using Ids = std::vector<int32_t>;
using test::make_temp_dir;
using test::write_file;

// The pre-tokens `pattern` cuts `text` into.
std::vector<std::string> pieces(const std::string& pattern, const std::string& text) {
  TokenRegex re(pattern, false, "test");
  std::vector<TextSpan> spans;
  re.find_all(text, &spans);
  std::vector<std::string> out;
  for (const TextSpan& s : spans) out.push_back(text.substr(s.begin, s.end - s.begin));
  return out;
}

using test::error_of;

TEST(OnigurumaClassesTest, KimiPatternKeepsHanRunsApart) {
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces(kKimiPattern, "中文English混合"), (V{"中文", "English", "混合"}));
  EXPECT_EQ(pieces(kKimiPattern, "汉字abc"), (V{"汉字", "abc"}));
  EXPECT_EQ(pieces(kKimiPattern, "北京市 Pascal"), (V{"北京市", " Pascal"}));
  // Kana is letters but not Han: it joins the letter branches, and so does a following Latin run.
  EXPECT_EQ(pieces(kKimiPattern, "日本語のテキスト"), (V{"日本語", "のテキスト"}));
  EXPECT_EQ(pieces(kKimiPattern, "DON'T don't 12345"), (V{"DON'T", " don't", " ", "123", "45"}));
  // Read as PCRE2 reads it unchanged, the class would also hold '&', '[' and '^' and end early.
  EXPECT_NE(oniguruma_classes(kKimiPattern, "test"), kKimiPattern);
}

TEST(OnigurumaClassesTest, IntersectionsBecomeLookaheads) {
  using V = std::vector<std::string>;
  EXPECT_EQ(oniguruma_classes("[a-z&&[^aeiou]]+", "t"), "(?:(?=[^aeiou])[a-z])+");
  EXPECT_EQ(pieces("[a-z&&[^aeiou]]+", "strength is"), (V{"str", "ngth", "s"}));
  EXPECT_EQ(pieces("[a-z&&b-y&&[^aeiou]]+", "abcz"), (V{"bc"}));
  // Negated: one character outside the intersection (any character, newlines too).
  EXPECT_EQ(pieces("[^a-z&&[^aeiou]]+", "strength is\n"), (V{"e", " i", "\n"}));
  // Escapes, POSIX classes and a leading ']' stay as they are; classes without '&&' unchanged.
  for (const char* same : {R"([\]\[&]+)", "[[:alpha:]]+", "[]a]", R"(\[a&&b\])", "a&&b"}) {
    EXPECT_EQ(oniguruma_classes(same, "t"), same);
  }
  EXPECT_EQ(pieces(R"([\p{L}&&[^\p{Han}]]+)", "ab中c"), (V{"ab", "c"}));
}

TEST(OnigurumaClassesTest, RefusesWhatPcre2WouldMisread) {
  EXPECT_NE(error_of([] { oniguruma_classes("[a[bc]]", "f.json"); }).find("f.json: bad regex"),
            std::string::npos);
  for (const char* unions : {"[a[bc]]", "[[bc]a]", "[[bc]\\d&&x]", "[[bc][:alpha:]]"}) {
    EXPECT_NE(error_of([&] { oniguruma_classes(unions, "f"); }).find("a union"), std::string::npos)
        << unions;
  }
  EXPECT_NE(error_of([] { oniguruma_classes("[abc", "f"); }).find("unterminated"),
            std::string::npos);
  EXPECT_NE(error_of([] { oniguruma_classes("[a&&]", "f"); }).find("empty operand"),
            std::string::npos);
  EXPECT_NE(error_of([] { oniguruma_classes("[a&&[b[c]]]", "f"); }).find("nested two deep"),
            std::string::npos);
  // A tokenizer.json whose Split regex has one is refused at load, by file.
  EXPECT_NE(error_of([] { TokenRegex("x[a[b]]", false, "tok.json"); }).find("tok.json"),
            std::string::npos);
}

// A tiktoken.model: the 256 bytes at ranks 0..255 (rank == byte), then `extra` in order.
std::string ranks_text(const std::vector<std::string>& extra) {
  static const char* kB64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  auto b64 = [](const std::string& raw) {
    std::string out;
    for (size_t i = 0; i < raw.size(); i += 3) {
      uint32_t v = uint32_t(uint8_t(raw[i])) << 16;
      if (i + 1 < raw.size()) v |= uint32_t(uint8_t(raw[i + 1])) << 8;
      if (i + 2 < raw.size()) v |= uint8_t(raw[i + 2]);
      for (size_t k = 0; k < 4; ++k)
        out += i + k <= raw.size() ? kB64[(v >> (18 - 6 * k)) & 63] : '=';
    }
    return out;
  };
  std::string text;
  for (int b = 0; b < 256; ++b)
    text += b64(std::string(1, char(b))) + " " + std::to_string(b) + "\n";
  for (size_t i = 0; i < extra.size(); ++i)
    text += b64(extra[i]) + " " + std::to_string(256 + i) + "\n";
  return text;
}

std::unique_ptr<Tokenizer> from_ranks(const std::string& ranks,
                                      const std::map<int64_t, std::string>& named = {},
                                      int32_t n_reserved = 4) {
  return Tokenizer::from_json(
      tiktoken_tokenizer_json(ranks, "tiktoken.model", named, n_reserved, kKimiPattern),
      "tiktoken.model");
}

TEST(TiktokenTokenizerTest, JoinsTheLowestRankFirstAndTakesWholeTokens) {
  // ranks: "ab" 256, "bc" 257, "abc" 258, "cd" 259, "bcd" 260
  const auto tok = from_ranks(ranks_text({"ab", "bc", "abc", "cd", "bcd"}));
  EXPECT_EQ(tok->encode("abc"), (Ids{258}));        // a token: whole
  EXPECT_EQ(tok->encode("abcd"), (Ids{258, 'd'}));  // ab (256), then abc (258) before cd (259)
  EXPECT_EQ(tok->encode("bcd"), (Ids{260}));
  EXPECT_EQ(tok->encode("xbcdx"), (Ids{'x', 260, 'x'}));  // bc (257), then bc + d = bcd (260)
  EXPECT_EQ(tok->encode("zabcz"), (Ids{'z', 258, 'z'}));  // ab, then ab + c = abc
  // Han runs and letters are separate pre-tokens: "ab" never joins across them.
  EXPECT_EQ(tok->encode("a中b"), (Ids{'a', 0xe4, 0xb8, 0xad, 'b'}));
  EXPECT_EQ(tok->decode(tok->encode("a中b abcd\n")), "a中b abcd\n");
  EXPECT_EQ(tok->vocab_size(), 256 + 5 + 4);
}

TEST(TiktokenTokenizerTest, SpecialTokensFollowTheRanks) {
  const auto tok = from_ranks(ranks_text({"ab"}), {{257, "[BOS]"}, {259, "<|im_end|>"}});
  EXPECT_EQ(tok->token_to_id("[BOS]"), 257);
  EXPECT_EQ(tok->token_to_id("<|reserved_token_258|>"), 258);
  EXPECT_EQ(tok->token_to_id("<|im_end|>"), 259);
  EXPECT_EQ(tok->token_to_id("<|reserved_token_260|>"), 260);
  EXPECT_EQ(tok->encode("[BOS]ab<|im_end|>"), (Ids{257, 256, 259}));
  EXPECT_EQ(tok->decode({257, 256, 259}), "[BOS]ab<|im_end|>");
  EXPECT_EQ(tok->decode({257, 256, 259}, /*skip_special=*/true), "ab");
  EXPECT_NE(error_of([] {
              from_ranks(ranks_text({"ab"}), {{300, "[X]"}});
            }).find("special token 300 ('[X]') is outside [257, 261)"),
            std::string::npos);
}

TEST(TiktokenTokenizerTest, MalformedRanksAreRefusedByLine) {
  const std::string good = ranks_text({"ab"});
  auto message = [](const std::string& ranks) { return error_of([&] { from_ranks(ranks); }); };
  EXPECT_NE(message(good + "not-base64! 257\n").find("tiktoken.model:258: expected"),
            std::string::npos);
  EXPECT_NE(message(good + "YWJj\n").find("tiktoken.model:258: expected"), std::string::npos);
  EXPECT_NE(
      message(good + "YWJj 258\n").find("tiktoken.model:258: rank 258 in a file of 258 lines"),
      std::string::npos);
  EXPECT_NE(
      message(good + "YWJj 256\n").find("tiktoken.model:258: rank 256 is given twice (line 257"),
      std::string::npos);
  EXPECT_NE(message(good + "\nYWJj 258\n").find("the ranks are not 0..258: rank 257 is missing"),
            std::string::npos);
  EXPECT_NE(message(good + "YWI= 257\n").find("ranks 256 and 257 are the same token"),
            std::string::npos);
  std::string no_z = good;  // "abc" where 'z' was: every rank once, but byte 122 has none
  no_z.replace(no_z.find("eg== 122"), 8, "YWJj 122");
  EXPECT_NE(message(no_z).find("byte 122 has no rank"), std::string::npos);
  EXPECT_NE(message(ranks_text({}).substr(0, 4)).find("tiktoken.model:1: expected"),
            std::string::npos);
}

TEST(TiktokenTokenizerTest, KimiDirectoryLoadsFromItsConfig) {
  const std::string dir = make_temp_dir("kimi-tok-");
  write_file(dir + "/tiktoken.model", ranks_text({"ab", "abc"}));
  // No tokenizer_config.json: which tiktoken tokenizer (and regex) is not known.
  EXPECT_NE(error_of([&] { Tokenizer::load(dir); }).find("no tokenizer_config.json"),
            std::string::npos);
  json config = {
      {"tokenizer_class", "TikTokenTokenizer"},
      {"auto_map", {{"AutoTokenizer", {"tokenization_other.TikTokenTokenizer", nullptr}}}}};
  write_file(dir + "/tokenizer_config.json", config.dump());
  EXPECT_NE(error_of([&] { Tokenizer::load(dir); }).find("'tokenization_other.TikTokenTokenizer'"),
            std::string::npos);
  config["auto_map"]["AutoTokenizer"][0] = "tokenization_kimi.TikTokenTokenizer";
  config["added_tokens_decoder"] = {{"258", {{"content", "[BOS]"}, {"special", true}}},
                                    {"259", {{"content", "[EOS]"}, {"special", true}}}};
  config["bos_token"] = "[BOS]";
  config["eos_token"] = "[EOS]";
  write_file(dir + "/tokenizer_config.json", config.dump());
  const auto tok = Tokenizer::load(dir);
  EXPECT_EQ(tok->vocab_size(), 258 + 256);
  EXPECT_EQ(tok->bos_id(), 258);
  EXPECT_EQ(tok->eos_id(), 259);
  EXPECT_EQ(tok->encode("abc 中文"), (Ids{257, ' ', 0xe4, 0xb8, 0xad, 0xe6, 0x96, 0x87}));
  EXPECT_EQ(tok->id_to_token(258 + 255), "<|reserved_token_513|>");
  // A tokenizer.json beside it wins, as it would in Hugging Face's loader.
  config.erase("bos_token");
  config.erase("eos_token");
  write_file(dir + "/tokenizer_config.json", config.dump());
  write_file(dir + "/tokenizer.json", build_bpe_tokenizer_json(300, {"<|endoftext|>"}));
  EXPECT_EQ(Tokenizer::load(dir)->vocab_size(), 300);
}

TEST(TiktokenTokenizerTest, GeneratedRanksRoundTrip) {
  const std::string ranks = build_tiktoken_ranks(1024);
  EXPECT_EQ(ranks, build_tiktoken_ranks(1024));  // deterministic
  const auto tok = from_ranks(ranks, {}, 256);
  EXPECT_EQ(tok->vocab_size(), 1024 + 256);
  for (const std::string text :
       {"The quick brown fox jumps over the lazy dog.",
        "中文测试 mixed with English, 12345 and\ttabs\n\n", "\xff\xfe stray bytes \xc3"}) {
    EXPECT_EQ(tok->decode(tok->encode(text)), utf8_lossy(text)) << text;
  }
  EXPECT_LT(tok->encode("The quick brown fox jumps over the lazy dog.").size(), 30u);  // of 44
}

}  // namespace
}  // namespace duet
