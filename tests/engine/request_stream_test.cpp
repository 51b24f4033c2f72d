// RequestStream, the channel from the engine thread to one HTTP thread: pushed output reaches
// the reader at once; staged output reaches it only at flush(), all of it in one delta and one
// wake-up, with the finish after every staged token; a stream finished directly (the engine
// failing) ignores what is flushed later.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "engine/request.h"

namespace duet {
namespace {

using std::chrono::milliseconds;

TEST(RequestStream, PushReachesTheReaderAtOnce) {
  RequestStream s(1, 5);
  s.push("a", 10);
  s.push("b", 11);
  const StreamDelta d = s.wait(milliseconds(0));
  EXPECT_EQ(d.text, "ab");
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{10, 11}));
  EXPECT_EQ(d.completion_tokens, 2);
  EXPECT_EQ(d.prompt_tokens, 5);
  EXPECT_FALSE(d.finished);
}

TEST(RequestStream, StagedOutputWaitsForFlushThenArrivesInOneDelta) {
  RequestStream s(1, 3);
  EXPECT_TRUE(s.stage("he", 7));    // the first staged token: the caller lists the stream
  EXPECT_FALSE(s.stage("llo", 8));  // already listed
  EXPECT_FALSE(s.stage("", 9));
  StreamDelta d = s.wait(milliseconds(0));
  EXPECT_TRUE(d.tokens.empty()) << "staged output reached the reader before flush()";
  EXPECT_TRUE(d.text.empty());
  EXPECT_EQ(d.completion_tokens, 0);

  EXPECT_TRUE(s.flush());
  d = s.wait(milliseconds(0));
  EXPECT_EQ(d.text, "hello");
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{7, 8, 9}));
  EXPECT_EQ(d.completion_tokens, 3);
  EXPECT_FALSE(s.flush()) << "nothing was staged since";

  // The buffers start empty again after a flush.
  EXPECT_TRUE(s.stage("!", 4));
  EXPECT_TRUE(s.flush());
  d = s.wait(milliseconds(0));
  EXPECT_EQ(d.text, "!");
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{4}));
  EXPECT_EQ(d.completion_tokens, 4);
}

TEST(RequestStream, StagedFinishComesAfterTheStagedTokens) {
  RequestStream s(1, 2);
  EXPECT_TRUE(s.stage("x", 1));
  EXPECT_FALSE(s.stage_finish("stop", "tail"));
  EXPECT_FALSE(s.stage_finish("length")) << "only the first finish counts";
  EXPECT_FALSE(s.wait(milliseconds(0)).finished);
  EXPECT_TRUE(s.flush());
  StreamDelta d = s.wait(milliseconds(0));
  EXPECT_TRUE(d.finished);
  EXPECT_EQ(d.finish_reason, "stop");
  EXPECT_EQ(d.text, "xtail");
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{1}));
  EXPECT_EQ(d.completion_tokens, 1);
  // The final delta is handed out once; later waits keep the totals.
  d = s.wait(milliseconds(0));
  EXPECT_TRUE(d.tokens.empty());
  EXPECT_EQ(d.completion_tokens, 1);
}

TEST(RequestStream, AStageFinishAloneIsListedAndFlushed) {
  RequestStream s(1, 2);
  EXPECT_TRUE(s.stage_finish("abort", "", "rank 1 died"));
  EXPECT_TRUE(s.flush());
  const StreamDelta d = s.wait(milliseconds(0));
  EXPECT_TRUE(d.finished);
  EXPECT_EQ(d.finish_reason, "abort");
  EXPECT_EQ(d.error, "rank 1 died");
}

TEST(RequestStream, FlushAfterADirectFinishAddsNothing) {
  RequestStream s(1, 2);
  s.stage("late", 3);
  s.finish("abort", "", "engine error");
  EXPECT_TRUE(s.flush());
  const StreamDelta d = s.wait(milliseconds(0));
  EXPECT_TRUE(d.finished);
  EXPECT_EQ(d.finish_reason, "abort");
  EXPECT_TRUE(d.tokens.empty());
  EXPECT_EQ(d.completion_tokens, 0);
}

// A reader blocked in wait() is woken by flush(), not by stage().
TEST(RequestStream, FlushWakesABlockedReader) {
  RequestStream s(1, 2);
  StreamDelta got;
  std::thread reader([&] { got = s.wait(std::chrono::seconds(30)); });
  s.stage("a", 1);
  s.stage("b", 2);
  s.flush();
  reader.join();
  EXPECT_EQ(got.text, "ab");
  EXPECT_EQ(got.tokens, (std::vector<int32_t>{1, 2}));
}

}  // namespace
}  // namespace duet
