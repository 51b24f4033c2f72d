#include "engine/executor.h"

#include <chrono>
#include <utility>

#include "core/error.h"

namespace duet {

const char* overlap_mode_name(OverlapMode mode) {
  switch (mode) {
    case OverlapMode::kNone:
      return "none";
    case OverlapMode::kTbo:
      return "tbo";
    case OverlapMode::kDbo:
      return "dbo";
  }
  return "?";
}

int delta_stages(ForwardMode mode) {
  (void)mode;
  return 0;
}

namespace {

// Runs one operation of `state`'s micro-batch, as a span of its track when tracing.
void run_op(const Operation& op, ForwardState& state, const char* note = nullptr) {
  if (!state.trace) {
    op.run(state);
    return;
  }
  const Trace::Clock::time_point t0 = Trace::Clock::now();
  op.run(state);
  state.trace->span(state.trace_track, note ? op.name() + note : op.name(), t0,
                    Trace::Clock::now());
}

}  // namespace

void run_plain(const std::vector<Operation>& ops, ForwardState& state) {
  for (const Operation& op : ops) {
    if (!op.is_yield()) run_op(op, state);
  }
}

void run_plain_timed(const std::vector<Operation>& ops, ForwardState& state, OpSeconds& seconds) {
  using Clock = std::chrono::steady_clock;
  struct Scope {  // the parts' timers see `seconds` only while this call runs
    ForwardState& state;
    ~Scope() { state.op_seconds = nullptr; }
  } scope{state};
  state.op_seconds = &seconds;
  for (const Operation& op : ops) {
    if (op.is_yield()) continue;
    const Clock::time_point t0 = Clock::now();
    op.run(state);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    seconds[op_kind_name(op.kind)] += s;
  }
}

namespace {

// Runs one micro-batch's list a stage at a time.
class StageCursor {
 public:
  StageCursor(const std::vector<Operation>& ops, ForwardState& state) : ops_(ops), state_(state) {}
  bool done() const { return next_ >= ops_.size(); }
  // Runs the operations up to and including the next yield (or to the end).
  void run_stage() {
    while (next_ < ops_.size()) {
      const Operation& op = ops_[next_++];
      if (op.is_yield()) return;
      run_op(op, state_);
    }
  }

 private:
  const std::vector<Operation>& ops_;
  ForwardState& state_;
  size_t next_ = 0;
};

}  // namespace

void run_two_batch_overlap(const std::vector<Operation>& ops, ForwardState& a, ForwardState& b,
                           int delta_stages) {
  DUET_CHECK(delta_stages >= 0, "delta_stages " << delta_stages);
  StageCursor ca(ops, a), cb(ops, b);
  for (int i = 0; i < delta_stages && !ca.done(); ++i) ca.run_stage();
  while (!ca.done()) {
    ca.run_stage();
    cb.run_stage();
  }
  while (!cb.done()) cb.run_stage();
}

DboWorker::DboWorker() : thread_([this] { loop(); }) {}

DboWorker::~DboWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void DboWorker::start(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    DUET_CHECK(done_, "DboWorker::start while a job is pending");
    job_ = std::move(job);
    done_ = false;
    error_ = nullptr;
  }
  cv_.notify_all();
}

void DboWorker::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void DboWorker::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !done_; });
    if (stop_) return;
    std::function<void()> job = std::move(job_);
    lock.unlock();
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    error_ = error;
    done_ = true;
    cv_.notify_all();
  }
}

namespace {

bool is_receive(const Operation& op) {
  return op.kind == OpKind::kDispatchRecv || op.kind == OpKind::kCombineRecv;
}

// The two micro-batches of a dual-batch-overlap run and whose turn it is. Only the side whose
// turn it is runs; the other is parked in wait_turn.
class PingPong {
 public:
  struct Side {
    const std::vector<Operation>* ops = nullptr;
    ForwardState* state = nullptr;
    size_t hook = SIZE_MAX;  // index of this side's receive half registered as a hook
    bool hook_ran = false;   // the other side ran it
    bool finished = false;
  };

  PingPong(const std::vector<Operation>& ops, ForwardState& a, ForwardState& b) {
    sides_[0] = {&ops, &a};
    sides_[1] = {&ops, &b};
  }

  // The body of side `me` (0: A, 1: B).
  void run(int me) {
    try {
      wait_turn(me);
      Side& my = sides_[me];
      const std::vector<Operation>& ops = *my.ops;
      for (size_t i = 0; i < ops.size(); ++i) {
        const Operation& op = ops[i];
        if (!op.is_yield()) {
          const bool hooked = i == my.hook;
          const bool ran = hooked && my.hook_ran;  // the other side waited for it already
          if (hooked) my.hook = SIZE_MAX;
          if (!ran) run_op(op, *my.state);
          continue;
        }
        // dbo_yield: run the other side's receive hook (its transfer has had this whole stage
        // to arrive), register our own next receive as a hook, and hand the turn over.
        Side& other = sides_[1 - me];
        if (other.hook != SIZE_MAX && !other.hook_ran && !other.finished) {
          run_op((*other.ops)[other.hook], *other.state, " (hook, other thread)");
          other.hook_ran = true;
        }
        if (i + 1 < ops.size() && is_receive(ops[i + 1])) {
          my.hook = i + 1;
          my.hook_ran = false;
        }
        pass_turn(me);
        wait_turn(me);
      }
      finish(me);
    } catch (...) {
      fail(std::current_exception());
    }
  }

  // Rethrows the first error of either side.
  void rethrow() {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void wait_turn(int me) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return turn_ == me || sides_[1 - me].finished || error_; });
    if (error_) throw Error("the other micro-batch failed");
  }
  void pass_turn(int me) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      turn_ = 1 - me;
    }
    cv_.notify_all();
  }
  void finish(int me) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      sides_[me].finished = true;
      turn_ = 1 - me;
    }
    cv_.notify_all();
  }
  void fail(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = e;
    }
    cv_.notify_all();
  }

  Side sides_[2];
  std::mutex mu_;
  std::condition_variable cv_;
  int turn_ = 0;                // GUARDED_BY(mu_): A starts
  std::exception_ptr error_;    // GUARDED_BY(mu_): the first failure
};

}  // namespace

void run_dual_batch_overlap(const std::vector<Operation>& ops, ForwardState& a, ForwardState& b,
                            DboWorker& b_thread) {
  PingPong pp(ops, a, b);
  b_thread.start([&] { pp.run(1); });
  pp.run(0);
  b_thread.wait();
  pp.rethrow();
}

}  // namespace duet
