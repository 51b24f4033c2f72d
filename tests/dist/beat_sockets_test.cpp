// BeatSockets over real loopback TCP, its ranks as threads: every pair connects, beats arrive in
// order, a peer that presents the wrong token or never reads is not waited for, and a peer that
// goes away is noticed.
#include "dist/beat_sockets.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

namespace duet {
namespace {

// The exchange of n threads: each posts its record and gets all n once every one has posted.
// `edit` may change what a rank receives (a forged record).
class ThreadExchange {
 public:
  explicit ThreadExchange(int n) : records_(size_t(n)), left_(n) {}
  std::function<void(int rank, std::vector<std::string>&)> edit;

  BeatSockets::Exchange for_rank(int rank) {
    return [this, rank](const std::string& mine) {
      std::unique_lock<std::mutex> lock(mu_);
      records_[size_t(rank)] = mine;
      if (--left_ == 0) cv_.notify_all();
      cv_.wait(lock, [this] { return left_ == 0; });
      std::vector<std::string> all = records_;
      if (edit) edit(rank, all);
      return all;
    };
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> records_;  // GUARDED_BY(mu_)
  int left_;                          // GUARDED_BY(mu_)
};

// Sets up n ranks' sockets on n threads; `took`, if given, gets each rank's time to set up.
std::vector<std::unique_ptr<BeatSockets>> connect_ranks(
    int n, ThreadExchange& ex, std::chrono::milliseconds deadline,
    std::vector<std::chrono::steady_clock::duration>* took = nullptr) {
  std::vector<std::unique_ptr<BeatSockets>> s(static_cast<size_t>(n));
  std::vector<std::chrono::steady_clock::duration> times(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      const auto t0 = std::chrono::steady_clock::now();
      s[size_t(r)] = std::make_unique<BeatSockets>(r, n, ex.for_rank(r), deadline);
      times[size_t(r)] = std::chrono::steady_clock::now() - t0;
    });
  for (std::thread& t : threads) t.join();
  if (took) *took = times;
  return s;
}

// Receives on `s` until `want` beats arrived (or 5 s passed).
std::vector<std::pair<int, Beat>> receive_n(BeatSockets& s, size_t want) {
  std::vector<std::pair<int, Beat>> got;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (got.size() < want && std::chrono::steady_clock::now() < end) {
    for (const auto& b : s.receive()) got.push_back(b);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return got;
}

TEST(BeatSocketsTest, EveryPairConnectsAndBeatsArriveInOrder) {
  const int n = 4;
  ThreadExchange ex(n);
  auto s = connect_ranks(n, ex, std::chrono::seconds(5));
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(s[r]->n_connected(), n - 1) << "rank " << r;
    for (int p = 0; p < n; ++p) EXPECT_EQ(s[r]->connected(p), p != r) << r << " to " << p;
  }
  // Each rank sends three beats; the sender waits for each to leave (one is kept at a time).
  for (int seq = 0; seq < 3; ++seq) {
    for (int r = 0; r < n; ++r) s[r]->send(Beat{seq, 100 * r + seq});
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < n; ++r) {
    const auto got = receive_n(*s[r], size_t(3 * (n - 1)));
    ASSERT_EQ(got.size(), size_t(3 * (n - 1))) << "rank " << r;
    std::vector<int64_t> next(size_t(n), 0);
    for (const auto& [p, beat] : got) {
      EXPECT_EQ(beat.seq, next[size_t(p)]++) << "from " << p << " at " << r;
      EXPECT_EQ(beat.state, 100 * p + beat.seq);
    }
  }
}

// Rank 2's token as rank 0 sees it is forged: rank 2 turns rank 0's hello away. Those two stay
// unconnected, every other pair connects, and setting up takes about the deadline, not more.
TEST(BeatSocketsTest, AWrongTokenLeavesThatPairUnconnected) {
  const int n = 3;
  ThreadExchange ex(n);
  ex.edit = [](int rank, std::vector<std::string>& all) {
    if (rank == 0) all[2] = "12345" + all[2].substr(all[2].find(' '));
  };
  const auto t0 = std::chrono::steady_clock::now();
  auto s = connect_ranks(n, ex, std::chrono::milliseconds(1500));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(4));
  EXPECT_FALSE(s[0]->connected(2));
  EXPECT_FALSE(s[2]->connected(0));
  EXPECT_TRUE(s[0]->connected(1));
  EXPECT_TRUE(s[1]->connected(0));
  EXPECT_TRUE(s[1]->connected(2));
  EXPECT_TRUE(s[2]->connected(1));
}

// Rank 0 is turned away at each of rank 2's addresses in turn; with none left it gives that pair
// up and returns, rather than polling (and closing again and again) the number of the socket it
// closed last, which by then may be another rank's socket, until its deadline.
TEST(BeatSocketsTest, ADialerOutOfAddressesGivesUpWithoutTouchingItsClosedSocket) {
  const int n = 3;
  ThreadExchange ex(n);
  ex.edit = [](int rank, std::vector<std::string>& all) {
    if (rank == 0) all[2] = "12345" + all[2].substr(all[2].find(' '));
  };
  std::vector<std::chrono::steady_clock::duration> took;
  auto s = connect_ranks(n, ex, std::chrono::seconds(4), &took);
  EXPECT_FALSE(s[0]->connected(2));
  EXPECT_TRUE(s[0]->connected(1));
  EXPECT_TRUE(s[1]->connected(2));  // nobody closed these
  EXPECT_TRUE(s[2]->connected(1));
  EXPECT_LT(took[0], std::chrono::seconds(2)) << "rank 0 waited for its deadline";
  EXPECT_GE(took[2], std::chrono::seconds(3)) << "rank 2 waits for rank 0's hello";
}

// A peer that never reads (stopped) fills its socket's buffers: the sender's calls still return
// at once, keeping one beat, and the sender notices when the peer goes away.
TEST(BeatSocketsTest, APeerThatNeverReadsCostsNothingAndItsEndIsNoticed) {
  ThreadExchange ex(2);
  auto s = connect_ranks(2, ex, std::chrono::seconds(5));
  ASSERT_TRUE(s[0]->connected(1));
  for (int i = 0; i < 200000; ++i) s[0]->send(Beat{i, 0});  // returns: never blocks
  EXPECT_TRUE(s[0]->connected(1));
  s[1].reset();  // rank 1 exits
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (s[0]->connected(1) && std::chrono::steady_clock::now() < end) {
    s[0]->receive();
    s[0]->send(Beat{0, 0});
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_FALSE(s[0]->connected(1));
}

}  // namespace
}  // namespace duet
