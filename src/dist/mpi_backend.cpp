#include "dist/mpi_backend.h"

#include <cstdio>
#include <cstdlib>

#include "core/error.h"

#if DUET_HAVE_MPI
// Only MPI's C API: its deprecated C++ bindings do not compile warning-free.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "dist/comm_thread.h"
#include "dist/communicator.h"
#endif

namespace duet {

bool launched_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
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

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  DUET_ERROR(what << ": MPI error: " << std::string(msg, static_cast<size_t>(len)));
}

// Liveness of the other ranks, which a watchdog consults before it gives up on a collective
// (a wait that is reset while the peers prove alive). A thread sends this rank's state to every
// peer each kBeat on a communicator of its own and notes when it last heard from each. A peer
// that is busy — a long prefill while the others wait at the layer's all-to-all, a slower
// model load before the first collective — keeps beating, so the others keep waiting for it;
// a peer that died or was stopped falls silent. The state sent is how long this rank has been
// stuck: waiting in collectives of which none finished (or -1 once one of its waits failed: it
// will not join any more). Once no peer is working — every one stuck for the watchdog time or
// given up — nobody works towards the collectives they wait for (their sequences are out of
// step) and waiting longer would hang.
class Heartbeat {
 public:
  static constexpr std::chrono::milliseconds kBeat{100};

  // Collective: duplicates MPI_COMM_WORLD.
  Heartbeat();
  ~Heartbeat() { stop(); }
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // A wait of this process for a collective begins; it ends with leave_wait, `finished` when
  // its collective completed (progress) rather than failed (this rank gives up for good).
  void enter_wait();
  void leave_wait(bool finished);

  // For a wait that has lasted longer than `watchdog`: why to give up now, or "" while some
  // peer is alive and not stuck (it is working towards the collective).
  std::string verdict(std::chrono::milliseconds watchdog);

  // Stops the thread and frees the communicator; local. Returns false if a message could not
  // finish (to a dead or stopped peer): then it stays pending and MPI_Finalize must not run.
  bool stop();

 private:
  void loop();
  // One beat: takes what arrived, then sends the current state to every peer whose previous
  // message has left. Only on the thread.
  void exchange();
  int64_t stuck_ms(Clock::time_point now) const;  // REQUIRES: mu_ held

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;                     // GUARDED_BY(mu_)
  int n_waiting_ = 0;                     // GUARDED_BY(mu_) waits in progress in this process
  bool gave_up_ = false;                  // GUARDED_BY(mu_) a wait failed
  Clock::time_point stuck_since_;         // GUARDED_BY(mu_) last progress, while n_waiting_ > 0
  std::vector<Clock::time_point> heard_;  // GUARDED_BY(mu_) [size] last message from each rank
  std::vector<int64_t> peer_stuck_ms_;    // GUARDED_BY(mu_) [size] the state in that message
  // Only the thread (and the destructor after joining it) touches these.
  std::vector<int64_t> send_buf_, recv_buf_;      // [size] one message per peer in flight
  std::vector<MPI_Request> send_req_, recv_req_;  // [size]
  std::vector<char> broken_;                      // [size] peers whose MPI calls failed
  bool clean_ = true;                             // stop()'s answer, once stopped
  std::thread thread_;                            // last: starts after the fields above
};

Heartbeat::Heartbeat() {
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  const size_t n = static_cast<size_t>(size_);
  heard_.assign(n, Clock::now());
  peer_stuck_ms_.assign(n, 0);
  send_buf_.assign(n, 0);
  recv_buf_.assign(n, 0);
  send_req_.assign(n, MPI_REQUEST_NULL);
  recv_req_.assign(n, MPI_REQUEST_NULL);
  broken_.assign(n, 0);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    if (MPI_Irecv(&recv_buf_[p], 1, MPI_INT64_T, p, 0, comm_, &recv_req_[p]) != MPI_SUCCESS)
      broken_[p] = 1;
  }
  thread_ = std::thread([this] { loop(); });
}

bool Heartbeat::stop() {
  if (!thread_.joinable()) return clean_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  // Receives are cancelled; sends normally leave at once (a few bytes, sent eagerly). What is
  // still pending after a grace goes to a dead or stopped peer.
  for (MPI_Request& r : recv_req_)
    if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
  const Clock::time_point deadline = Clock::now() + 5 * kBeat;
  bool pending = true;
  while (pending && Clock::now() < deadline) {
    pending = false;
    for (std::vector<MPI_Request>* reqs : {&recv_req_, &send_req_}) {
      for (MPI_Request& r : *reqs) {
        int done = 1;
        if (r != MPI_REQUEST_NULL && MPI_Test(&r, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
          r = MPI_REQUEST_NULL;  // failed: nothing left to wait for
          done = 1;
        }
        pending |= !done;
      }
    }
    if (pending) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  clean_ = !pending;
  if (clean_) MPI_Comm_free(&comm_);
  return clean_;
}

void Heartbeat::enter_wait() {
  std::lock_guard<std::mutex> lock(mu_);
  if (n_waiting_++ == 0) stuck_since_ = Clock::now();
}

void Heartbeat::leave_wait(bool finished) {
  std::lock_guard<std::mutex> lock(mu_);
  --n_waiting_;
  if (finished) stuck_since_ = Clock::now();
  gave_up_ |= !finished;
}

int64_t Heartbeat::stuck_ms(Clock::time_point now) const {
  if (gave_up_) return -1;
  if (n_waiting_ == 0) return 0;
  return std::chrono::duration_cast<std::chrono::milliseconds>(now - stuck_since_).count();
}

std::string Heartbeat::verdict(std::chrono::milliseconds watchdog) {
  // A beat may come late on a loaded host: silence counts only past a few beats.
  const std::chrono::milliseconds silence = std::max(watchdog, 5 * kBeat);
  const Clock::time_point now = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> silent, gave_up;
  bool working = false;
  int64_t longest_ms = 0;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const int64_t age_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(now - heard_[p]).count();
    if (age_ms > silence.count()) {
      silent.push_back(p);
      longest_ms = std::max(longest_ms, age_ms);
      continue;
    }
    if (peer_stuck_ms_[p] < 0) {
      gave_up.push_back(p);
      continue;
    }
    const int64_t stuck = peer_stuck_ms_[p] > 0 ? peer_stuck_ms_[p] + age_ms : 0;
    working |= stuck < watchdog.count();
  }
  std::ostringstream why;
  const auto list = [&why](const std::vector<int>& ranks) {
    why << (ranks.size() == 1 ? "rank " : "ranks ");
    for (size_t i = 0; i < ranks.size(); ++i) why << (i ? ", " : "") << ranks[i];
  };
  if (!silent.empty()) {
    list(silent);
    why << " sent no heartbeat for " << longest_ms << " ms: died or stopped answering";
  } else if (working) {
    return "";
  } else if (!gave_up.empty()) {
    list(gave_up);
    why << " gave up after a failed collective";
  } else {
    why << "every rank has waited over " << watchdog.count()
        << " ms in collectives that do not finish: the ranks' collectives are out of step";
  }
  return why.str();
}

void Heartbeat::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    exchange();
    lock.lock();
    cv_.wait_for(lock, kBeat, [this] { return stop_; });
  }
}

void Heartbeat::exchange() {
  std::vector<std::pair<int, int64_t>> got;  // (peer, its stuck ms) taken this beat
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || broken_[p]) continue;
    // Every message that arrived, not one per beat, so that a backlog never shows old state.
    for (;;) {
      int done = 0;
      if (MPI_Test(&recv_req_[p], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        broken_[p] = 1;
        break;
      }
      if (!done) break;
      got.emplace_back(p, recv_buf_[p]);
      if (MPI_Irecv(&recv_buf_[p], 1, MPI_INT64_T, p, 0, comm_, &recv_req_[p]) != MPI_SUCCESS) {
        broken_[p] = 1;
        break;
      }
    }
  }
  const Clock::time_point now = Clock::now();
  int64_t mine = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [p, stuck] : got) {
      heard_[p] = now;
      peer_stuck_ms_[p] = stuck;
    }
    mine = stuck_ms(now);
  }
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || broken_[p]) continue;
    int done = 1;
    if (send_req_[p] != MPI_REQUEST_NULL &&
        MPI_Test(&send_req_[p], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
      broken_[p] = 1;
      continue;
    }
    if (!done) continue;  // a slow or dead peer: never more than one message queued for it
    send_buf_[p] = mine;
    if (MPI_Isend(&send_buf_[p], 1, MPI_INT64_T, p, 0, comm_, &send_req_[p]) != MPI_SUCCESS)
      broken_[p] = 1;
  }
}

// MPI for the whole process: initialised once, finalised at exit (aborted if a watchdog gave
// up on a collective).
class MpiRuntime {
 public:
  MpiRuntime() {
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (initialised) return;
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
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
  // rank makes its first context at the same point), then only a lookup.
  Heartbeat& heartbeat() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!heartbeat_) heartbeat_ = std::make_unique<Heartbeat>();
    return *heartbeat_;
  }

 private:
  bool owns_ = false;
  std::mutex mu_;
  int n_abandoned_ = 0;                   // GUARDED_BY(mu_)
  std::unique_ptr<Heartbeat> heartbeat_;  // GUARDED_BY(mu_) while created
};

MpiRuntime& runtime() {
  static MpiRuntime rt;
  return rt;
}

// A duplicate of MPI_COMM_WORLD whose errors return instead of aborting, and the poll loop that
// waits on its requests without spinning.
class MpiChannel {
 public:
  MpiChannel(std::chrono::milliseconds watchdog)
      : watchdog_(watchdog), heartbeat_(runtime().heartbeat()) {
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
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
  // runs before the body reads *req_out). Sleeps from 2 us up to 200 us between tests: the
  // thread gives its core away while it waits, at the price of that much added latency.
  // Past the watchdog time it asks the heartbeat, every few milliseconds, whether to give up:
  // not while a peer is alive and working (a long prefill there), at once when one is silent.
  void wait(MPI_Request* req_out, const char* what, int rc) {
    MPI_Request req = *req_out;
    check_mpi(rc, what);
    const Clock::time_point t0 = Clock::now();
    Clock::time_point next_verdict = t0 + watchdog_;
    auto nap = std::chrono::microseconds(2);
    heartbeat_.enter_wait();
    struct Leave {
      Heartbeat& hb;
      bool finished = false;
      ~Leave() { hb.leave_wait(finished); }
    } leave{heartbeat_};
    for (;;) {
      int done = 0;
      check_mpi(MPI_Test(&req, &done, MPI_STATUS_IGNORE), what);
      if (done) {
        leave.finished = true;
        return;
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
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(200));
    }
  }

 private:
  std::chrono::milliseconds watchdog_;
  Heartbeat& heartbeat_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  bool healthy_ = true;  // only the owning thread touches the channel
};

int to_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX) DUET_ERROR(what << ": " << v << " bytes exceed MPI's int counts");
  return static_cast<int>(v);
}

class MpiCoordinator final : public Coordinator {
 public:
  MpiCoordinator(const RankInfo& info, std::chrono::milliseconds watchdog)
      : Coordinator(info), ch_(watchdog) {}

  void broadcast(std::string& bytes, int src) override {
    int64_t n = static_cast<int64_t>(bytes.size());
    MPI_Request req = MPI_REQUEST_NULL;
    ch_.wait(&req, "broadcast (size)", MPI_Ibcast(&n, 1, MPI_INT64_T, src, ch_.comm(), &req));
    bytes.resize(static_cast<size_t>(n));
    ch_.wait(&req, "broadcast",
             MPI_Ibcast(bytes.data(), to_int(n, "broadcast"), MPI_BYTE, src, ch_.comm(), &req));
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

 private:
  MpiChannel ch_;
};

class MpiOps final : public CollectiveOps {
 public:
  explicit MpiOps(std::chrono::milliseconds watchdog) : ch_(watchdog) {}

  int rank() const override { return ch_.rank(); }
  int world_size() const override { return ch_.size(); }

  void all_to_all_v(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                    const std::vector<int64_t>& recv_bytes) override {
    const int n = ch_.size();
    sc_.resize(n), sd_.resize(n), rc_.resize(n), rd_.resize(n);
    int64_t so = 0, ro = 0;
    for (int r = 0; r < n; ++r) {
      sc_[r] = to_int(send_bytes[r], "all_to_all_v"), sd_[r] = to_int(so, "all_to_all_v");
      rc_[r] = to_int(recv_bytes[r], "all_to_all_v"), rd_[r] = to_int(ro, "all_to_all_v");
      so += send_bytes[r], ro += recv_bytes[r];
    }
    MPI_Request req = MPI_REQUEST_NULL;
    ch_.wait(&req, "all_to_all_v",
             MPI_Ialltoallv(send, sc_.data(), sd_.data(), MPI_BYTE, recv, rc_.data(), rd_.data(),
                            MPI_BYTE, ch_.comm(), &req));
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
  std::vector<int> sc_, sd_, rc_, rd_;  // [world_size] counts and displacements, reused
};

RankInfo rank_info() {
  RankInfo info;
  MPI_Comm_rank(MPI_COMM_WORLD, &info.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &info.world_size);
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
  runtime();
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
