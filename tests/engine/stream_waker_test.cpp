// StreamWaker: streams handed over are woken on the waker's thread (a reader blocked on its
// stream returns with the output flushed without a wake-up), the caller's list comes back empty,
// batches handed over while the waker is busy are all woken, and the destructor wakes whatever
// is still queued; a stream handed over again while its wake-up is queued is not queued twice.
// A reader that is never woken waits for an hour: the test then times out.
#include "engine/stream_waker.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace duet {
namespace {

constexpr auto kForever = std::chrono::hours(1);

struct Reader {
  std::shared_ptr<RequestStream> stream;
  StreamDelta got;
  std::thread thread;
  explicit Reader(uint64_t id) : stream(std::make_shared<RequestStream>(id, 1)) {}
  void start() {
    thread = std::thread([this] { got = stream->wait(kForever); });
  }
};

TEST(StreamWaker, WakesReadersOfFlushedStreams) {
  StreamWaker waker;
  std::vector<std::unique_ptr<Reader>> readers;
  for (uint64_t i = 0; i < 4; ++i) readers.push_back(std::make_unique<Reader>(i));
  for (auto& r : readers) r->start();
  std::vector<std::shared_ptr<RequestStream>> batch;
  for (auto& r : readers) {
    r->stream->stage("t" + std::to_string(r->stream->id()), static_cast<int32_t>(r->stream->id()));
    ASSERT_TRUE(r->stream->flush(/*wake=*/false));
    batch.push_back(r->stream);
  }
  waker.wake(batch);
  EXPECT_TRUE(batch.empty());
  for (auto& r : readers) {
    r->thread.join();
    EXPECT_EQ(r->got.text, "t" + std::to_string(r->stream->id()));
    EXPECT_EQ(r->got.tokens, std::vector<int32_t>{static_cast<int32_t>(r->stream->id())});
  }
}

TEST(StreamWaker, ManyBatchesAllWoken) {
  StreamWaker waker;
  const int n = 64;
  std::vector<std::unique_ptr<Reader>> readers;
  for (int i = 0; i < n; ++i) readers.push_back(std::make_unique<Reader>(i));
  for (auto& r : readers) r->start();
  // One stream per batch, handed over back to back while the waker works on earlier ones.
  for (auto& r : readers) {
    r->stream->stage("x", 1);
    r->stream->flush(/*wake=*/false);
    std::vector<std::shared_ptr<RequestStream>> one = {r->stream};
    waker.wake(one);
    EXPECT_TRUE(one.empty());
  }
  for (auto& r : readers) {
    r->thread.join();
    EXPECT_EQ(r->got.tokens.size(), 1u);
  }
}

TEST(StreamWaker, DestructorWakesWhatIsQueued) {
  Reader r(7);
  r.start();
  {
    StreamWaker waker;
    r.stream->stage_finish("stop", "end");
    r.stream->flush(/*wake=*/false);
    std::vector<std::shared_ptr<RequestStream>> batch = {r.stream};
    waker.wake(batch);
  }
  r.thread.join();
  EXPECT_TRUE(r.got.finished);
  EXPECT_EQ(r.got.text, "end");
}

// A stream handed over again before its queued wake-up ran is not queued twice: the one
// wake-up hands over everything flushed until then.
TEST(StreamWaker, OneQueuedWakeUpPerStream) {
  RequestStream s(1, 1);
  EXPECT_TRUE(s.queue_wake());
  EXPECT_FALSE(s.queue_wake()) << "a second wake-up queued while the first is pending";
  s.wake_taken();
  EXPECT_TRUE(s.queue_wake());
  s.wake_taken();

  Reader r(2);
  r.start();
  StreamWaker waker;
  for (int32_t t = 0; t < 100; ++t) {
    r.stream->stage("", t);
    r.stream->flush(/*wake=*/false);
    std::vector<std::shared_ptr<RequestStream>> one = {r.stream};
    waker.wake(one);
  }
  r.thread.join();
  // The reader took what had arrived when it woke: a prefix, in order.
  ASSERT_FALSE(r.got.tokens.empty());
  for (size_t i = 0; i < r.got.tokens.size(); ++i) EXPECT_EQ(r.got.tokens[i], int32_t(i));
  // The rest is there for its next wait, which never blocks: every flush queued a wake-up or
  // found one queued.
  size_t total = r.got.tokens.size();
  while (total < 100) {
    const StreamDelta d = r.stream->wait(kForever);
    for (size_t i = 0; i < d.tokens.size(); ++i) EXPECT_EQ(d.tokens[i], int32_t(total + i));
    total += d.tokens.size();
  }
}

}  // namespace
}  // namespace duet
