// The common part of EpDispatcher and its high_throughput algorithm.
#include "moe/ep_dispatcher.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "kernels/ops.h"
#include "moe/wire_rows.h"

namespace duet {

namespace {

// Records mix int32 expert ids into f32 buffers bit for bit.
void put_i32(float* p, int32_t v) {
  std::memcpy(p, &v, 4);
}
int32_t get_i32(const float* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace

All2AllBackend parse_all2all_backend(const std::string& name) {
  if (name == "high_throughput") return All2AllBackend::kHighThroughput;
  if (name == "low_latency") return All2AllBackend::kLowLatency;
  DUET_ERROR("--all2all-backend: '" << name << "' is not high_throughput or low_latency");
}

const char* all2all_backend_name(All2AllBackend b) {
  return b == All2AllBackend::kHighThroughput ? "high_throughput" : "low_latency";
}

std::string with_bytes(const char* what, const std::vector<int64_t>& bytes) {
  int64_t sum = 0;
  for (int64_t b : bytes) sum += b;
  return std::string(what) + ", " + std::to_string(sum) + " bytes sent";
}

EpDispatcher::~EpDispatcher() {
  const std::chrono::milliseconds limit = 2 * comm_.watchdog() + std::chrono::minutes(1);
  std::vector<const CommHandle*> handles = {&counts_pending_, &pending_};
  for (const CommHandle& h : dispatch_chunks_) handles.push_back(&h);
  for (const CommHandle* h : handles) {
    if (h->settle(limit)) continue;
    std::fprintf(stderr,
                 "error: rank %d: an expert transfer is still running %lld ms after it was given "
                 "up on; ending the process rather than freeing its buffers\n",
                 rank_, static_cast<long long>(limit.count()));
    std::fflush(stderr);
    std::_Exit(1);
  }
}

EpDispatcher::EpDispatcher(Communicator& comm, const ExpertPlacement& placement,
                           const EpDispatcherOptions& opt)
    : comm_(comm),
      placement_(placement),
      opt_(opt),
      rank_(comm.rank()),
      n_rank_(comm.world_size()),
      step_backend_(opt.backend),
      step_tokens_(opt.max_tokens_per_rank) {
  DUET_CHECK(placement.world_size == n_rank_,
             "placement for " << placement.world_size << " ranks, communicator " << n_rank_);
  DUET_CHECK(opt.max_tokens_per_rank >= 1, "max_tokens_per_rank " << opt.max_tokens_per_rank);
  const size_t n = static_cast<size_t>(n_rank_);
  send_rows_.assign(n, 0);
  recv_rows_.assign(n, 0);
  send_bytes_.assign(n, 0);
  recv_bytes_.assign(n, 0);
  send_first_.assign(n + 1, 0);
  recv_first_.assign(n + 1, 0);
  recv_base_.assign(n, 0);
  fill_.assign(static_cast<size_t>(placement.n_local()), 0);
  batch_.first_expert = placement.begin(rank_);
  batch_.n_local_expert = placement.n_local();
}

void EpDispatcher::plan_step(int64_t max_tokens_per_rank, bool micro_batch) {
  expect(Phase::kIdle, "plan_step");
  step_micro_batch_ = micro_batch;
  const bool fits = max_tokens_per_rank <= opt_.max_tokens_per_rank;
  step_backend_ = opt_.backend == All2AllBackend::kLowLatency && fits
                      ? All2AllBackend::kLowLatency
                      : All2AllBackend::kHighThroughput;
  step_tokens_ = fits ? std::max<int64_t>(max_tokens_per_rank, 1) : opt_.max_tokens_per_rank;
  planned_tokens_ = std::max<int64_t>(max_tokens_per_rank, 1);
}

void EpDispatcher::expect(Phase want, const char* call) const {
  DUET_CHECK(phase_ == want,
             "EpDispatcher::" << call << " out of turn (phase " << static_cast<int>(phase_) << ")");
}

void EpDispatcher::wire_bytes(const std::vector<int64_t>& rows, int64_t words,
                              std::vector<int64_t>* bytes) const {
  for (int r = 0; r < n_rank_; ++r) (*bytes)[r] = r == rank_ ? 0 : rows[r] * words * 4;
}

void EpDispatcher::wait_pending() {
  const auto t0 = std::chrono::steady_clock::now();
  counts_pending_.wait();
  counts_pending_ = CommHandle();
  pending_.wait();
  pending_ = CommHandle();
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void EpDispatcher::dispatch_send(const RoutedTokens& tokens) {
  expect(Phase::kIdle, "dispatch_send");
  const int64_t n_pairs = tokens.n_tokens * tokens.n_expert_used;
  for (int64_t i = 0; i < n_pairs; ++i) {
    const int32_t e = tokens.topk_ids[i];
    DUET_CHECK(e >= 0 && e < placement_.n_expert,
               "expert id " << e << " of " << placement_.n_expert);
  }
  DUET_CHECK(tokens.out || tokens.n_tokens == 0, "EpDispatcher: no output rows");
  tokens_ = tokens;
  batch_.n_embd = tokens.n_embd;
  if (step_backend_ == All2AllBackend::kHighThroughput)
    ht_dispatch_send();
  else
    ll_dispatch_send();
  phase_ = Phase::kDispatching;
}

ExpertBatch& EpDispatcher::dispatch_recv() {
  expect(Phase::kDispatching, "dispatch_recv");
  wait_pending();
  if (step_backend_ == All2AllBackend::kHighThroughput)
    ht_dispatch_recv();
  else
    ll_dispatch_recv();
  phase_ = Phase::kExperts;
  return batch_;
}

void EpDispatcher::combine_send() {
  expect(Phase::kExperts, "combine_send");
  if (step_backend_ == All2AllBackend::kHighThroughput)
    ht_combine_send();
  else
    ll_combine_send();
  phase_ = Phase::kCombining;
}

void EpDispatcher::combine_recv() {
  expect(Phase::kCombining, "combine_recv");
  wait_pending();
  if (step_backend_ == All2AllBackend::kHighThroughput)
    ht_combine_recv();
  else
    ll_combine_recv();
  phase_ = Phase::kIdle;
}

bool EpDispatcher::order_own_last(bool counts_first) {
  const int64_t L = placement_.n_local();
  // 0: rows from other ranks; 1: only this rank's rows; 2: no rows.
  auto kind = [&](int64_t l) {
    const int64_t rows = batch_.offsets[l + 1] - batch_.offsets[l];
    return remote_rows_[l] > 0 ? 0 : rows > 0 ? 1 : 2;
  };
  int64_t n_kind[3] = {0, 0, 0};
  for (int64_t l = 0; l < L; ++l) ++n_kind[kind(l)];
  batch_.order.clear();
  batch_.chunk_ends.clear();
  if (n_kind[0] == 0 || n_kind[1] == 0) {  // one kind only: nothing to reorder
    if (!counts_first) return false;
    batch_.chunk_ends = {L};  // still: the rows arrive in chunk 1 of the dispatch
    own_wait_chunk_ = 0, own_post_chunk_ = 0;
  } else if (counts_first) {  // half of the own-only experts, the others', the rest
    const int64_t first = (n_kind[1] + 1) / 2;
    int64_t seen = 0;
    for (int64_t l = 0; l < L; ++l)
      if (kind(l) == 1 && seen++ < first) batch_.order.push_back(static_cast<int32_t>(l));
    for (int64_t l = 0; l < L; ++l)
      if (kind(l) == 0) batch_.order.push_back(static_cast<int32_t>(l));
    seen = 0;
    for (int64_t l = 0; l < L; ++l)
      if ((kind(l) == 1 && seen++ >= first) || kind(l) == 2)
        batch_.order.push_back(static_cast<int32_t>(l));
    batch_.chunk_ends = {first, first + n_kind[0], L};
    own_wait_chunk_ = 1, own_post_chunk_ = 1;
  } else {  // the others', then the own-only experts
    for (int k = 0; k < 3; ++k)
      for (int64_t l = 0; l < L; ++l)
        if (kind(l) == k) batch_.order.push_back(static_cast<int32_t>(l));
    batch_.chunk_ends = {n_kind[0], L};
    own_wait_chunk_ = -1, own_post_chunk_ = 0;
  }
  own_last_ = true;
  return true;
}

// A record: [K local expert ids, -1 after the last][K weights][D x], in f32 words. Records to
// this rank keep only their header (in self_head_); their rows stay in tokens_.x.
void EpDispatcher::ht_dispatch_send() {
  const int64_t K = tokens_.n_expert_used, D = tokens_.n_embd;
  const WireRows wire(opt_.row_dtype, D);
  const int64_t W = 2 * K + wire.words();
  scratch_.resize(static_cast<size_t>(4 * n_rank_));
  int64_t* last_token = scratch_.data();  // [n_rank] the last token given a record there
  int64_t* next = last_token + n_rank_;   // [n_rank] the next record number there
  int64_t* record = next + n_rank_;       // [n_rank] the current token's record there
  int64_t* n_listed = record + n_rank_;   // [n_rank] experts listed in it so far
  std::fill(send_rows_.begin(), send_rows_.end(), 0);
  std::fill(last_token, last_token + n_rank_, -1);
  for (int64_t t = 0; t < tokens_.n_tokens; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const int r = placement_.owner(tokens_.topk_ids[t * K + k]);
      if (last_token[r] != t) last_token[r] = t, ++send_rows_[r];
    }
  }
  // A planned step bounds what each rank can send here (a record per token), so when that fits
  // kMaxBoundedBytes the records go in one round, into room for the bound; otherwise the counts
  // go first, travelling while the records are packed. The choice depends on the plan alone, so
  // every rank makes the same one.
  const int64_t bound = planned_tokens_ * W * 4;
  ht_bounded_ = planned_tokens_ > 0 && (n_rank_ - 1) * bound <= kMaxBoundedBytes;
  if (ht_bounded_) {
    DUET_CHECK(tokens_.n_tokens <= planned_tokens_, "high_throughput: " << tokens_.n_tokens
                                                    << " tokens in a step planned for "
                                                    << planned_tokens_);
  } else {
    const std::vector<int64_t> eight(static_cast<size_t>(n_rank_), 8);
    counts_pending_ = comm_.start_all_to_all_v(send_rows_.data(), eight, recv_rows_.data(), eight);
  }

  for (int r = 0; r < n_rank_; ++r) send_first_[r + 1] = send_first_[r] + send_rows_[r];
  const int64_t n_sent = send_first_[n_rank_], n_self = send_rows_[rank_];
  send_.resize(static_cast<size_t>((n_sent - n_self) * W));
  self_head_.resize(static_cast<size_t>(n_self * 2 * K));
  sent_token_.resize(static_cast<size_t>(n_sent));
  for (int r = 0; r < n_rank_; ++r) next[r] = send_first_[r];
  std::fill(last_token, last_token + n_rank_, -1);
  // Record g's header: in send_ past the own records, which it leaves out, or in self_head_.
  auto head_of = [&](int r, int64_t g) {
    if (r == rank_) return self_head_.data() + (g - send_first_[r]) * 2 * K;
    return send_.data() + (r < rank_ ? g : g - n_self) * W;
  };
  for (int64_t t = 0; t < tokens_.n_tokens; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = tokens_.topk_ids[t * K + k];
      const int r = placement_.owner(e);
      if (last_token[r] != t) {  // the token's first expert on rank r: start its record
        last_token[r] = t;
        record[r] = next[r]++;
        n_listed[r] = 0;
        sent_token_[record[r]] = static_cast<int32_t>(t);
        float* head = head_of(r, record[r]);
        for (int64_t j = 0; j < K; ++j) put_i32(head + j, -1), head[K + j] = 0.0f;
        if (r != rank_) wire.put(head + 2 * K, tokens_.x + t * D);
      }
      float* head = head_of(r, record[r]);
      put_i32(head + n_listed[r], static_cast<int32_t>(e - placement_.begin(r)));
      head[K + n_listed[r]] = tokens_.topk_weights[t * K + k];
      ++n_listed[r];
    }
  }
  dispatch_bytes_ = n_sent * W * 4;
  wire_bytes(send_rows_, W, &send_bytes_);
  if (ht_bounded_) {
    std::vector<int64_t> capacity(static_cast<size_t>(n_rank_), bound);
    capacity[rank_] = 0;
    recv_.resize(static_cast<size_t>((n_rank_ - 1) * bound / 4));
    pending_ = comm_.start(with_bytes("ep_dispatch(high_throughput, bounded)", send_bytes_),
                           [this, W, capacity = std::move(capacity)](CollectiveOps& ops) {
                             ops.all_to_all_bounded(send_.data(), send_bytes_, send_bytes_,
                                                    recv_.data(), capacity, &recv_bytes_);
                             for (int s = 0; s < n_rank_; ++s) {
                               if (s != rank_ && recv_bytes_[s] % (4 * W) != 0) {
                                 DUET_ERROR("high_throughput dispatch: rank "
                                            << s << " sent " << recv_bytes_[s]
                                            << " bytes, not a whole number of " << 4 * W
                                            << "-byte records");
                               }
                               recv_rows_[s] = s == rank_ ? send_rows_[s] : recv_bytes_[s] / 4 / W;
                             }
                           });
    return;
  }
  // Runs after the count exchange on the communication thread, which wrote recv_rows_.
  pending_ = comm_.start(with_bytes("ep_dispatch(high_throughput)", send_bytes_),
                         [this, W](CollectiveOps& ops) {
    wire_bytes(recv_rows_, W, &recv_bytes_);
    int64_t n_recv = 0;
    for (int64_t b : recv_bytes_) n_recv += b / 4;
    recv_.resize(static_cast<size_t>(n_recv));
    ops.all_to_all_v(send_.data(), send_bytes_, recv_.data(), recv_bytes_);
  });
}

const float* EpDispatcher::ht_head(int s, int64_t i) const {
  const int64_t K = tokens_.n_expert_used;
  const int64_t W = 2 * K + WireRows(opt_.row_dtype, tokens_.n_embd).words();
  if (s == rank_) return self_head_.data() + i * 2 * K;
  return recv_.data() + recv_base_[s] + i * W;
}

const float* EpDispatcher::ht_row(int s, int64_t i) const {
  if (s == rank_) return tokens_.x + sent_token_[send_first_[s] + i] * tokens_.n_embd;
  return ht_head(s, i) + 2 * tokens_.n_expert_used;
}

// The batch: a row per (record, listed expert), grouped by local expert in arrival order (by
// source rank, then record), reading the record's row where it arrived (or, for the rank's own
// records, in the caller's hidden states; bf16 rows: widened, or for the own records rounded, into
// xin_). The rows of one record share its output row: in
// back_, the combine's send buffer (cleared first), or, for the own records, the token's row of
// the caller's output, which the experts add to directly.
void EpDispatcher::ht_dispatch_recv() {
  const int64_t K = tokens_.n_expert_used, D = tokens_.n_embd;
  const int64_t L = placement_.n_local();
  for (int s = 0; s < n_rank_; ++s) recv_first_[s + 1] = recv_first_[s] + recv_rows_[s];
  DUET_CHECK(recv_rows_[rank_] == send_rows_[rank_],
             "own records " << recv_rows_[rank_] << " vs " << send_rows_[rank_]);
  const int64_t n_rec = recv_first_[n_rank_], n_self = recv_rows_[rank_];
  // Where each source's records start in recv_: back to back, or each in its bounded room.
  const WireRows wire(opt_.row_dtype, D);
  const int64_t W = 2 * K + wire.words();
  batch_.chunk_ends.clear();  // one transfer each way (see the header)
  batch_.chunk_done = nullptr;
  batch_.chunk_ready = nullptr;
  if (wire.converted()) xin_.resize(static_cast<size_t>(n_rec * D));
  for (int s = 0, pos = 0; s < n_rank_; ++s) {
    if (s == rank_) continue;
    recv_base_[s] = ht_bounded_ ? pos * planned_tokens_ * W
                                : (recv_first_[s] - (s < rank_ ? 0 : n_self)) * W;
    ++pos;
  }
  batch_.offsets.assign(static_cast<size_t>(L + 1), 0);
  remote_rows_.assign(static_cast<size_t>(L), 0);
  for (int s = 0; s < n_rank_; ++s) {
    for (int64_t i = 0; i < recv_rows_[s]; ++i) {
      const float* head = ht_head(s, i);
      for (int64_t j = 0; j < K && get_i32(head + j) >= 0; ++j) {
        const int32_t l = get_i32(head + j);
        DUET_CHECK(l < L, "received local expert " << l << " of " << L);
        ++batch_.offsets[l + 1];
        if (s != rank_) ++remote_rows_[l];
      }
    }
  }
  for (int64_t l = 0; l < L; ++l) batch_.offsets[l + 1] += batch_.offsets[l];
  std::copy(batch_.offsets.begin(), batch_.offsets.end() - 1, fill_.begin());
  batch_.resize_rows();
  back_.resize(static_cast<size_t>((n_rec - n_self) * D));
  batch_.clear.clear();
  for (int s = 0; s < n_rank_; ++s) {
    for (int64_t i = 0; i < recv_rows_[s]; ++i) {
      const float* head = ht_head(s, i);
      const float* row = ht_row(s, i);
      const int64_t g = recv_first_[s] + i;
      if (wire.converted()) {
        float* x = xin_.data() + g * D;
        if (s == rank_) wire.round(row, x);
        else wire.get(row, x);
        row = x;
      }
      float* out = s == rank_ ? tokens_.out + sent_token_[send_first_[s] + i] * D
                              : back_.data() + (s < rank_ ? g : g - n_self) * D;
      if (s != rank_) batch_.clear.push_back(out);
      for (int64_t j = 0; j < K && get_i32(head + j) >= 0; ++j) {
        const int64_t r = fill_[get_i32(head + j)]++;
        batch_.x[r] = row;
        batch_.out[r] = out;
        batch_.weight[r] = head[K + j];
      }
    }
  }
  batch_.order.clear();
  own_last_ = false;
  posted_chunks_ = 0;
  combine_bytes_ = 0;  // the combine counts its own
  if (opt_.own_experts_last && n_rank_ > 1 && order_own_last(false)) {
    // A record's row sums the token's experts here: the rows going back are final once the
    // experts with other ranks' rows ran. The runner zeroes no row (the own records' rows are
    // the caller's output), so the records' rows are zeroed here.
    std::fill(back_.begin(), back_.end(), 0.0f);
    batch_.clear.clear();
    batch_.chunk_done = [this](int c) {
      if (c == own_post_chunk_) ht_post_combine();
      ++posted_chunks_;
    };
  }
}

// The experts have reduced each record into one row in back_: it goes back as it is (with the
// own experts last, it left already).
void EpDispatcher::ht_combine_send() {
  if (own_last_) {
    if (posted_chunks_ == 0) ht_post_combine();  // a runner that ignored the chunks
    return;
  }
  ht_post_combine();
}

void EpDispatcher::ht_post_combine() {
  const int64_t D = tokens_.n_embd;
  const WireRows wire(opt_.combine_rows(), D);
  const int64_t RW = wire.words();
  wire_bytes(recv_rows_, RW, &send_bytes_);
  wire_bytes(send_rows_, RW, &recv_bytes_);
  ret_.resize(static_cast<size_t>((send_first_[n_rank_] - send_rows_[rank_]) * RW));
  combine_bytes_ = recv_first_[n_rank_] * RW * 4;
  const float* send = back_.data();
  if (wire.converted()) {  // pack the reduced rows
    const int64_t n = static_cast<int64_t>(back_.size()) / D;
    back_wire_.resize(static_cast<size_t>(n * RW));
    for (int64_t i = 0; i < n; ++i) wire.put(back_wire_.data() + i * RW, back_.data() + i * D);
    send = back_wire_.data();
  }
  pending_ = comm_.start(with_bytes("ep_combine(high_throughput)", send_bytes_),
                         [send, recv = ret_.data(), sb = send_bytes_,
                          rb = recv_bytes_](CollectiveOps& ops) {
                           ops.all_to_all_v(send, sb, recv, rb);
                         });
}

// out[t] += each of t's records' row from the other ranks, in rank order, token by token so
// that each output row is read and written once (the experts here added theirs already). Each
// destination's records are in token order.
void EpDispatcher::ht_combine_recv() {
  const int64_t D = tokens_.n_embd;
  const WireRows wire(opt_.combine_rows(), D);
  const int64_t n_self = send_rows_[rank_];
  scratch_.resize(static_cast<size_t>(n_rank_));
  int64_t* next = scratch_.data();  // [n_rank] the next record from each destination
  std::copy(send_first_.begin(), send_first_.end() - 1, next);
  for (int64_t t = 0; t < tokens_.n_tokens; ++t) {
    float* o = tokens_.out + t * D;
    for (int r = 0; r < n_rank_; ++r) {
      const int64_t g = next[r];
      if (r == rank_ || g == send_first_[r + 1] || sent_token_[g] != t) continue;
      ++next[r];
      wire.add(ret_.data() + (r < rank_ ? g : g - n_self) * wire.words(), 1.0f, o);
    }
  }
}

}  // namespace duet
