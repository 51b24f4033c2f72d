#include "dist/mpi_backend.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/error.h"

#if DUET_HAVE_MPI
#include <sys/prctl.h>

#include <algorithm>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "dist/comm_thread.h"
#include "dist/communicator.h"
#include "dist/mpi_heartbeat.h"
#include "dist/mpi_util.h"
#endif

namespace duet {

bool launched_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
}

const std::vector<MpiParam>& mpi_tcp_defaults() {
  // Open MPI's TCP transport sends a message larger than btl_tcp_eager_limit (64 KiB by default)
  // by rendezvous: a first fragment, then the rest once the receiver has answered, at most three
  // fragments of btl_tcp_max_send_size (128 KiB) in flight. Every dispatch and combine message of
  // a decode step (hundreds of KiB) then waits a round trip, behind whatever the link has queued.
  // Sent eagerly instead, on 2 emulated hosts at 200 Mbit/s (qwen3_moe small, 128 sequences per
  // rank), TBO's transfers took 5.7 s where they had taken 8.2 s, and TBO's gain over no overlap
  // rose from 1.17x to 1.29x. The receiver buffers a message that arrives before its receive is
  // posted, which is at most one step's rows here.
  static const std::vector<MpiParam> params = {
      {"OMPI_MCA_btl_tcp_eager_limit", "4194304"},
      {"OMPI_MCA_btl_tcp_rndv_eager_limit", "4194304"},
      {"OMPI_MCA_btl_tcp_max_send_size", "4194304"},
  };
  return params;
}

void apply_mpi_tcp_defaults() {
  for (const MpiParam& p : mpi_tcp_defaults()) ::setenv(p.name, p.value, /*overwrite=*/0);
}

#if !DUET_HAVE_MPI

bool mpi_available() {
  return false;
}

DistContext make_mpi_context(std::chrono::milliseconds) {
  DUET_ERROR(
      "--distributed-backend mpi: duet was built without MPI (install openmpi-bin and "
      "libopenmpi-dev, then rebuild)");
}

[[noreturn]] void mpi_abort(const std::string& why) {
  std::fprintf(stderr, "error: %s\n", why.c_str());
  std::exit(1);
}

#else

bool mpi_available() {
  return true;
}

namespace {

using Clock = std::chrono::steady_clock;

// MPI_Init_thread, ended with a clear error if it has not returned after `deadline`: MPI's
// start waits for every rank of the job (Open MPI's PMIx fence), so a rank stopped or hung
// before it would hold the others there for ever, and neither mpirun nor duet's watchdogs
// (which need MPI started) would notice. The process exits: MPI cannot be used any more.
int init_mpi_within(std::chrono::milliseconds deadline) {
  std::mutex mu;
  std::condition_variable cv;
  bool started = false;
  std::thread guard([&] {
    std::unique_lock<std::mutex> lock(mu);
    if (cv.wait_for(lock, deadline, [&] { return started; })) return;
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    std::fprintf(stderr,
                 "error: start-up: rank %s: MPI did not start within %.1f s (MPI_Init waits for "
                 "every rank of the job): a rank died, stopped or hangs before starting MPI, or "
                 "the hosts cannot reach each other\n",
                 rank ? rank : "?", deadline.count() / 1000.0);
    std::fflush(stderr);
    std::_Exit(1);
  });
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  {
    std::lock_guard<std::mutex> lock(mu);
    started = true;
  }
  cv.notify_all();
  guard.join();
  return provided;
}

// MPI for the whole process: initialised once (given up after init_deadline), finalised at exit
// (aborted if a watchdog gave up on a collective).
class MpiRuntime {
 public:
  explicit MpiRuntime(std::chrono::milliseconds init_deadline) {
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (initialised) return;
    apply_mpi_tcp_defaults();
    const int provided = init_mpi_within(init_deadline);
    owns_ = true;
    if (provided < MPI_THREAD_MULTIPLE) {
      MPI_Finalize();
      owns_ = false;
      DUET_ERROR("the MPI library does not provide MPI_THREAD_MULTIPLE (got level " << provided
                                                                                    << ")");
    }
  }

  ~MpiRuntime() {
    if (!owns_) return;
    // The heartbeat's messages to a dead peer never leave: abandoned too.
    bool stuck = heartbeat_ && !heartbeat_->stop();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stuck |= n_abandoned_ > 0;
    }
    // A collective given up by a watchdog may still write into freed buffers and would make
    // MPI_Finalize wait for the dead peer: the job ends with MPI_Abort instead.
    if (stuck) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Finalize();
  }

  // Notes a request given up by a watchdog (never completed, never freed).
  void abandon() {
    std::lock_guard<std::mutex> lock(mu_);
    ++n_abandoned_;
  }

  // The process's heartbeat, started by the first call. Collective on the first call (every
  // rank makes its first context at the same point), then only a lookup. The first call gives
  // up after kStartupWatchdogs × watchdog if a rank never joins.
  MpiHeartbeat& heartbeat(std::chrono::milliseconds watchdog) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!heartbeat_) {
      bool abandoned = false;
      try {
        heartbeat_ = std::make_unique<MpiHeartbeat>(kStartupWatchdogs * watchdog, &abandoned);
      } catch (...) {
        n_abandoned_ += abandoned;
        throw;
      }
    }
    return *heartbeat_;
  }

 private:
  bool owns_ = false;
  std::mutex mu_;
  int n_abandoned_ = 0;                      // GUARDED_BY(mu_)
  std::unique_ptr<MpiHeartbeat> heartbeat_;  // GUARDED_BY(mu_) while created
};

// The process's MPI, started by the first call (which waits kStartupWatchdogs × watchdog at most
// for the other ranks, as the start-up collectives after it do).
MpiRuntime& runtime(std::chrono::milliseconds watchdog = kMpiWatchdog) {
  static MpiRuntime rt(kStartupWatchdogs * watchdog);
  return rt;
}

// The naps of MpiChannel's waits last about what they ask only with a fine timer slack: Linux's
// default 50 us stretched a 2 us nap to ~70 us on the Zen 4 VM (measured), and the control
// plane's collectives, which the engine thread waits for every step on several ranks, paid that
// per nap (plain scheduler, `tiny`, 2 MPI ranks: twice the decode tok/s with it). Set once on
// each thread that waits here: the engine thread, the communication thread (the all-to-alls).
void use_fine_timer_slack() {
  thread_local const bool set = (::prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0), true);
  (void)set;
}

// MpiChannel::wait_all naps briefly for this long, then longer.
constexpr std::chrono::milliseconds kYoungWait{2};

// MpiCoordinator::broadcast: the bytes that travel with the size in its first round.
constexpr int64_t kInlineBroadcast = 4096 - static_cast<int64_t>(sizeof(int64_t));

// A duplicate of MPI_COMM_WORLD whose errors return instead of aborting, and the poll loop that
// waits on its requests without spinning.
class MpiChannel {
 public:
  MpiChannel(std::chrono::milliseconds watchdog)
      : watchdog_(watchdog), heartbeat_(runtime().heartbeat(watchdog)) {
    bool abandoned = false;
    try {
      comm_ = dup_world("a channel's communicator", kStartupWatchdogs * watchdog, &abandoned);
    } catch (...) {
      if (abandoned) runtime().abandon();
      throw;
    }
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiChannel() {
    if (healthy_) MPI_Comm_free(&comm_);
  }

  MPI_Comm comm() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Waits for *req_out, which the call that returned `rc` has just posted (an argument, so it
  // runs before the body reads *req_out). Sleeps from 2 us up to 20 us between tests for the
  // first kYoungWait of a wait whose result is awaited (CommThread::awaited), then up to 200 us:
  // the thread gives its core away while it waits, at the price of that much added latency. A
  // transfer that no one awaits yet (the communication thread's, posted ahead while the caller
  // computes: single-batch overlap's chunks, the other micro-batch's all-to-all) naps up to
  // 200 us from the start, until a handle starts waiting for it.
  // Past the watchdog time it asks the heartbeat, every few milliseconds, whether to give up:
  // not while a peer is alive and working (a long prefill there), at once when one is silent.
  void wait(MPI_Request* req_out, const char* what, int rc) {
    check_mpi(rc, what);
    wait_all(req_out, 1, what);
  }

  // Waits for reqs[0, n), all posted already, the same way. Each request that completes while
  // others remain tells the heartbeat that this wait moves (a large transfer posted in chunks
  // shows it is flowing, however long the whole takes on a slow link).
  //
  // `then`, if given, is called for each request that completes, with its index and status; it
  // may post a follow-up into *next (a transfer's next chunk), which takes the finished one's
  // place and is waited for too.
  // A template, not std::function: the all-to-alls call it every layer.
  void wait_all(MPI_Request* reqs, int n, const char* what) {
    wait_all(reqs, n, what, [](int, const MPI_Status&, MPI_Request*) {});
  }
  template <class Then>
  void wait_all(MPI_Request* reqs, int n, const char* what, const Then& then) {
    use_fine_timer_slack();
    const Clock::time_point t0 = Clock::now();
    Clock::time_point next_verdict = t0 + watchdog_;
    auto nap = std::chrono::microseconds(2);
    bool awaited = CommThread::awaited();
    Clock::time_point awaited_since = t0;
    heartbeat_.enter_wait();
    struct Leave {
      MpiHeartbeat& hb;
      bool finished = false;
      ~Leave() { hb.leave_wait(finished); }
    } leave{heartbeat_};
    statuses(n);
    indices_.resize(static_cast<size_t>(n));
    some_.resize(static_cast<size_t>(n));
    int left = 0;
    for (int i = 0; i < n; ++i) left += reqs[i] != MPI_REQUEST_NULL;
    for (;;) {
      int got = 0;
      if (left > 0) {
        check_mpi(MPI_Testsome(n, reqs, &got, indices_.data(), some_.data()), what);
        if (got == MPI_UNDEFINED) got = 0, left = 0;  // none active: every request is done
        for (int i = 0; i < got; ++i) statuses_[size_t(indices_[i])] = some_[size_t(i)];
        left -= got;
        for (int i = 0; i < got; ++i) {
          const int k = indices_[size_t(i)];
          then(k, statuses_[size_t(k)], &reqs[k]);
          left += reqs[k] != MPI_REQUEST_NULL;
        }
      }
      if (left == 0) {
        leave.finished = true;
        return;
      }
      if (got > 0) {
        heartbeat_.progress();
        next_verdict = Clock::now() + watchdog_;
        nap = std::chrono::microseconds(2);
        continue;
      }
      CommThread::keepalive();  // this wait's own watchdog is in charge
      const Clock::time_point now = Clock::now();
      if (now >= next_verdict) {
        next_verdict = now + std::chrono::milliseconds(10);
        const std::string why = heartbeat_.verdict(watchdog_);
        if (!why.empty()) {
          healthy_ = false;
          runtime().abandon();
          DUET_ERROR(what << ": rank " << rank_ << " of " << size_ << " waited "
                          << std::chrono::duration_cast<std::chrono::milliseconds>(now - t0).count()
                          << " ms for its peers; " << why);
        }
      }
      CommThread::nap(nap);
      // Most waits end within a millisecond (the control plane's messages, a decode step's
      // all-to-alls): naps of at most 20 us while the awaited wait is young, as a longer one
      // overshoots its end (plain scheduler, `tiny`, 2 ranks across an emulated 1 Gbit/s link:
      // 3.5x the decode tok/s against a 200 us cap, measured); then up to 200 us, to spare the
      // core. Unawaited, the short naps' wake-ups took the core from the computation beside
      // them for nothing (single-batch overlap, qwen3_moe `small`, 2 emulated hosts at 1 Gbit/s,
      // 32 sequences per rank: 1.02-1.06x no overlap with them, 1.10-1.11x without; the
      // communication thread's CPU 0.41-0.52 s a run against 0.36 s).
      if (!awaited && CommThread::awaited()) {
        awaited = true;
        awaited_since = Clock::now();
        nap = std::chrono::microseconds(2);
        continue;
      }
      const auto cap = awaited && now - awaited_since < kYoungWait ? std::chrono::microseconds(20)
                                                                   : std::chrono::microseconds(200);
      nap = std::min(nap * 2, cap);
    }
  }

 private:
  MPI_Status* statuses(int n) {
    statuses_.resize(static_cast<size_t>(n));
    return statuses_.data();
  }

  std::vector<MPI_Status> statuses_;
  std::vector<int> indices_;      // wait_all's MPI_Testsome output, reused
  std::vector<MPI_Status> some_;  // [n] its statuses, in completion order
  std::chrono::milliseconds watchdog_;
  MpiHeartbeat& heartbeat_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  bool healthy_ = true;  // only the owning thread touches the channel
};

// The largest message all_to_all_v posts: larger parts travel as several, so that a wait on a
// slow link sees chunks complete (1 MiB: 0.1 s at 100 Mbit/s; below the 4 MiB that Open MPI's
// TCP transport sends eagerly, mpi_tcp_defaults).
constexpr int64_t kChunkBytes = int64_t(1) << 20;

int to_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX) DUET_ERROR(what << ": " << v << " bytes exceed MPI's int counts");
  return static_cast<int>(v);
}

class MpiCoordinator final : public Coordinator {
 public:
  MpiCoordinator(const RankInfo& info, std::chrono::milliseconds watchdog)
      : Coordinator(info), ch_(watchdog) {}

  // One round for a small message: its size and its first kInlineBroadcast bytes travel
  // together in a fixed-size block, and only a longer message's rest takes a second round. The
  // serving engine's control messages and decode outputs fit (tens of bytes to a few KB), and on
  // several ranks they are broadcast every step: across a network each round is a round trip.
  void broadcast(std::string& bytes, int src) override {
    int64_t n = static_cast<int64_t>(bytes.size());
    char head[sizeof(int64_t) + kInlineBroadcast];
    const int64_t inline_n = std::min<int64_t>(n, kInlineBroadcast);
    if (rank() == src) {
      std::memcpy(head, &n, sizeof n);
      std::memcpy(head + sizeof n, bytes.data(), static_cast<size_t>(inline_n));
    }
    MPI_Request req = MPI_REQUEST_NULL;
    ch_.wait(&req, "broadcast",
             MPI_Ibcast(head, static_cast<int>(sizeof head), MPI_BYTE, src, ch_.comm(), &req));
    if (rank() != src) {
      std::memcpy(&n, head, sizeof n);
      bytes.assign(head + sizeof n, static_cast<size_t>(std::min<int64_t>(n, kInlineBroadcast)));
      bytes.resize(static_cast<size_t>(n));
    }
    if (n <= kInlineBroadcast) return;
    ch_.wait(&req, "broadcast (rest)",
             MPI_Ibcast(bytes.data() + kInlineBroadcast, to_int(n - kInlineBroadcast, "broadcast"),
                        MPI_BYTE, src, ch_.comm(), &req));
  }

  void barrier() override {
    MPI_Request req = MPI_REQUEST_NULL;
    ch_.wait(&req, "barrier", MPI_Ibarrier(ch_.comm(), &req));
  }

  std::vector<int64_t> all_gather(const std::vector<int64_t>& values) override {
    std::vector<int64_t> out(values.size() * static_cast<size_t>(world_size()));
    MPI_Request req = MPI_REQUEST_NULL;
    ch_.wait(&req, "all_gather(coordinator)",
             MPI_Iallgather(values.data(), static_cast<int>(values.size()), MPI_INT64_T, out.data(),
                            static_cast<int>(values.size()), MPI_INT64_T, ch_.comm(), &req));
    return out;
  }

  // One round for small messages, as broadcast: each rank's size and first kInlineBroadcast
  // bytes in a fixed-size block; the rests of longer ones, if any, in a second round.
  std::vector<std::string> all_gather_bytes(const std::string& bytes) override {
    constexpr size_t kBlock = sizeof(int64_t) + kInlineBroadcast;
    const size_t world = static_cast<size_t>(world_size());
    const int64_t n = static_cast<int64_t>(bytes.size());
    std::vector<char> mine(kBlock), heads(kBlock * world);  // [world, kBlock]
    std::memcpy(mine.data(), &n, sizeof n);
    std::memcpy(mine.data() + sizeof n, bytes.data(),
                static_cast<size_t>(std::min<int64_t>(n, kInlineBroadcast)));
    MPI_Request req = MPI_REQUEST_NULL;
    ch_.wait(&req, "all_gather_bytes",
             MPI_Iallgather(mine.data(), static_cast<int>(kBlock), MPI_BYTE, heads.data(),
                            static_cast<int>(kBlock), MPI_BYTE, ch_.comm(), &req));
    std::vector<std::string> out(world);
    std::vector<int> rest(world), at(world);
    int64_t total_rest = 0;
    for (size_t r = 0; r < world; ++r) {
      int64_t len = 0;
      std::memcpy(&len, heads.data() + r * kBlock, sizeof len);
      if (len < 0) DUET_ERROR("all_gather_bytes: rank " << r << " sent a size of " << len);
      out[r].assign(heads.data() + r * kBlock + sizeof len,
                    static_cast<size_t>(std::min<int64_t>(len, kInlineBroadcast)));
      rest[r] = to_int(std::max<int64_t>(0, len - kInlineBroadcast), "all_gather_bytes");
      at[r] = to_int(total_rest, "all_gather_bytes");
      total_rest += rest[r];
    }
    if (total_rest == 0) return out;
    std::vector<char> rests(static_cast<size_t>(total_rest));
    const int me = rank();
    ch_.wait(
        &req, "all_gather_bytes (rest)",
        MPI_Iallgatherv(bytes.data() + std::min<int64_t>(n, kInlineBroadcast), rest[me], MPI_BYTE,
                        rests.data(), rest.data(), at.data(), MPI_BYTE, ch_.comm(), &req));
    for (size_t r = 0; r < world; ++r)
      out[r].append(rests.data() + at[r], static_cast<size_t>(rest[r]));
    return out;
  }

 private:
  MpiChannel ch_;
};

class MpiOps final : public CollectiveOps {
 public:
  explicit MpiOps(std::chrono::milliseconds watchdog) : ch_(watchdog) {}

  int rank() const override { return ch_.rank(); }
  int world_size() const override { return ch_.size(); }

  // Point to point in chunks of at most kChunkBytes, every receive and send posted at once (the
  // peers in ring order from this rank); this rank's own part is copied. Each chunk completes on
  // its own, which the wait reports as progress: a transfer that takes longer than the watchdog
  // time on a slow link is not taken for ranks out of step while its chunks keep arriving.
  // Messages between two ranks on one tag arrive in the order sent, so chunk i meets receive i.
  void all_to_all_v(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                    const std::vector<int64_t>& recv_bytes) override {
    constexpr int kTag = 12;
    const int n = ch_.size();
    const int me = ch_.rank();
    std::vector<int64_t>& so = send_off_;
    std::vector<int64_t>& ro = recv_off_;
    so.assign(size_t(n) + 1, 0), ro.assign(size_t(n) + 1, 0);
    for (int r = 0; r < n; ++r) {
      so[r + 1] = so[r] + send_bytes[r];
      ro[r + 1] = ro[r] + recv_bytes[r];
    }
    DUET_CHECK(send_bytes[me] == recv_bytes[me], "all_to_all_v: " << send_bytes[me]
                                                                  << " bytes to itself, "
                                                                  << recv_bytes[me] << " expected");
    reqs_.clear();
    const auto post = [&](bool receive, int r) {
      uint8_t* base = receive ? static_cast<uint8_t*>(recv) + ro[r]
                              : static_cast<uint8_t*>(const_cast<void*>(send)) + so[r];
      const int64_t bytes = receive ? recv_bytes[r] : send_bytes[r];
      for (int64_t off = 0; off < bytes; off += kChunkBytes) {
        const int len = static_cast<int>(std::min(kChunkBytes, bytes - off));
        MPI_Request req = MPI_REQUEST_NULL;
        check_mpi(receive ? MPI_Irecv(base + off, len, MPI_BYTE, r, kTag, ch_.comm(), &req)
                          : MPI_Isend(base + off, len, MPI_BYTE, r, kTag, ch_.comm(), &req),
                  receive ? "all_to_all_v (receive)" : "all_to_all_v (send)");
        reqs_.push_back(req);
      }
    };
    for (int i = 1; i < n; ++i) post(true, (me + n - i) % n);
    for (int i = 1; i < n; ++i) post(false, (me + i) % n);
    if (send_bytes[me] > 0)
      std::memcpy(static_cast<uint8_t*>(recv) + ro[me], static_cast<const uint8_t*>(send) + so[me],
                  size_t(send_bytes[me]));
    ch_.wait_all(reqs_.data(), static_cast<int>(reqs_.size()), "all_to_all_v");
  }

  // Point to point on the data communicator, every receive and send posted at once, the
  // lengths unknown to the receivers. A part below kChunkBytes is one message (low_latency's
  // decode steps); a longer one travels as chunks of kChunkBytes ended by a shorter one
  // (possibly empty), and the receiver posts each next chunk's receive when the previous one
  // arrives full, so that the wait sees progress on a slow link (see all_to_all_v).
  void all_to_all_bounded(const void* send, const std::vector<int64_t>& send_bytes,
                          const std::vector<int64_t>& send_room, void* recv,
                          const std::vector<int64_t>& recv_capacity,
                          std::vector<int64_t>* recv_bytes) override {
    constexpr int kTag = 11;
    const int n = ch_.size();
    reqs_.assign(static_cast<size_t>(n), MPI_REQUEST_NULL);  // one receive per rank, then sends
    recv_bytes->assign(static_cast<size_t>(n), 0);
    std::vector<int64_t>& ro = recv_off_;  // where each rank's part starts in recv
    ro.assign(size_t(n), 0);
    for (int r = 1; r < n; ++r) ro[r] = ro[r - 1] + recv_capacity[r - 1];
    const auto post_receive = [&](int r, MPI_Request* req) {
      const int64_t room = recv_capacity[r] - (*recv_bytes)[r];
      check_mpi(MPI_Irecv(static_cast<uint8_t*>(recv) + ro[r] + (*recv_bytes)[r],
                          to_int(std::min(room, kChunkBytes), "all_to_all_bounded"), MPI_BYTE, r,
                          kTag, ch_.comm(), req),
                "all_to_all_bounded (receive)");
    };
    for (int r = 0; r < n; ++r) post_receive(r, &reqs_[r]);
    int64_t so = 0;
    for (int r = 0; r < n; ++r) {
      const uint8_t* base = static_cast<const uint8_t*>(send) + so;
      // Full chunks, then the part left (< kChunkBytes, possibly empty) that ends the transfer.
      for (int64_t off = 0;; off += kChunkBytes) {
        const int64_t len = std::min(kChunkBytes, send_bytes[r] - off);
        MPI_Request req = MPI_REQUEST_NULL;
        check_mpi(MPI_Isend(base + off, to_int(len, "all_to_all_bounded"), MPI_BYTE, r, kTag,
                            ch_.comm(), &req),
                  "all_to_all_bounded (send)");
        reqs_.push_back(req);
        if (len < kChunkBytes) break;
      }
      so += send_room[r];
    }
    ch_.wait_all(reqs_.data(), static_cast<int>(reqs_.size()), "all_to_all_bounded",
                 [&](int i, const MPI_Status& status, MPI_Request* next) {
                   if (i >= n) return;  // a send
                   int count = 0;
                   MPI_Get_count(&status, MPI_BYTE, &count);
                   (*recv_bytes)[i] += count;
                   if (count == kChunkBytes) post_receive(i, next);  // more follows
                 });
  }

  void all_gather(const void* send, int64_t bytes, void* recv) override {
    const int b = to_int(bytes, "all_gather");
    MPI_Request req = MPI_REQUEST_NULL;
    ch_.wait(&req, "all_gather",
             MPI_Iallgather(send, b, MPI_BYTE, recv, b, MPI_BYTE, ch_.comm(), &req));
  }

  void all_reduce(void* data, int64_t count, ElemType type, ReduceOp op) override {
    MPI_Request req = MPI_REQUEST_NULL;
    ch_.wait(&req, "all_reduce",
             MPI_Iallreduce(MPI_IN_PLACE, data, to_int(count, "all_reduce"),
                            type == ElemType::kF32 ? MPI_FLOAT : MPI_INT64_T,
                            op == ReduceOp::kSum ? MPI_SUM : MPI_MAX, ch_.comm(), &req));
  }

 private:
  MpiChannel ch_;
  std::vector<MPI_Request> reqs_;             // the all-to-alls' requests, reused
  std::vector<int64_t> send_off_, recv_off_;  // [world_size + 1] their parts' offsets, reused
};

RankInfo rank_info() {
  RankInfo info;
  MPI_Comm_rank(MPI_COMM_WORLD, &info.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &info.world_size);
  // Open MPI's launcher says where this rank sits on its host; asking MPI instead is a blocking
  // collective (MPI_Comm_split_type), which would hang if a rank died before it.
  const char* local_rank = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const char* local_size = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (local_rank && local_size) {
    info.local_rank = std::atoi(local_rank);
    info.local_world_size = std::atoi(local_size);
    return info;
  }
  MPI_Comm node;
  check_mpi(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, info.rank, MPI_INFO_NULL, &node),
      "MPI_Comm_split_type");
  MPI_Comm_rank(node, &info.local_rank);
  MPI_Comm_size(node, &info.local_world_size);
  MPI_Comm_free(&node);
  return info;
}

}  // namespace

DistContext make_mpi_context(std::chrono::milliseconds watchdog) {
  runtime(watchdog);
  DistContext ctx;
  ctx.coordinator = std::make_unique<MpiCoordinator>(rank_info(), watchdog);
  ctx.communicator = std::make_unique<Communicator>(std::make_unique<MpiOps>(watchdog), watchdog);
  return ctx;
}

[[noreturn]] void mpi_abort(const std::string& why) {
  int initialised = 0, rank = 0;
  MPI_Initialized(&initialised);
  if (initialised) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "error: rank %d: %s\n", rank, why.c_str());
  std::fflush(stderr);
  if (initialised) MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

#endif  // DUET_HAVE_MPI

}  // namespace duet
