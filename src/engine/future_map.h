// Token ids that are not sampled yet (SGLang's FutureMap, seed 003). With the overlapped
// scheduler the engine thread schedules step N+1 while step N still computes, so a sequence's
// next input token is not known yet: the scheduler puts a placeholder in its place, a negative
// id naming a slot of this ring, and the step worker fills the slot when it samples step N and
// resolves the placeholder before step N+1's embedding reads it.
//
// Threads: alloc() on the engine thread; store() and resolve() on the step worker. Each slot is
// one atomic word, so the two never race; a slot is pending from alloc() until store().
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace duet {

class FutureMap {
 public:
  // A ring of `n_slots` (> 0) placeholders: at most that many may be outstanding at once.
  explicit FutureMap(int64_t n_slots);

  // Engine thread: the next slot, now pending, as its placeholder id (< 0). Throws duet::Error
  // when the slot it would reuse is still pending (the ring is too small for the tokens in
  // flight: an engine bug).
  int32_t alloc();
  // Step worker: the token sampled for `placeholder`.
  void store(int32_t placeholder, int32_t token);
  // Step worker: replaces every placeholder in tokens[0, n) by its token. Throws duet::Error
  // naming the slot if one is still pending (read before its step sampled it: an engine bug).
  void resolve(int32_t* tokens, int64_t n) const;
  // The token of a stored placeholder, or -1 while it is pending.
  int32_t peek(int32_t placeholder) const;

  static bool is_placeholder(int32_t id) { return id < 0; }
  int64_t n_slots() const { return n_slots_; }

 private:
  static constexpr int64_t kPending = -1;
  size_t slot_of(int32_t placeholder) const;

  const int64_t n_slots_;
  std::unique_ptr<std::atomic<int64_t>[]> slots_;  // [n_slots] token, or kPending
  int64_t next_ = 0;                                // engine thread only
};

}  // namespace duet
