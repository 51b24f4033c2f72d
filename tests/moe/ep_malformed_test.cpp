// A dispatch message that does not add up — a byte count that is not a whole number of records,
// fewer bytes than the row counts they announce, counts beyond the room — is an error naming the
// rank that sent it, never a read past what arrived. Rank 0 of a two-rank group runs against a
// fake transport that delivers what the test wrote as rank 1's part.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/communicator.h"
#include "moe/ep_dispatcher.h"

namespace duet {
namespace {

// Rank 0 of 2: every bounded all-to-all delivers `from_1` (its bytes as rank 1's part); nothing
// else is expected.
class FakeOps final : public CollectiveOps {
 public:
  explicit FakeOps(std::function<std::vector<float>()> from_1) : from_1_(std::move(from_1)) {}
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  void all_to_all_v(const void*, const std::vector<int64_t>&, void*,
                    const std::vector<int64_t>&) override {
    DUET_ERROR("unexpected all_to_all_v");
  }
  void all_to_all_bounded(const void*, const std::vector<int64_t>&, const std::vector<int64_t>&,
                          void* recv, const std::vector<int64_t>& recv_capacity,
                          std::vector<int64_t>* recv_bytes) override {
    const std::vector<float> part = from_1_();
    const int64_t bytes = static_cast<int64_t>(part.size() * 4);
    DUET_CHECK(bytes <= recv_capacity[1], "the test's message exceeds the room");
    if (bytes > 0) {
      std::memcpy(static_cast<char*>(recv) + recv_capacity[0], part.data(),
                  static_cast<size_t>(bytes));
    }
    *recv_bytes = {0, bytes};
  }
  void all_gather(const void*, int64_t, void*) override { DUET_ERROR("unexpected all_gather"); }
  void all_reduce(void*, int64_t, ElemType, ReduceOp) override {
    DUET_ERROR("unexpected all_reduce");
  }

 private:
  std::function<std::vector<float>()> from_1_;
};

constexpr int64_t kEmbd = 8, kTopk = 2, kTokens = 2;

// The error rank 0's dispatch_recv throws when rank 1's part is `from_1`, or "". With chunks
// (a chunked dispatch), from_1 gives each chunk's part in turn and every chunk is waited for.
std::string dispatch_error(All2AllBackend backend, std::function<std::vector<float>()> from_1,
                           int chunks = 1) {
  Communicator comm(std::make_unique<FakeOps>(std::move(from_1)), std::chrono::seconds(5));
  EpDispatcher d(comm, place_experts(8, 2),
                 EpDispatcherOptions{backend, 16, RowDtype::kF32, chunks});
  d.plan_step(kTokens);  // bounds the step: one round, no count exchange
  std::vector<float> x(kTokens * kEmbd, 1.0f), out(kTokens * kEmbd, 0.0f);
  const std::vector<int32_t> ids = {0, 5, 1, 6};  // each token: one expert per rank
  const std::vector<float> weights = {0.5f, 0.5f, 0.5f, 0.5f};
  RoutedTokens t{x.data(), ids.data(), weights.data(), kTokens, kEmbd, kTopk, out.data()};
  d.dispatch_send(t);
  try {
    ExpertBatch& b = d.dispatch_recv();
    for (size_t c = 0; c < b.chunk_ends.size(); ++c) b.chunk_ready(static_cast<int>(c));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<float> count_as_float(int32_t c) {
  float f;
  std::memcpy(&f, &c, 4);
  return {f};
}

TEST(EpMalformedTest, HighThroughputRecordsMustBeWhole) {
  // A record is 2·K + D words (expert ids, weights, the row): send one and a half.
  const std::string e = dispatch_error(All2AllBackend::kHighThroughput, [] {
    return std::vector<float>(static_cast<size_t>((2 * kTopk + kEmbd) * 3 / 2), 0.0f);
  });
  EXPECT_NE(e.find("rank 1 sent 72 bytes, not a whole number of 48-byte records"),
            std::string::npos)
      << e;
}

TEST(EpMalformedTest, LowLatencyCountsMustMatchTheBytes) {
  // Rank 0 holds experts 0-3: rank 1's part is 4 row counts, then the rows they count.
  const auto counts = [](std::vector<int32_t> c, int64_t rows_sent) {
    std::vector<float> part;
    for (int32_t v : c) part.push_back(count_as_float(v)[0]);
    part.resize(part.size() + static_cast<size_t>(rows_sent * kEmbd), 0.25f);
    return part;
  };
  // Counts announce 2 rows, 1 arrives.
  std::string e = dispatch_error(All2AllBackend::kLowLatency, [&] { return counts({1, 1, 0, 0}, 1); });
  EXPECT_NE(e.find("rank 1 sent 48 bytes for 2 rows, expected 80"), std::string::npos) << e;
  // Fewer bytes than the counts themselves.
  e = dispatch_error(All2AllBackend::kLowLatency, [] { return std::vector<float>(2, 0.0f); });
  EXPECT_NE(e.find("rank 1 sent 8 bytes, fewer than its 4 row counts"), std::string::npos) << e;
  // A count beyond the room, and a negative one.
  e = dispatch_error(All2AllBackend::kLowLatency, [&] { return counts({1000, 0, 0, 0}, 0); });
  EXPECT_NE(e.find("rank 1 sent 1000 rows for expert 0"), std::string::npos) << e;
  e = dispatch_error(All2AllBackend::kLowLatency, [&] { return counts({0, -3, 0, 0}, 0); });
  EXPECT_NE(e.find("rank 1 sent -3 rows for expert 1"), std::string::npos) << e;
  // A well-formed message passes.
  EXPECT_EQ(dispatch_error(All2AllBackend::kLowLatency, [&] { return counts({1, 1, 0, 0}, 2); }),
            "");
}

TEST(EpMalformedTest, LowLatencyChunksMustMatchTheCounts) {
  // Two chunks of rank 0's experts 0-3: {0, 1} and {2, 3}. Chunk 0 carries rank 1's 4 counts and
  // the rows of experts 0 and 1; chunk 1 the rows of experts 2 and 3.
  auto parts = [](std::vector<std::vector<float>> p) {
    auto next = std::make_shared<size_t>(0);
    return [p, next] { return p.at((*next)++); };
  };
  std::vector<float> head;
  for (int32_t v : {1, 0, 0, 1}) head.push_back(count_as_float(v)[0]);
  std::vector<float> first = head, all = head;
  first.resize(first.size() + kEmbd, 0.25f);  // expert 0's row
  all.resize(all.size() + 2 * kEmbd, 0.25f);  // and expert 3's, sent too early
  const std::vector<float> row(kEmbd, 0.5f), none;
  EXPECT_EQ(dispatch_error(All2AllBackend::kLowLatency, parts({first, row}), 2), "");
  // The whole buffer in chunk 0: more than the first chunk's rows.
  std::string e = dispatch_error(All2AllBackend::kLowLatency, parts({all, none}), 2);
  EXPECT_NE(e.find("rank 1 sent 80 bytes for 1 rows, expected 48"), std::string::npos) << e;
  // Chunk 1 short of the row its count announced.
  e = dispatch_error(All2AllBackend::kLowLatency, parts({first, none}), 2);
  EXPECT_NE(e.find("low_latency dispatch, chunk 1: rank 1 sent 0 bytes, expected 32"),
            std::string::npos)
      << e;
}

}  // namespace
}  // namespace duet

namespace duet {
namespace {

// A transfer that outlives the receive half's patience (the backend blocks past the watchdog
// without a sign of life): dispatch_recv gives up with an error, and destroying the dispatcher then
// waits for the transfer instead of freeing the buffers it still writes into.
TEST(EpDispatcherLifetimeTest, DestroyingAfterAGiveUpWaitsForTheTransfer) {
  std::atomic<bool> dispatcher_gone{false};
  std::atomic<bool> wrote_after_gone{false};
  std::atomic<bool> transfer_done{false};
  {
    Communicator comm(std::make_unique<FakeOps>([&] {
                        // Stuck past the handle's backstop (watchdog + 1 s), no keepalive.
                        std::this_thread::sleep_for(std::chrono::milliseconds(1600));
                        wrote_after_gone = dispatcher_gone.load();
                        transfer_done = true;
                        return std::vector<float>(static_cast<size_t>(2 * kTopk + kEmbd), 0.0f);
                      }),
                      std::chrono::milliseconds(200));
    std::string error;
    {
      EpDispatcher d(comm, place_experts(8, 2), EpDispatcherOptions{});
      d.plan_step(kTokens);
      std::vector<float> x(kTokens * kEmbd, 1.0f), out(kTokens * kEmbd, 0.0f);
      const std::vector<int32_t> ids = {0, 5, 1, 6};
      const std::vector<float> weights = {0.5f, 0.5f, 0.5f, 0.5f};
      d.dispatch_send(RoutedTokens{x.data(), ids.data(), weights.data(), kTokens, kEmbd, kTopk,
                                   out.data()});
      try {
        d.dispatch_recv();
      } catch (const Error& e) {
        error = e.what();
      }
      EXPECT_FALSE(transfer_done.load()) << "the give-up came after the transfer";
    }  // ~EpDispatcher
    dispatcher_gone = true;
    EXPECT_NE(error.find("not finished after"), std::string::npos) << error;
    EXPECT_TRUE(transfer_done.load()) << "the dispatcher was destroyed with its transfer running";
  }
  EXPECT_FALSE(wrote_after_gone.load());
}

}  // namespace
}  // namespace duet
