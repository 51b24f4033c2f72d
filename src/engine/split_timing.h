// The measured split choice (--dbo-split auto): whether a step that the token thresholds allow to
// run as two micro-batches should, judged by how fast steps like it ran split and whole.
//
// Token thresholds cannot see the link or the caches: on a fast link the experts' all-to-all is
// too short to hide anything worth the split's cost (each micro-batch reads the experts' weights
// again), on a slow one the same batch gains a third. So for each kind of step (forward mode,
// and the padded token count in half-octave buckets) the group keeps the time per token of its
// recent split and whole steps, picks the faster, and re-tries the other for kExploreSteps
// steps every kExploreEvery decisions so that the choice follows a link that changes. The
// averages weigh the newest time by a half, so the two compared are the last few steps of each:
// on a machine whose speed drifts (a VM's memory bandwidth, a shared link) an old time of the
// other choice must not decide against a fresh one.
//
// Every rank keeps the same table: the times come from the agreement itself. With each offer a
// rank sends its forward time of the step kLag running plans back (finished on every rank by
// then, the overlapped scheduler included), and every rank adds the ranks' mean to its table from
// the same offers, in integer arithmetic. The choice is thus uniform across ranks like the rest
// of the plan (seed 000), with no message of its own.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "model/forward.h"

namespace duet {

struct StepOffer;
struct StepPlan;

class SplitTimes {
 public:
  // A step's time is offered this many running plans later.
  static constexpr int64_t kLag = 2;
  // Every kExploreEvery decisions of a kind of step, kExploreSteps in a row take the slower
  // choice, to measure it again.
  static constexpr int64_t kExploreEvery = 32;
  static constexpr int64_t kExploreSteps = 2;

  // Running plans agreed so far: the index of the next one (StepPlan::index).
  int64_t plans() const { return plans_; }

  // The agreement of the plan numbered plans(), in this order, with every rank's offers:
  // 1. record(): adds the offers' times of the plan kLag back, if it was a candidate for a split
  //    and every rank timed it (offer.lagged_ns >= 0).
  void record(const std::vector<StepOffer>& offers);
  // 2. choose(): for a step past the thresholds, whether to split it.
  bool choose(ForwardMode mode, int64_t padded_tokens);
  // 3. push(): numbers the plan (sets plan.index) and remembers it if it runs; `candidate`: it
  //    was past the thresholds (choose() was asked).
  void push(StepPlan& plan, bool candidate);

  // The table, for logs and tests: "decode 32-45: whole 812 ns/token (12), split 990 (5)" per
  // kind of step, one per line.
  std::string describe() const;

  // The half-octave bucket of a token count: floor(2 · log2(n)), n >= 1.
  static int bucket(int64_t n);

 private:
  struct Average {
    int64_t ns_per_token = 0;  // exponential average, weight 1/2 on the newest
    int64_t n = 0;             // samples
    void add(int64_t sample);
  };
  struct Kind {
    Average whole, split;
    int64_t decisions = 0;
  };
  struct Recent {  // a running plan, while its time may still arrive
    int64_t index = -1;
    ForwardMode mode = ForwardMode::kIdle;
    int64_t padded_tokens = 0;
    bool split = false;
    bool candidate = false;
  };
  using Key = std::pair<int, int>;  // (mode, bucket)

  std::map<Key, Kind> kinds_;
  Recent recent_[kLag + 1];
  int64_t plans_ = 0;
};

}  // namespace duet
