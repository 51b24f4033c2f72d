// IncrementalDecoder on a byte-level tokenizer: pieces never end inside a UTF-8 character and
// always concatenate to exactly the whole decode, for every prefix of real and random sequences.
#include <gtest/gtest.h>

#include <random>

#include "text/tokenizer.h"

namespace duet {
namespace {

using Ids = std::vector<int32_t>;

const std::vector<std::string> kSpecials = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

class StreamTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tok_ = Tokenizer::from_json(build_bpe_tokenizer_json(1024, kSpecials), "built.json").release();
  }
  static void TearDownTestSuite() { delete tok_; }

  // Pieces of `ids` streamed, the finish() piece last; checks the two stream properties.
  static std::vector<std::string> stream(const Ids& ids, bool skip_special) {
    IncrementalDecoder d(*tok_, skip_special);
    std::vector<std::string> pieces;
    std::string all;
    for (int32_t id : ids) pieces.push_back(d.step(id));
    pieces.push_back(d.finish());
    for (const std::string& p : pieces) {
      EXPECT_EQ(utf8_lossy(p), p) << "a piece ends inside a character";
      all += p;
    }
    EXPECT_EQ(all, tok_->decode(ids, skip_special));
    return pieces;
  }
  static Tokenizer* tok_;
};
Tokenizer* StreamTest::tok_ = nullptr;

TEST_F(StreamTest, CharacterAppearsWhenComplete) {
  const Ids ids = tok_->encode("\xe4\xb8\xad");  // 中: three byte tokens in this vocab
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(stream(ids, false), (std::vector<std::string>{"", "", "\xe4\xb8\xad", ""}));
  // Cut short, the held bytes become one U+FFFD at the end, as decode() gives.
  EXPECT_EQ(stream(Ids(ids.begin(), ids.begin() + 2), false),
            (std::vector<std::string>{"", "", "\ufffd"}));
  EXPECT_EQ(tok_->decode(Ids(ids.begin(), ids.begin() + 2)), "\ufffd");
}

TEST_F(StreamTest, SpecialTokensSkippedOrKept) {
  const Ids ids = tok_->encode("<|im_start|>user\nhi 🎉<|im_end|>");
  EXPECT_EQ(stream(ids, false).front(), "<|im_start|>");
  EXPECT_EQ(stream(ids, true).front(), "");
  // A special token between the bytes of a character: the character is broken, as in decode.
  const Ids emoji = tok_->encode("🎉");
  Ids broken = {emoji[0], tok_->token_to_id("<|im_end|>")};
  broken.insert(broken.end(), emoji.begin() + 1, emoji.end());
  stream(broken, false);
  stream(broken, true);
}

TEST_F(StreamTest, EveryPrefixOfMixedText) {
  const Ids ids = tok_->encode(
      "Hello, 世界! Emoji 👨‍👩‍👧 café\n\n  code: int x = 42;<|endoftext|>日本語 \xff "
      "tail");
  for (size_t n = 0; n <= ids.size(); ++n) {
    for (bool skip : {false, true}) stream(Ids(ids.begin(), ids.begin() + n), skip);
  }
}

TEST_F(StreamTest, RandomIdSequences) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    Ids ids(rng() % 24);
    for (int32_t& id : ids) id = int32_t(rng() % tok_->vocab_size());
    stream(ids, trial % 2 == 0);
  }
}

}  // namespace
}  // namespace duet
