// StreamWaker: streams handed over are woken on the waker's thread (a reader blocked on its
// stream returns with the output flushed without a wake-up), the caller's list comes back empty,
// batches handed over while the waker is busy are all woken, and the destructor wakes whatever
// is still queued. A reader that is never woken waits for an hour: the test then times out.
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

}  // namespace
}  // namespace duet
