// The expert-parallel dispatcher: routed tokens travel to the ranks that own their experts by
// all-to-all over a Communicator, and the experts' outputs travel back. The send halves post
// the transfer on the communication thread and return; the receive halves wait for it.
// One instance holds one micro-batch's buffers (two micro-batches: two instances).
//
// Two algorithms (`--all2all-backend`, after DeepEP's two kernel families):
//  - high_throughput: exchange the row counts first, then send each token once per destination
//    rank with the list of its experts there (deduplicated); the destination reduces the
//    token's experts' outputs with their weights and sends back one row per token.
//  - low_latency: one round without a count exchange into fixed-capacity per-expert buffers
//    (max_tokens_per_rank rows per expert per source rank); a token goes once per expert, and
//    its owner applies the weights. Cheaper for decode's small batches. A step in which some
//    rank has more tokens than the capacity (told by plan_step; a long prefill) runs
//    high_throughput instead, as DeepEP's users switch to the normal kernels for prefill;
//    without plan_step such a batch is refused.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "moe/dispatcher.h"
#include "moe/expert_placement.h"

namespace duet {

enum class All2AllBackend { kHighThroughput, kLowLatency };

// "high_throughput" | "low_latency"; throws duet::Error otherwise.
All2AllBackend parse_all2all_backend(const std::string& name);
const char* all2all_backend_name(All2AllBackend b);

struct EpDispatcherOptions {
  All2AllBackend backend = All2AllBackend::kHighThroughput;
  // low_latency: the capacity of each per-expert buffer, per source rank. Every rank must use
  // the same value; a micro-batch with more tokens is refused.
  int64_t max_tokens_per_rank = 256;
};

class EpDispatcher final : public Dispatcher {
 public:
  // comm and placement describe the same ranks; comm must outlive the dispatcher. Every rank's
  // dispatcher takes part in every dispatch and combine (a rank with no tokens included).
  EpDispatcher(Communicator& comm, const ExpertPlacement& placement,
               const EpDispatcherOptions& opt);

  void dispatch_send(const RoutedTokens& tokens) override;
  ExpertBatch& dispatch_recv() override;
  void combine_send() override;
  void combine_recv(float* out) override;

  void plan_step(int64_t max_tokens_per_rank) override;

  All2AllBackend backend() const { return opt_.backend; }
  // The algorithm the current step uses.
  All2AllBackend step_backend() const { return step_backend_; }
  // Payload bytes this rank sent in the last dispatch and combine (benchmarks).
  int64_t last_dispatch_bytes() const { return dispatch_bytes_; }
  int64_t last_combine_bytes() const { return combine_bytes_; }
  // Seconds the receive halves have spent waiting for their transfers since construction: the
  // communication time the computation did not hide.
  double wait_seconds() const override { return wait_seconds_; }

 private:
  void ht_dispatch_send();
  void ht_dispatch_recv();
  void ht_combine_send();
  void ht_combine_recv(float* out);
  void ll_dispatch_send();
  void ll_dispatch_recv();
  void ll_combine_send();
  void ll_combine_recv(float* out);
  // Counts of `bytes_each` per rank, for the fixed-size transfers.
  std::vector<int64_t> uniform(int64_t bytes_each) const;

  // The dispatcher's place in the dispatch → experts → combine cycle; a call out of turn (a
  // transfer left behind or started twice) is a bug and fails a check.
  enum class Phase { kIdle, kDispatching, kExperts, kCombining };
  void expect(Phase want, const char* call) const;

  Communicator& comm_;
  const ExpertPlacement placement_;
  const EpDispatcherOptions opt_;
  const int rank_;
  const int n_rank_;

  // Waits for the pending transfer, adding the time to wait_seconds_.
  void wait_pending();

  Phase phase_ = Phase::kIdle;
  All2AllBackend step_backend_;
  double wait_seconds_ = 0;
  RoutedTokens tokens_;
  ExpertBatch batch_;
  CommHandle pending_;  // the transfer in flight between a send half and its receive half
  int64_t dispatch_bytes_ = 0;
  int64_t combine_bytes_ = 0;

  // Buffers touched by the communication thread between a send half and the wait in the
  // matching receive half, and by the caller only outside that window.
  std::vector<float> send_;         // records (ht) or per-expert blocks (ll), by destination
  std::vector<float> recv_;         // the same, by source
  std::vector<float> back_;         // combine: outputs going back, by source
  std::vector<float> ret_;          // combine: outputs coming back, by destination
  std::vector<int64_t> send_rows_;  // [n_rank] ht: records sent to each rank
  std::vector<int64_t> recv_rows_;  // [n_rank] ht: records received from each rank

  // high_throughput bookkeeping.
  std::vector<int32_t> sent_token_;  // [sent records] token of each record, destination-major
  std::vector<int64_t> rec_rows_;    // [received records, K] batch row of each listed expert, -1
  // low_latency bookkeeping.
  std::vector<int64_t> slot_of_;  // [n_tokens, K] word offset of (t, k)'s row in ret_
  std::vector<int64_t> src_row_;  // [n_local, n_rank] first batch row of (expert, source)
};

}  // namespace duet
