#include "dist/mpi_heartbeat.h"

#if DUET_HAVE_MPI
#include <algorithm>
#include <sstream>
#include <utility>

namespace duet {

namespace {

// Every rank's `mine`, in rank order (MPI_Iallgather of the lengths, then of the bytes), giving
// up like the other start-up collectives.
std::vector<std::string> allgather_strings(MPI_Comm comm, const std::string& mine,
                                           std::chrono::milliseconds deadline, bool* abandoned) {
  const char* what = "the heartbeat's socket addresses";
  int size = 0;
  MPI_Comm_size(comm, &size);
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(size_t(size), 0);
  MPI_Request req = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm, &req), what);
  wait_within(&req, what, deadline, abandoned);
  std::vector<int> offsets(size_t(size), 0);
  for (int r = 1; r < size; ++r) offsets[r] = offsets[r - 1] + lens[r - 1];
  std::string all(size_t(offsets[size - 1] + lens[size - 1]), '\0');
  check_mpi(MPI_Iallgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(),
                            MPI_CHAR, comm, &req),
            what);
  wait_within(&req, what, deadline, abandoned);
  std::vector<std::string> out;
  for (int r = 0; r < size; ++r) out.push_back(all.substr(size_t(offsets[r]), size_t(lens[r])));
  return out;
}

// An MPI message of one Beat.
constexpr int kBeatWords = sizeof(Beat) / sizeof(int64_t);

}  // namespace

MpiHeartbeat::MpiHeartbeat(std::chrono::milliseconds startup_deadline, bool* abandoned, Paths paths)
    : paths_(paths) {
  comm_ = dup_world("the heartbeat's communicator", startup_deadline, abandoned);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  if (paths_.sockets) {
    const auto exchange = [&](const std::string& mine) {
      return allgather_strings(comm_, mine, startup_deadline, abandoned);
    };
    sockets_ = std::make_unique<BeatSockets>(rank_, size_, exchange, startup_deadline);
  }
  const size_t n = static_cast<size_t>(size_);
  heard_.assign(n, Clock::now());
  peer_stuck_ms_.assign(n, 0);
  peer_seq_.assign(n, -1);
  send_buf_.assign(n, Beat{});
  recv_buf_.assign(n, Beat{});
  send_req_.assign(n, MPI_REQUEST_NULL);
  recv_req_.assign(n, MPI_REQUEST_NULL);
  broken_.assign(n, 0);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    if (MPI_Irecv(&recv_buf_[p], kBeatWords, MPI_INT64_T, p, 0, comm_, &recv_req_[p]) !=
        MPI_SUCCESS)
      broken_[p] = 1;
  }
  thread_ = std::thread([this] { loop(); });
}

bool MpiHeartbeat::stop() {
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

void MpiHeartbeat::enter_wait() {
  std::lock_guard<std::mutex> lock(mu_);
  if (n_waiting_++ == 0) stuck_since_ = Clock::now();
}

void MpiHeartbeat::leave_wait(bool finished) {
  std::lock_guard<std::mutex> lock(mu_);
  --n_waiting_;
  if (finished) stuck_since_ = Clock::now();
  gave_up_ |= !finished;
}

void MpiHeartbeat::progress() {
  std::lock_guard<std::mutex> lock(mu_);
  if (n_waiting_ > 0) stuck_since_ = Clock::now();
}

int64_t MpiHeartbeat::stuck_ms(Clock::time_point now) const {
  if (gave_up_) return -1;
  if (n_waiting_ == 0) return 0;
  return std::chrono::duration_cast<std::chrono::milliseconds>(now - stuck_since_).count();
}

std::string MpiHeartbeat::verdict(std::chrono::milliseconds watchdog) {
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

void MpiHeartbeat::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    exchange();
    lock.lock();
    cv_.wait_for(lock, kBeat, [this] { return stop_; });
  }
}

void MpiHeartbeat::heard(int peer, const Beat& beat, Clock::time_point now) {
  if (beat.seq <= peer_seq_[peer]) return;  // a late copy of a beat the other path brought
  peer_seq_[peer] = beat.seq;
  heard_[peer] = now;
  peer_stuck_ms_[peer] = beat.state;
}

void MpiHeartbeat::exchange() {
  // The sockets' beats first, in and out: MPI's calls below may wait for MPI's lock behind the
  // other threads' polls of their transfers, and this rank's beats must not wait with them.
  std::vector<std::pair<int, Beat>> got;  // (peer, its beat) taken this beat
  if (sockets_) got = sockets_->receive();
  Beat mine;
  {
    const Clock::time_point now = Clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [p, beat] : got) heard(p, beat, now);
    mine = Beat{seq_++, stuck_ms(now)};
  }
  if (sockets_) sockets_->send(mine);
  got.clear();
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
      if (MPI_Irecv(&recv_buf_[p], kBeatWords, MPI_INT64_T, p, 0, comm_, &recv_req_[p]) !=
          MPI_SUCCESS) {
        broken_[p] = 1;
        break;
      }
    }
  }
  if (!got.empty()) {
    const Clock::time_point now = Clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [p, beat] : got) heard(p, beat, now);
  }
  if (!paths_.mpi) return;
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
    if (MPI_Isend(&send_buf_[p], kBeatWords, MPI_INT64_T, p, 0, comm_, &send_req_[p]) !=
        MPI_SUCCESS)
      broken_[p] = 1;
  }
}

}  // namespace duet

#endif  // DUET_HAVE_MPI
