#include "engine/future_map.h"

#include "core/error.h"

namespace duet {

FutureMap::FutureMap(int64_t n_slots)
    : n_slots_(n_slots), slots_(new std::atomic<int64_t>[static_cast<size_t>(n_slots)]) {
  DUET_CHECK(n_slots > 0 && n_slots < (int64_t{1} << 31), "future map of " << n_slots << " slots");
  for (int64_t i = 0; i < n_slots; ++i) slots_[i].store(0, std::memory_order_relaxed);
}

size_t FutureMap::slot_of(int32_t placeholder) const {
  const int64_t slot = -static_cast<int64_t>(placeholder) - 1;
  DUET_CHECK(placeholder < 0 && slot < n_slots_,
             "placeholder " << placeholder << " outside a ring of " << n_slots_);
  return static_cast<size_t>(slot);
}

int32_t FutureMap::alloc() {
  const int64_t slot = next_;
  next_ = (next_ + 1) % n_slots_;
  DUET_CHECK(slots_[slot].load(std::memory_order_acquire) != kPending,
             "future map slot " << slot << " reused while still pending (ring of " << n_slots_
                                << " too small)");
  slots_[slot].store(kPending, std::memory_order_release);
  return static_cast<int32_t>(-slot - 1);
}

void FutureMap::store(int32_t placeholder, int32_t token) {
  DUET_CHECK(token >= 0, "token " << token << " stored in the future map");
  slots_[slot_of(placeholder)].store(token, std::memory_order_release);
}

int32_t FutureMap::peek(int32_t placeholder) const {
  return static_cast<int32_t>(slots_[slot_of(placeholder)].load(std::memory_order_acquire));
}

void FutureMap::resolve(int32_t* tokens, int64_t n) const {
  for (int64_t i = 0; i < n; ++i) {
    if (!is_placeholder(tokens[i])) continue;
    const int64_t tok = slots_[slot_of(tokens[i])].load(std::memory_order_acquire);
    DUET_CHECK(tok != kPending, "placeholder " << tokens[i] << " read before its step sampled it");
    tokens[i] = static_cast<int32_t>(tok);
  }
}

}  // namespace duet
