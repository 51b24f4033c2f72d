#include "engine/split_timing.h"

#include <sstream>

#include "core/error.h"
#include "engine/step_agreement.h"

namespace duet {

int SplitTimes::bucket(int64_t n) {
  DUET_CHECK(n >= 1 && n < (int64_t{1} << 31), "SplitTimes::bucket(" << n << ")");
  int k = 0;
  while ((n >> (k + 1)) != 0) ++k;  // k = floor(log2 n)
  // The upper half of the octave [2^k, 2^(k+1)) starts at 2^(k + 1/2): n² >= 2^(2k+1).
  return 2 * k + (n * n >= (int64_t{1} << (2 * k + 1)) ? 1 : 0);
}

void SplitTimes::Average::add(int64_t sample) {
  ns_per_token = n == 0 ? sample : (ns_per_token + sample + 1) / 2;
  ++n;
}

void SplitTimes::record(const std::vector<StepOffer>& offers) {
  const int64_t index = plans_ - kLag;
  if (index < 0) return;
  const Recent& r = recent_[index % (kLag + 1)];
  if (r.index != index || !r.candidate) return;
  int64_t sum = 0;
  for (const StepOffer& o : offers) {
    if (o.lagged_ns < 0) return;  // a rank has no time for it: nobody adds one
    sum += o.lagged_ns;
  }
  const int64_t per_token = sum / static_cast<int64_t>(offers.size()) / r.padded_tokens;
  Kind& kind = kinds_[{static_cast<int>(r.mode), bucket(r.padded_tokens)}];
  (r.split ? kind.split : kind.whole).add(per_token);
}

bool SplitTimes::choose(ForwardMode mode, int64_t padded_tokens) {
  Kind& kind = kinds_[{static_cast<int>(mode), bucket(padded_tokens)}];
  ++kind.decisions;
  // Until both have two times: the one with fewer, a split first.
  if (kind.split.n < 2 || kind.whole.n < 2) return kind.split.n <= kind.whole.n;
  const bool split_faster = kind.split.ns_per_token <= kind.whole.ns_per_token;
  return kind.decisions % kExploreEvery < kExploreSteps ? !split_faster : split_faster;
}

void SplitTimes::push(StepPlan& plan, bool candidate) {
  if (!plan.runs()) return;
  plan.index = plans_;
  recent_[plans_ % (kLag + 1)] = {plans_, plan.mode, plan.padded_tokens, plan.micro_batch,
                                  candidate};
  ++plans_;
}

std::string SplitTimes::describe() const {
  std::ostringstream s;
  for (const auto& [key, kind] : kinds_) {
    // The bucket's token counts: from 2^(b/2) up to, not including, 2^((b+1)/2).
    int64_t lo = 1;
    while (bucket(lo) < key.second) ++lo;
    int64_t hi = lo;
    while (bucket(hi + 1) == key.second) ++hi;
    s << forward_mode_name(static_cast<ForwardMode>(key.first)) << " " << lo << "-" << hi
      << ": whole " << kind.whole.ns_per_token << " ns/token (" << kind.whole.n << "), split "
      << kind.split.ns_per_token << " (" << kind.split.n << ")\n";
  }
  return s.str();
}

}  // namespace duet
