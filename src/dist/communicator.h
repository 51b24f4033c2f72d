// The data plane of a distributed run (seed 002's Communicator): all-to-all with variable sizes,
// all-gather and all-reduce over every rank, each in a blocking form and in an asynchronous
// start / wait form. All of them run on the rank's communication thread, in the order they were
// started, so the blocking form is start + wait and every rank sees the same sequence.
//
// Backends (in-process, MPI) implement CollectiveOps: the blocking collectives themselves, called
// only on the communication thread. A collective that gives up on its peers (in-process: one has
// not arrived within the watchdog time; MPI: one has been silent, no heartbeat, for the watchdog
// time, or every rank is stuck) throws duet::Error naming it; every later collective then fails
// the same way.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/comm_thread.h"

namespace duet {

enum class ElemType { kF32, kI64 };
enum class ReduceOp { kSum, kMax };

// Bytes of one element of `t`.
int64_t elem_size(ElemType t);

// The blocking collectives of one backend. Every rank calls them in the same order; buffers are
// the caller's and stay untouched by anyone else until the call returns.
class CollectiveOps {
 public:
  virtual ~CollectiveOps() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // send = the parts for ranks 0..n-1 back to back, part r being send_bytes[r] long; recv gets
  // the parts from ranks 0..n-1 back to back, recv_bytes[s] long each (what rank s sends here).
  // Zero-size parts are fine.
  virtual void all_to_all_v(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                            const std::vector<int64_t>& recv_bytes) = 0;
  // all_to_all_v between fixed-size rooms, for a receiver that knows only a bound on what each
  // rank sends it, in one round (no count exchange first). The part for rank r is the first
  // send_bytes[r] bytes of its room at send + Σ_{r'<r} send_room[r']; the part from rank s lands
  // at recv + Σ_{r<s} recv_capacity[r], at most recv_capacity[s] bytes long, and (*recv_bytes)[s]
  // is set to its length. A part longer than its room there is an error.
  virtual void all_to_all_bounded(const void* send, const std::vector<int64_t>& send_bytes,
                                  const std::vector<int64_t>& send_room, void* recv,
                                  const std::vector<int64_t>& recv_capacity,
                                  std::vector<int64_t>* recv_bytes) = 0;
  // recv [world_size, bytes] = every rank's `send` [bytes] in rank order.
  virtual void all_gather(const void* send, int64_t bytes, void* recv) = 0;
  // data [count] of `type` becomes the element-wise reduction over ranks, identical everywhere.
  virtual void all_reduce(void* data, int64_t count, ElemType type, ReduceOp op) = 0;
};

class Communicator {
 public:
  // Owns the backend and starts the communication thread.
  Communicator(std::unique_ptr<CollectiveOps> ops, std::chrono::milliseconds watchdog);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  std::chrono::milliseconds watchdog() const { return watchdog_; }
  // Records each collective as a span of `trace` (see CommThread::set_trace).
  void set_trace(Trace* trace) { thread_.set_trace(trace); }
  // The communication thread's time running collectives so far (CommThread::usage).
  CommThread::Usage usage() const { return thread_.usage(); }
  // Restricts the communication thread to `cores` (--comm-cores).
  void pin_thread(const std::vector<int>& cores) { thread_.pin(cores); }

  // Asynchronous forms: queue the collective on the communication thread and return at once.
  // Buffers (and the count vectors' contents, which are copied) must stay valid and untouched
  // until the handle's wait() returns.
  CommHandle start_all_to_all_v(const void* send, std::vector<int64_t> send_bytes, void* recv,
                                std::vector<int64_t> recv_bytes);
  CommHandle start_all_gather(const void* send, int64_t bytes, void* recv);
  CommHandle start_all_reduce(void* data, int64_t count, ElemType type, ReduceOp op);
  // Runs `body` on the communication thread with direct access to the blocking collectives, for
  // a schedule of several dependent collectives (exchange counts, then the data they size).
  // `name` appears in errors.
  CommHandle start(std::string name, std::function<void(CollectiveOps&)> body);

  // Blocking forms: start + wait.
  void all_to_all_v(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                    const std::vector<int64_t>& recv_bytes);
  void all_gather(const void* send, int64_t bytes, void* recv);
  void all_reduce(void* data, int64_t count, ElemType type, ReduceOp op);

 private:
  std::unique_ptr<CollectiveOps> ops_;  // used only on thread_
  int rank_;
  int world_size_;
  std::chrono::milliseconds watchdog_;
  CommThread thread_;  // last: joined first on destruction, while ops_ still exists
};

}  // namespace duet
