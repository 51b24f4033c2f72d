// The common part of EpDispatcher and its high_throughput algorithm.
#include "moe/ep_dispatcher.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "kernels/ops.h"

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

EpDispatcher::EpDispatcher(Communicator& comm, const ExpertPlacement& placement,
                           const EpDispatcherOptions& opt)
    : comm_(comm),
      placement_(placement),
      opt_(opt),
      rank_(comm.rank()),
      n_rank_(comm.world_size()),
      step_backend_(opt.backend) {
  DUET_CHECK(placement.world_size == n_rank_,
             "placement for " << placement.world_size << " ranks, communicator " << n_rank_);
  DUET_CHECK(opt.max_tokens_per_rank >= 1, "max_tokens_per_rank " << opt.max_tokens_per_rank);
  send_rows_.assign(static_cast<size_t>(n_rank_), 0);
  recv_rows_.assign(static_cast<size_t>(n_rank_), 0);
  src_row_.assign(static_cast<size_t>(placement.n_local() * n_rank_), 0);
  batch_.first_expert = placement.begin(rank_);
  batch_.n_local_expert = placement.n_local();
}

void EpDispatcher::plan_step(int64_t max_tokens_per_rank) {
  expect(Phase::kIdle, "plan_step");
  step_backend_ =
      opt_.backend == All2AllBackend::kLowLatency && max_tokens_per_rank <= opt_.max_tokens_per_rank
          ? All2AllBackend::kLowLatency
          : All2AllBackend::kHighThroughput;
}

void EpDispatcher::expect(Phase want, const char* call) const {
  DUET_CHECK(phase_ == want,
             "EpDispatcher::" << call << " out of turn (phase " << static_cast<int>(phase_) << ")");
}

std::vector<int64_t> EpDispatcher::uniform(int64_t bytes_each) const {
  return std::vector<int64_t>(static_cast<size_t>(n_rank_), bytes_each);
}

void EpDispatcher::wait_pending() {
  const auto t0 = std::chrono::steady_clock::now();
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
  batch_.y.resize(batch_.x.size());
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

void EpDispatcher::combine_recv(float* out) {
  expect(Phase::kCombining, "combine_recv");
  wait_pending();
  if (step_backend_ == All2AllBackend::kHighThroughput)
    ht_combine_recv(out);
  else
    ll_combine_recv(out);
  phase_ = Phase::kIdle;
}

// A record: [K local expert ids, -1 after the last][K weights][D x], in f32 words.
void EpDispatcher::ht_dispatch_send() {
  const int64_t K = tokens_.n_expert_used, D = tokens_.n_embd, W = 2 * K + D;
  std::fill(send_rows_.begin(), send_rows_.end(), 0);
  std::vector<int64_t> last_token(static_cast<size_t>(n_rank_), -1);
  for (int64_t t = 0; t < tokens_.n_tokens; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const int r = placement_.owner(tokens_.topk_ids[t * K + k]);
      if (last_token[r] != t) last_token[r] = t, ++send_rows_[r];
    }
  }
  std::vector<int64_t> next(static_cast<size_t>(n_rank_), 0);  // next record per destination
  int64_t total = 0;
  for (int r = 0; r < n_rank_; ++r) next[r] = total, total += send_rows_[r];
  send_.resize(static_cast<size_t>(total * W));
  sent_token_.resize(static_cast<size_t>(total));
  std::fill(last_token.begin(), last_token.end(), -1);
  std::vector<int64_t> record(static_cast<size_t>(n_rank_)), n_listed(record.size());
  for (int64_t t = 0; t < tokens_.n_tokens; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = tokens_.topk_ids[t * K + k];
      const int r = placement_.owner(e);
      if (last_token[r] != t) {  // the token's first expert on rank r: start its record
        last_token[r] = t;
        record[r] = next[r]++;
        n_listed[r] = 0;
        sent_token_[record[r]] = static_cast<int32_t>(t);
        float* rec = send_.data() + record[r] * W;
        for (int64_t j = 0; j < K; ++j) put_i32(rec + j, -1), rec[K + j] = 0.0f;
        std::copy(tokens_.x + t * D, tokens_.x + (t + 1) * D, rec + 2 * K);
      }
      float* rec = send_.data() + record[r] * W;
      put_i32(rec + n_listed[r], static_cast<int32_t>(e - placement_.begin(r)));
      rec[K + n_listed[r]] = tokens_.topk_weights[t * K + k];
      ++n_listed[r];
    }
  }
  dispatch_bytes_ = total * W * 4;
  pending_ = comm_.start("ep_dispatch(high_throughput)", [this, W](CollectiveOps& ops) {
    const std::vector<int64_t> eight = uniform(8);
    ops.all_to_all_v(send_rows_.data(), eight, recv_rows_.data(), eight);
    std::vector<int64_t> sb(static_cast<size_t>(n_rank_)), rb(sb.size());
    int64_t n_recv = 0;
    for (int r = 0; r < n_rank_; ++r) {
      sb[r] = send_rows_[r] * W * 4;
      rb[r] = recv_rows_[r] * W * 4;
      n_recv += recv_rows_[r];
    }
    recv_.resize(static_cast<size_t>(n_recv * W));
    ops.all_to_all_v(send_.data(), sb, recv_.data(), rb);
  });
}

// Groups the received records' rows by local expert (a row per listed expert, in arrival
// order), remembering where each record's rows went.
void EpDispatcher::ht_dispatch_recv() {
  const int64_t K = tokens_.n_expert_used, D = tokens_.n_embd, W = 2 * K + D;
  const int64_t L = placement_.n_local();
  int64_t n_rec = 0;
  for (int64_t c : recv_rows_) n_rec += c;
  batch_.offsets.assign(static_cast<size_t>(L + 1), 0);
  for (int64_t i = 0; i < n_rec; ++i) {
    const float* rec = recv_.data() + i * W;
    for (int64_t j = 0; j < K && get_i32(rec + j) >= 0; ++j) {
      const int32_t l = get_i32(rec + j);
      DUET_CHECK(l < L, "received local expert " << l << " of " << L);
      ++batch_.offsets[l + 1];
    }
  }
  for (int64_t l = 0; l < L; ++l) batch_.offsets[l + 1] += batch_.offsets[l];
  std::vector<int64_t> fill(batch_.offsets.begin(), batch_.offsets.end() - 1);
  rec_rows_.assign(static_cast<size_t>(n_rec * K), -1);
  batch_.x.resize(static_cast<size_t>(batch_.offsets.back() * D));
  for (int64_t i = 0; i < n_rec; ++i) {
    const float* rec = recv_.data() + i * W;
    for (int64_t j = 0; j < K && get_i32(rec + j) >= 0; ++j) {
      const int64_t row = fill[get_i32(rec + j)]++;
      rec_rows_[i * K + j] = row;
      std::copy(rec + 2 * K, rec + W, batch_.x.begin() + row * D);
    }
  }
}

// Each received record goes back as one row: Σ_j weight_j · y(row_j).
void EpDispatcher::ht_combine_send() {
  const int64_t K = tokens_.n_expert_used, D = tokens_.n_embd, W = 2 * K + D;
  const int64_t n_rec = static_cast<int64_t>(rec_rows_.size()) / std::max<int64_t>(K, 1);
  back_.assign(static_cast<size_t>(n_rec * D), 0.0f);
  for (int64_t i = 0; i < n_rec; ++i) {
    const float* rec = recv_.data() + i * W;
    for (int64_t j = 0; j < K && rec_rows_[i * K + j] >= 0; ++j) {
      axpy(rec[K + j], batch_.y.data() + rec_rows_[i * K + j] * D, D, back_.data() + i * D);
    }
  }
  std::vector<int64_t> sb(static_cast<size_t>(n_rank_)), rb(sb.size());
  int64_t n_back = 0;
  for (int r = 0; r < n_rank_; ++r) {
    sb[r] = recv_rows_[r] * D * 4;
    rb[r] = send_rows_[r] * D * 4;
    n_back += send_rows_[r];
  }
  ret_.resize(static_cast<size_t>(n_back * D));
  combine_bytes_ = n_rec * D * 4;
  pending_ = comm_.start_all_to_all_v(back_.data(), std::move(sb), ret_.data(), std::move(rb));
}

void EpDispatcher::ht_combine_recv(float* out) {
  const int64_t D = tokens_.n_embd;
  for (size_t p = 0; p < sent_token_.size(); ++p) {
    add_inplace(ret_.data() + p * D, D, out + sent_token_[p] * D);
  }
}

}  // namespace duet
