// The expert-parallel dispatcher: routed tokens travel to the ranks that own their experts by
// all-to-all over a Communicator, and the experts' outputs travel back. The send halves post
// the transfer on the communication thread and return; the receive halves wait for it.
// One instance holds one micro-batch's buffers (two micro-batches: two instances).
//
// Two algorithms (`--all2all-backend`, after DeepEP's two kernel families):
//  - high_throughput: send each token once per destination rank with the list of its experts
//    there (deduplicated); the destination's experts reduce the token's outputs with their
//    weights into one row, which goes back. The row counts are exchanged first, unless the
//    step's plan (plan_step) bounds them: then the records travel in one round of point-to-point
//    messages into room for that bound (while it stays under kMaxBoundedBytes per rank), which
//    saves a round trip per dispatch in decode.
//  - low_latency: one round without a count exchange into fixed-capacity buffers: per
//    destination rank, room for min(K, n_local) rows per token of the step's capacity (told by
//    plan_step, else max_tokens_per_rank), rows grouped by expert behind a header of per-expert
//    counts. A token goes once per expert, and its owner applies the weights. Cheaper for
//    decode's small batches. A step in which some rank has more tokens than max_tokens_per_rank
//    (told by plan_step; a long prefill) runs high_throughput instead, as DeepEP's users switch
//    to the normal kernels for prefill; without plan_step such a batch is refused.
// Both send nothing through the transport to the rank itself: its rows are read in place.
//
// Rows travel as f32 or, with row_dtype bf16 or fp8 (`--all2all-dtype`), as bf16 (half the bytes)
// or as fp8 E4M3 with a scale per 128 values (a little over a quarter; moe/wire_rows.h). Then
// every row an expert reads is that rounding of its token's row (the rank's own rows too, so the
// result does not depend on where an expert lives), and every output row another rank sends
// back is rounded likewise (low_latency rounds the rank's own outputs too; high_throughput adds
// its own experts' outputs unrounded, as they never leave the rank).
//
// Single-batch overlap: with combine_chunks > 1, low_latency's combine leaves in chunks of the
// local experts, each as soon as its experts have run (ExpertBatch::chunk_done), while the
// next chunk computes; high_throughput's combine stays one transfer (its rows are reduced over a
// token's experts on the rank, so no row is final before the last expert).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "dist/communicator.h"
#include "moe/dispatcher.h"
#include "moe/expert_placement.h"
#include "moe/wire_rows.h"

namespace duet {

enum class All2AllBackend { kHighThroughput, kLowLatency };

// "what, N bytes sent": a transfer's name on the communication thread (errors, traces).
std::string with_bytes(const char* what, const std::vector<int64_t>& bytes);

// "high_throughput" | "low_latency"; throws duet::Error otherwise.
All2AllBackend parse_all2all_backend(const std::string& name);
const char* all2all_backend_name(All2AllBackend b);

struct EpDispatcherOptions {
  All2AllBackend backend = All2AllBackend::kHighThroughput;
  // low_latency: the most tokens of one rank a dispatch carries (the buffers' capacity). Every
  // rank must use the same value; a micro-batch with more tokens is refused.
  int64_t max_tokens_per_rank = 256;
  // The rows' element type on the wire. Every rank must use the same.
  RowDtype row_dtype = RowDtype::kF32;
  // low_latency: the combine leaves in this many chunks of local experts (at most one per
  // expert), each as soon as its experts have run; 1 = one transfer. Every rank must use the
  // same value.
  int combine_chunks = 1;
  // With it > 0, fewer chunks when the step's combine is small: at most one per this many bytes
  // of a rank's returning rows at the step's capacity (step tokens · K rows), so that each chunk's
  // round of messages carries enough to be worth its cost. Every rank must use the same value.
  int64_t min_chunk_bytes = 0;
  // false: a step split in two micro-batches travels unchunked, the other micro-batch hiding
  // its transfers (there the chunks' extra messages cost more than they hide, measured).
  bool chunk_micro_batches = true;
  // Steps whose dispatch and combine travel in one transfer each (every high_throughput step):
  // the experts with rows from other ranks run first, the combine leaves as soon as they have,
  // and the experts whose rows are all this rank's own run while it travels (their outputs never
  // leave the rank). low_latency's results do not change (each row's output is its own);
  // high_throughput adds a token's experts on its own rank in this order instead of by index.
  bool own_experts_last = false;
  // With own_experts_last, low_latency: such steps send the row counts ahead of the rows, so that a
  // rank knows which of its experts have only its own rows before the other ranks' rows arrive, and
  // runs half of those while the rows travel (the other half while the combine does). One more
  // message each way per layer. Every rank must use the same value.
  bool own_rows_beside_dispatch = false;
  // The combine's, when it differs from the dispatch's (DeepEP's fp8 dispatch with a bf16
  // combine); unset: row_dtype both ways.
  std::optional<RowDtype> combine_dtype = std::nullopt;
  RowDtype combine_rows() const { return combine_dtype.value_or(row_dtype); }
};

class EpDispatcher final : public Dispatcher {
 public:
  // comm and placement describe the same ranks; comm must outlive the dispatcher. Every rank's
  // dispatcher takes part in every dispatch and combine (a rank with no tokens included).
  EpDispatcher(Communicator& comm, const ExpertPlacement& placement,
               const EpDispatcherOptions& opt);
  // Waits for a transfer still in flight (the tasks on the communication thread read and write
  // this dispatcher's buffers): after a receive half gave up on a stuck communication thread,
  // the task may still run. The backends' watchdogs end every collective; if one is still
  // running after twice the watchdog time and a minute more, the process ends with an error
  // rather than free memory the task would write.
  ~EpDispatcher() override;

  void dispatch_send(const RoutedTokens& tokens) override;
  ExpertBatch& dispatch_recv() override;
  void combine_send() override;
  void combine_recv() override;

  // Also sizes low_latency's buffers for the step: max_tokens_per_rank rows per token slot
  // instead of the configured capacity (every rank plans the same value).
  void plan_step(int64_t max_tokens_per_rank, bool micro_batch = false) override;

  All2AllBackend backend() const { return opt_.backend; }
  // The algorithm the current step uses.
  All2AllBackend step_backend() const { return step_backend_; }
  // Whether the last high_throughput dispatch went in one round (no count exchange).
  bool last_dispatch_bounded() const { return ht_bounded_; }
  // Payload bytes this rank routed in the last dispatch and combine (benchmarks), its own
  // share included although that never enters the transport.
  int64_t last_dispatch_bytes() const { return dispatch_bytes_; }
  int64_t last_combine_bytes() const { return combine_bytes_; }
  // Seconds the receive halves have spent waiting for their transfers since construction: the
  // communication time the computation did not hide.
  double wait_seconds() const override { return wait_seconds_; }

 private:
  void ht_dispatch_send();
  void ht_dispatch_recv();
  void ht_combine_send();
  void ht_combine_recv();
  void ll_dispatch_send();
  void ll_dispatch_recv();
  void ll_combine_send();
  void ll_combine_recv();
  // The step's chunks of local experts (ll_chunks_): the same on every rank, from the step's
  // capacity; none when the combine is one transfer.
  void ll_plan_chunks(int64_t L, int64_t row_words);
  // Starts chunk c > 0 of a chunked dispatch: the rows for each rank's experts of chunk c, into
  // the places the counts that chunk 0 brought give them.
  CommHandle ll_dispatch_chunk(int c, int64_t BW);
  // ExpertBatch::chunk_ready: waits for chunk c of the dispatch and widens its rows (bf16, fp8).
  void ll_dispatch_chunk_ready(int c);
  // EpDispatcherOptions::own_experts_last: orders batch_ (the experts with rows from other
  // ranks, then those with only this rank's) when both kinds have rows, as two chunks; with the
  // counts ahead (counts_first_), as three: half of the own-only experts, the ones with other
  // ranks' rows (waiting for those rows first), the rest. REQUIRES: remote_rows_ counted, the
  // batch built.
  void ll_order_own_last();
  // The order itself, for either algorithm (counts_first: the three chunks): batch_.order,
  // chunk_ends, own_wait_chunk_, own_post_chunk_ and own_last_; false (and no chunks) when
  // there is nothing to reorder.
  bool order_own_last(bool counts_first);
  // high_throughput's one combine transfer.
  void ht_post_combine();
  // ExpertBatch::chunk_ready / chunk_done of that order: the other ranks' rows are waited for
  // before chunk own_wait_chunk_, and the combine leaves after chunk own_post_chunk_ (every row
  // another rank waits for is final then); each chunk's rows are packed for the combine's type.
  void ll_own_last_ready(int c);
  void ll_own_last_done(int c);
  // Packs the outputs of batch rows [r0, r1) into their slots in the combine's type.
  void ll_pack_rows(int64_t r0, int64_t r1);
  // low_latency's one combine transfer: each source gets as many rows back as it sent.
  void ll_post_combine();
  // Posts the output rows of chunk c of the local experts to their tokens' ranks, and receives
  // chunk c of the other ranks' experts. REQUIRES: chunks before c posted, c's rows final.
  void ll_combine_chunk(int c);
  // Starts low_latency's one round: bytes[r] from the start of rank r's buffer of bw words in
  // send (buffers in ll order), into recv's buffers of bw words; recv_bytes_ gets the lengths.
  void ll_transfer(const char* what, const float* send, const std::vector<int64_t>& bytes,
                   float* recv, int64_t bw);

  // high_throughput: the header (K ids, K weights) of record i from source s, and its row.
  // REQUIRES: the dispatch's transfer has been waited for.
  const float* ht_head(int s, int64_t i) const;
  const float* ht_row(int s, int64_t i) const;
  // Byte counts of the transfer of `rows` records of `words` f32 each per rank, the rank's own
  // part left out (it stays in place).
  void wire_bytes(const std::vector<int64_t>& rows, int64_t words,
                  std::vector<int64_t>* bytes) const;

  // The dispatcher's place in the dispatch → experts → combine cycle; a call out of turn (a
  // transfer left behind or started twice) is a bug and fails a check.
  enum class Phase { kIdle, kDispatching, kExperts, kCombining };
  void expect(Phase want, const char* call) const;

  Communicator& comm_;
  const ExpertPlacement placement_;
  const EpDispatcherOptions opt_;
  const int rank_;
  const int n_rank_;

  // Waits for the pending transfers, adding the time to wait_seconds_.
  void wait_pending();

  Phase phase_ = Phase::kIdle;
  All2AllBackend step_backend_;
  int64_t step_tokens_;  // low_latency: the step's capacity in tokens per rank
  bool step_micro_batch_ = false;  // the step runs as two micro-batches
  int64_t planned_tokens_ = 0;  // the plan's most tokens on a rank; 0 before any plan
  bool ht_bounded_ = false;     // high_throughput without the count exchange (this dispatch)
  // The most receive buffer the one-round high_throughput may set aside (for the plan's bound).
  static constexpr int64_t kMaxBoundedBytes = int64_t{32} << 20;
  double wait_seconds_ = 0;
  RoutedTokens tokens_;
  ExpertBatch batch_;
  CommHandle counts_pending_;  // ht: the count exchange, posted before the records are packed
  CommHandle pending_;         // the transfer in flight between a send half and its receive half
  int64_t dispatch_bytes_ = 0;
  int64_t combine_bytes_ = 0;

  // Buffers touched by the communication thread between a send half and the wait in the
  // matching receive half, and by the caller only outside that window. The rank's own part
  // has length 0 on the wire.
  std::vector<float> send_;         // records (ht) or per-rank blocks (ll), by destination
  std::vector<float> recv_;         // the same, by source
  std::vector<float> back_;         // combine: outputs going back, by source (the experts
                                    // write them there)
  std::vector<float> ret_;          // combine: outputs coming back, by destination
  std::vector<int64_t> send_rows_;  // [n_rank] ht: records for each rank (own included)
  std::vector<int64_t> recv_rows_;  // [n_rank] ht: records from each rank (own included)
  std::vector<int64_t> send_bytes_, recv_bytes_;  // [n_rank] the data transfer's byte counts

  // high_throughput bookkeeping. Records are numbered by destination (sent) or source
  // (received) in rank order, the rank's own records included; the wire buffers leave them out.
  std::vector<int64_t> send_first_;  // [n_rank + 1] first sent record of each destination
  std::vector<int64_t> recv_first_;  // [n_rank + 1] first received record of each source
  std::vector<int64_t> recv_base_;   // [n_rank] word offset of each source's records in recv_
  std::vector<int32_t> sent_token_;  // [sent records] token of each record
  std::vector<float> self_head_;     // [own records, 2K] headers of the records to this rank
  std::vector<int64_t> scratch_;     // cursors of a send half's packing pass
  std::vector<int64_t> fill_;        // [n_local] next batch row of each local expert
  // low_latency bookkeeping.
  std::vector<int64_t> slot_of_;  // [n_tokens, K] word offset of (t, k)'s row in ret_
  std::vector<int64_t> blk_row_;  // [n_rank, n_local] first row of (source, expert) in its buffer
  std::vector<int64_t> rows_from_;   // [n_rank] rows each source sent this rank's experts
  std::vector<int64_t> back_bytes_;  // [n_rank] the combine's part for each rank
  int64_t ll_own_bytes_ = 0;         // the used start of the own buffer
  std::vector<int64_t> sent_count_;  // [n_rank, n_local] rows this rank sent to each expert
  std::vector<int64_t> row_wire_;    // bf16: [batch rows] word offset of each row's output in
                                     // back_ (or, for the own block, ret_)
  int posted_chunks_ = 0;            // chunked combine: chunks posted this layer
  // Single-batch overlap: the step's chunks of local experts (ExpertBatch::chunk_ends), empty
  // for one transfer each way. Both directions travel in these chunks: chunk 0 of the dispatch
  // carries the counts and the first chunk's rows (in pending_), chunk c > 0 its rows
  // (dispatch_chunks_[c], waited for by ll_dispatch_chunk_ready).
  std::vector<int64_t> ll_chunks_;
  std::vector<CommHandle> dispatch_chunks_;
  std::vector<int64_t> remote_rows_;  // [n_local] rows from the other ranks for each expert
  bool own_last_ = false;             // this layer's batch runs in ll_order_own_last's order
  bool counts_first_ = false;  // this layer's dispatch: the counts, then every row (ll_chunks_
                               // is {0, L}), for own_rows_beside_dispatch
  int own_wait_chunk_ = -1, own_post_chunk_ = 0;  // ll_own_last_ready / _done
  std::vector<const float*> row_in_;  // bf16, fp8: [batch rows] each row's input on the wire
  // bf16 rows: the experts read f32 and write f32, so both sides are staged. xin_ [batch rows
  // (ll) or records (ht), n_embd] the widened inputs; xout_ [batch rows, n_embd] (ll) the
  // outputs before they are packed; back_wire_ [remote records, n_embd / 2 words] (ht) the
  // combine's packed outputs.
  std::vector<float> xin_, xout_, back_wire_;
};

}  // namespace duet
