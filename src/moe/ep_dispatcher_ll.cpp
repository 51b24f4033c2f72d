// EpDispatcher's low_latency algorithm: fixed-capacity buffers, one round each way, no count
// exchange. The buffer for (or from) one rank is BW = L + R·RW f32 words: the row count of each
// of that rank's L local experts (int32, bit for bit), then R = min(K, L) · C rows of RW words
// (D f32, or D bf16 packed in D / 2 words), expert
// l's rows after expert l - 1's. C is the step's capacity in tokens: a token sends at most
// min(K, L) rows to one rank (its K experts are distinct), so no rank can overflow what every
// rank expects. The same layout carries the outputs back, so a (token, k) pair's output sits at
// the word offset its input had. The buffers of the other ranks lie back to back in rank order;
// the rank's own buffer comes last and is read in place, never sent. Only the used start of a
// buffer (the counts and the rows placed) travels, in one round of point-to-point messages whose
// receiver learns the length from the message, as DeepEP's low-latency kernels write only the
// slots they fill.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kernels/ops.h"
#include "moe/ep_dispatcher.h"
#include "moe/wire_rows.h"

namespace duet {

namespace {
void put_count(float* p, int64_t v) {
  const int32_t c = static_cast<int32_t>(v);
  std::memcpy(p, &c, 4);
}
int64_t get_count(const float* p) {
  int32_t c;
  std::memcpy(&c, p, 4);
  return c;
}

struct LlLayout {
  int64_t L, R, RW, BW;  // local experts (the header's words), row capacity, words per row,
                         // words per rank
};

LlLayout ll_layout(int64_t L, int64_t K, int64_t row_words, int64_t C) {
  const int64_t R = std::min(K, L) * C;
  return {L, R, row_words, L + R * row_words};
}

// The place of rank r's buffer in this rank's: the others in rank order, then its own.
int64_t ll_pos(int r, int rank, int n_rank) {
  return r == rank ? n_rank - 1 : r < rank ? r : r - 1;
}

// One bounded all-to-all between runs of words inside the ll buffers (a chunk): send_bytes[r]
// from send + send_at[r] to rank r, and from each rank s want[s] bytes into recv + recv_at[s];
// the own rank's runs stay out (0 bytes). The runs lie in rank order, each room reaching to the
// next rank's run. Throws naming `what`, the chunk and the rank whose part is not as long as
// expected.
void runs_all_to_all(CollectiveOps& ops, int rank, float* send, const std::vector<int64_t>& send_at,
                     const std::vector<int64_t>& send_bytes, float* recv,
                     const std::vector<int64_t>& recv_at, const std::vector<int64_t>& want,
                     const char* what, int c) {
  const int n_rank = static_cast<int>(want.size());
  auto rooms = [&](const std::vector<int64_t>& at, const std::vector<int64_t>& bytes) {
    std::vector<int64_t> room(want.size(), 0);
    int prev = -1;
    for (int r = 0; r < n_rank; ++r) {
      if (r == rank) continue;
      if (prev >= 0) room[prev] = (at[r] - at[prev]) * 4;
      prev = r;
    }
    if (prev >= 0) room[prev] = bytes[prev];
    return room;
  };
  const int first = rank == 0 ? 1 : 0;
  float* s0 = n_rank > 1 ? send + send_at[first] : send;
  float* r0 = n_rank > 1 ? recv + recv_at[first] : recv;
  std::vector<int64_t> got(want.size(), 0);
  ops.all_to_all_bounded(s0, send_bytes, rooms(send_at, send_bytes), r0, rooms(recv_at, want),
                         &got);
  for (int s = 0; s < n_rank; ++s) {
    if (s != rank && got[s] != want[s]) {
      DUET_ERROR(what << ", chunk " << c << ": rank " << s << " sent " << got[s]
                      << " bytes, expected " << want[s]);
    }
  }
}
// A chunked dispatch's receive runs for experts [l0, l1): where each source's rows of them go in
// recv (word offsets) and their bytes, from the counts its chunk 0 brought (got0: chunk 0's
// lengths; a source whose chunk 0 was too short for its counts expects nothing, dispatch_recv
// reports it). Throws naming the source when its counts overflow the room.
void ll_chunk_runs(const float* recv, const std::vector<int64_t>& got0, int rank,
                   const LlLayout& lay, int64_t l0, int64_t l1, std::vector<int64_t>* at,
                   std::vector<int64_t>* want) {
  const int n_rank = static_cast<int>(got0.size());
  at->assign(got0.size(), 0);
  want->assign(got0.size(), 0);
  for (int s = 0; s < n_rank; ++s) {
    const int64_t base = ll_pos(s, rank, n_rank) * lay.BW;
    (*at)[s] = base + lay.L;
    if (s == rank || got0[s] < lay.L * 4) continue;
    int64_t before = 0, rows = 0;
    for (int64_t l = 0; l < l1; ++l) {
      const int64_t k = get_count(recv + base + l);
      if (k < 0 || before + rows + k > lay.R) {
        DUET_ERROR("low_latency dispatch: rank " << s << " sent " << k << " rows for expert " << l
                                                 << " (room for " << lay.R - before - rows << ")");
      }
      (l < l0 ? before : rows) += k;
    }
    (*at)[s] = base + lay.L + before * lay.RW;
    (*want)[s] = rows * lay.RW * 4;
  }
}
}  // namespace

void EpDispatcher::ll_dispatch_send() {
  const int64_t K = tokens_.n_expert_used, D = tokens_.n_embd, C = step_tokens_;
  const WireRows wire(opt_.row_dtype, D);
  const LlLayout lay = ll_layout(placement_.n_local(), K, wire.words(), C);
  const int64_t L = lay.L, RW = lay.RW;
  if (tokens_.n_tokens > C) {
    DUET_ERROR("low_latency all-to-all: "
               << tokens_.n_tokens << " tokens exceed the capacity "
               << "of " << C << " per rank (max_tokens_per_rank or the step's plan); use "
               << "high_throughput for large batches");
  }
  const size_t words = static_cast<size_t>(n_rank_ * lay.BW);
  send_.resize(words);
  recv_.resize(words);
  // Rows for (rank r, local expert l): counted, then placed after the rows of r's experts < l.
  sent_count_.assign(static_cast<size_t>(n_rank_ * L), 0);
  scratch_.assign(static_cast<size_t>(n_rank_ * L), 0);
  int64_t* count = sent_count_.data();  // [n_rank, L]
  int64_t* next = scratch_.data();      // [n_rank, L] next row of the block
  for (int64_t i = 0; i < tokens_.n_tokens * K; ++i) {
    const int32_t e = tokens_.topk_ids[i];
    ++count[placement_.owner(e) * L + (e - placement_.begin(placement_.owner(e)))];
  }
  dispatch_bytes_ = 0;
  for (int r = 0; r < n_rank_; ++r) {
    int64_t rows = 0;
    for (int64_t l = 0; l < L; ++l) {
      next[r * L + l] = rows;
      rows += count[r * L + l];
      put_count(send_.data() + ll_pos(r, rank_, n_rank_) * lay.BW + l, count[r * L + l]);
    }
    DUET_CHECK(rows <= lay.R, "low_latency: " << rows << " rows for rank " << r << ", room for "
                                              << lay.R << " (a token lists an expert twice?)");
    // Only the used start of the buffer travels: the counts and the rows placed.
    const int64_t used = (L + rows * RW) * 4;
    send_bytes_[r] = r == rank_ ? 0 : used;
    if (r == rank_) ll_own_bytes_ = used;
    dispatch_bytes_ += used;
  }
  // The outputs come back in the same places in the combine's layout (its rows may be wider).
  const LlLayout back = ll_layout(L, K, WireRows(opt_.combine_rows(), D).words(), C);
  slot_of_.resize(static_cast<size_t>(tokens_.n_tokens * K));
  for (int64_t t = 0; t < tokens_.n_tokens; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = tokens_.topk_ids[t * K + k];
      const int r = placement_.owner(e);
      const int64_t pos = ll_pos(r, rank_, n_rank_);
      const int64_t i = next[r * L + (e - placement_.begin(r))]++;
      wire.put(send_.data() + pos * lay.BW + L + i * RW, tokens_.x + t * D);
      slot_of_[t * K + k] = pos * back.BW + L + i * back.RW;
    }
  }
  ll_plan_chunks(L, RW);
  if (ll_chunks_.empty()) {
    ll_transfer("ep_dispatch(low_latency)", send_.data(), send_bytes_, recv_.data(), lay.BW);
    return;
  }
  // Chunk 0: each buffer's counts and the rows of the first chunk's experts (the receiver learns
  // the length from the message); then one transfer per later chunk.
  std::vector<int64_t> first(static_cast<size_t>(n_rank_), 0);
  for (int r = 0; r < n_rank_; ++r) {
    if (r == rank_) continue;
    int64_t rows = 0;
    for (int64_t l = 0; l < ll_chunks_[0]; ++l) rows += count[r * L + l];
    first[r] = (L + rows * RW) * 4;
  }
  ll_transfer("ep_dispatch(low_latency, chunk)", send_.data(), first, recv_.data(), lay.BW);
  dispatch_chunks_.resize(ll_chunks_.size());
  for (size_t c = 1; c < ll_chunks_.size(); ++c)
    dispatch_chunks_[c] = ll_dispatch_chunk(static_cast<int>(c), lay.BW);
}

void EpDispatcher::ll_plan_chunks(int64_t L, int64_t row_words) {
  ll_chunks_.clear();
  if (step_micro_batch_ && !opt_.chunk_micro_batches) return;
  int64_t n_chunks = std::min<int64_t>(opt_.combine_chunks, L);
  if (opt_.min_chunk_bytes > 0) {  // the same on every rank: the step's capacity is planned
    const int64_t rows_bytes = step_tokens_ * tokens_.n_expert_used * row_words * 4;
    n_chunks = std::min(n_chunks, std::max<int64_t>(1, rows_bytes / opt_.min_chunk_bytes));
  }
  if (n_chunks > 1)
    for (int64_t c = 1; c <= n_chunks; ++c) ll_chunks_.push_back(c * L / n_chunks);
  // The counts ahead of the rows: chunk 0 carries no expert's rows, chunk 1 all of them.
  counts_first_ =
      ll_chunks_.empty() && opt_.own_experts_last && opt_.own_rows_beside_dispatch && n_rank_ > 1;
  if (counts_first_) ll_chunks_ = {0, L};
}

// The sender knows its runs; the receiver's come from the counts that arrived with chunk 0,
// read on the communication thread, which ran chunk 0 before this one.
CommHandle EpDispatcher::ll_dispatch_chunk(int c, int64_t BW) {
  const int64_t L = placement_.n_local(), l0 = ll_chunks_[c - 1], l1 = ll_chunks_[c];
  const int64_t RW = WireRows(opt_.row_dtype, tokens_.n_embd).words();
  const int64_t R = ll_layout(L, tokens_.n_expert_used, RW, step_tokens_).R;
  const size_t n = static_cast<size_t>(n_rank_);
  std::vector<int64_t> send_at(n, 0), send_bytes(n, 0);
  for (int r = 0; r < n_rank_; ++r) {
    int64_t before = 0, rows = 0;
    for (int64_t l = 0; l < l1; ++l) (l < l0 ? before : rows) += sent_count_[r * L + l];
    send_at[r] = ll_pos(r, rank_, n_rank_) * BW + L + before * RW;
    send_bytes[r] = r == rank_ ? 0 : rows * RW * 4;
  }
  // Named before the call: its arguments' order is unspecified, and the lambda takes the bytes.
  std::string name = with_bytes("ep_dispatch(low_latency, chunk)", send_bytes);
  return comm_.start(std::move(name), [this, c, L, l0, l1, RW, R, BW, send_at = std::move(send_at),
                                       send_bytes = std::move(send_bytes)](CollectiveOps& ops) {
    std::vector<int64_t> recv_at, want;
    ll_chunk_runs(recv_.data(), recv_bytes_, rank_, {L, R, RW, BW}, l0, l1, &recv_at, &want);
    runs_all_to_all(ops, rank_, send_.data(), send_at, send_bytes, recv_.data(), recv_at, want,
                    "low_latency dispatch", c);
  });
}

void EpDispatcher::ll_dispatch_chunk_ready(int c) {
  if (c > 0) {
    const auto t0 = std::chrono::steady_clock::now();
    dispatch_chunks_[c].wait();
    dispatch_chunks_[c] = CommHandle();
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const WireRows wire(opt_.row_dtype, tokens_.n_embd);
  if (!wire.converted()) return;
  const int64_t l0 = c == 0 ? 0 : ll_chunks_[c - 1], l1 = ll_chunks_[c];
  for (int64_t r = batch_.offsets[l0]; r < batch_.offsets[l1]; ++r)
    wire.get(row_in_[r], xin_.data() + r * tokens_.n_embd);
}

// One round between the fixed buffers (the own one, last, stays out): each part is the used
// start of its buffer, and the receiver learns its length from the message.
void EpDispatcher::ll_transfer(const char* what, const float* send,
                               const std::vector<int64_t>& bytes, float* recv, int64_t bw) {
  std::vector<int64_t> room(static_cast<size_t>(n_rank_), bw * 4);
  room[rank_] = 0;
  pending_ = comm_.start(with_bytes(what, bytes),
                         [this, send, bytes, recv, room = std::move(room)](CollectiveOps& ops) {
    ops.all_to_all_bounded(send, bytes, room, recv, room, &recv_bytes_);
  });
}

// Expert l's rows: those from source 0, then source 1, ..., read where they arrived (f32 rows)
// or widened into xin_ (bf16). Each row's output goes to the slot its input had, in back_ (or,
// for the own block, straight in ret_), with weight 1: the token's owner applies the weights.
// bf16 outputs are written to xout_ first and packed into those slots as they leave.
void EpDispatcher::ll_dispatch_recv() {
  const int64_t D = tokens_.n_embd;
  const WireRows wire(opt_.row_dtype, D);
  const LlLayout lay =
      ll_layout(placement_.n_local(), tokens_.n_expert_used, wire.words(), step_tokens_);
  const int64_t L = lay.L, RW = lay.RW;
  auto block = [&](int s) {
    return (s == rank_ ? send_.data() : recv_.data()) + ll_pos(s, rank_, n_rank_) * lay.BW;
  };
  blk_row_.resize(static_cast<size_t>(n_rank_ * L));
  rows_from_.assign(static_cast<size_t>(n_rank_), 0);
  remote_rows_.assign(static_cast<size_t>(L), 0);
  batch_.offsets.assign(static_cast<size_t>(L + 1), 0);
  for (int s = 0; s < n_rank_; ++s) {
    // A message from another rank is the counts, then the rows they count: check both against
    // what arrived before reading either.
    const int64_t got = s == rank_ ? ll_own_bytes_ : recv_bytes_[s];
    if (got < L * 4) {
      DUET_ERROR("low_latency dispatch: rank " << s << " sent " << got << " bytes, fewer than its "
                                               << L << " row counts");
    }
    int64_t rows = 0;
    for (int64_t l = 0; l < L; ++l) {
      const int64_t c = get_count(block(s) + l);
      if (c < 0 || rows + c > lay.R) {
        DUET_ERROR("low_latency dispatch: rank " << s << " sent " << c << " rows for expert " << l
                                                 << " (room for " << lay.R - rows << ")");
      }
      blk_row_[s * L + l] = rows;
      rows += c;
      batch_.offsets[l + 1] += c;
      if (s != rank_) remote_rows_[l] += c;
    }
    rows_from_[s] = rows;
    // A chunked dispatch's first message carries the first chunk's rows (the own buffer is all
    // there).
    int64_t arrived = rows;
    if (!ll_chunks_.empty() && s != rank_) {
      const int64_t l1 = ll_chunks_[0];  // 0 when the counts travel alone
      arrived = l1 == 0 ? 0 : blk_row_[s * L + l1 - 1] + get_count(block(s) + l1 - 1);
    }
    if (got != (L + arrived * RW) * 4) {
      DUET_ERROR("low_latency dispatch: rank " << s << " sent " << got << " bytes for " << arrived
                                               << " rows, expected " << (L + arrived * RW) * 4);
    }
  }
  for (int64_t l = 0; l < L; ++l) batch_.offsets[l + 1] += batch_.offsets[l];
  batch_.resize_rows();
  batch_.clear.clear();
  const WireRows back_wire(opt_.combine_rows(), D);
  const LlLayout back = ll_layout(L, tokens_.n_expert_used, back_wire.words(), step_tokens_);
  back_.resize(static_cast<size_t>(n_rank_ * back.BW));
  ret_.resize(back_.size());
  const size_t n_rows = static_cast<size_t>(batch_.n_rows());
  if (wire.converted()) xin_.resize(n_rows * static_cast<size_t>(D)), row_in_.resize(n_rows);
  if (back_wire.converted())
    xout_.resize(n_rows * static_cast<size_t>(D)), row_wire_.resize(n_rows);
  int64_t row = 0;
  for (int64_t l = 0; l < L; ++l) {
    for (int s = 0; s < n_rank_; ++s) {
      const int64_t pos = ll_pos(s, rank_, n_rank_);
      const int64_t at = pos * lay.BW + L + blk_row_[s * L + l] * RW;
      const int64_t back_at = pos * back.BW + L + blk_row_[s * L + l] * back.RW;
      const float* in = (s == rank_ ? send_.data() : recv_.data()) + at;
      float* out = (s == rank_ ? ret_.data() : back_.data()) + back_at;
      for (int64_t j = 0, n = get_count(block(s) + l); j < n; ++j, ++row) {
        if (wire.converted()) {  // widened when it has arrived (ll_dispatch_chunk_ready)
          row_in_[row] = in + j * RW;
          batch_.x[row] = xin_.data() + row * D;
          if (counts_first_ && s == rank_) wire.get(row_in_[row], xin_.data() + row * D);
        } else {
          batch_.x[row] = in + j * D;
        }
        if (back_wire.converted()) {  // packed into its slot as it leaves
          batch_.out[row] = xout_.data() + row * D;
          row_wire_[row] = back_at + j * back.RW;
        } else {
          batch_.out[row] = out + j * D;
        }
        batch_.clear.push_back(batch_.out[row]);
        batch_.weight[row] = 1.0f;
      }
    }
  }
  posted_chunks_ = 0;
  combine_bytes_ = 0;  // the chunks add theirs
  batch_.chunk_ends = ll_chunks_;
  batch_.chunk_done = nullptr;
  batch_.chunk_ready = nullptr;
  batch_.order.clear();
  own_last_ = false;
  if (counts_first_) {  // the own rows are here (widened above); the others come in chunk 1
    ll_order_own_last();
    return;
  }
  if (!ll_chunks_.empty()) {
    batch_.chunk_done = [this](int c) { ll_combine_chunk(c); };
    batch_.chunk_ready = [this](int c) { ll_dispatch_chunk_ready(c); };
    return;
  }
  if (wire.converted())
    for (int64_t r = 0; r < batch_.n_rows(); ++r) wire.get(row_in_[r], xin_.data() + r * D);
  if (opt_.own_experts_last) ll_order_own_last();
}

void EpDispatcher::ll_order_own_last() {
  if (!order_own_last(counts_first_)) return;
  batch_.chunk_ready = [this](int c) { ll_own_last_ready(c); };
  batch_.chunk_done = [this](int c) { ll_own_last_done(c); };
}

void EpDispatcher::ll_own_last_ready(int c) {
  if (c == own_wait_chunk_) ll_dispatch_chunk_ready(1);  // the other ranks' rows (widened)
}

void EpDispatcher::ll_own_last_done(int c) {
  const int n_chunks = static_cast<int>(batch_.chunk_ends.size());
  DUET_CHECK(c == posted_chunks_ && c < n_chunks,
             "own-last chunk " << c << " done out of turn (" << posted_chunks_ << " done)");
  const int64_t p0 = c == 0 ? 0 : batch_.chunk_ends[c - 1], p1 = batch_.chunk_ends[c];
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t l = batch_.expert_at(p);
    ll_pack_rows(batch_.offsets[l], batch_.offsets[l + 1]);
  }
  if (c == own_post_chunk_) ll_post_combine();
  ++posted_chunks_;
}

void EpDispatcher::ll_pack_rows(int64_t r0, int64_t r1) {
  const WireRows wire(opt_.combine_rows(), tokens_.n_embd);
  if (!wire.converted()) return;  // the experts wrote f32 rows in place
  const int64_t BW =
      ll_layout(placement_.n_local(), tokens_.n_expert_used, wire.words(), step_tokens_).BW;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t at = row_wire_[r];
    wire.put((at >= (n_rank_ - 1) * BW ? ret_.data() : back_.data()) + at,
             xout_.data() + r * tokens_.n_embd);
  }
}

// The chunk's rows of each source are one run of its block (experts l0..l1 - 1, in order), and
// the rows this rank sent to each rank's experts of the chunk one run of its own buffer: one
// bounded all-to-all between those runs, each room reaching to the next rank's run.
void EpDispatcher::ll_combine_chunk(int c) {
  DUET_CHECK(c == posted_chunks_ && c < static_cast<int>(batch_.chunk_ends.size()),
             "combine chunk " << c << " posted out of turn (" << posted_chunks_ << " of "
                              << batch_.chunk_ends.size() << " posted)");
  const int64_t D = tokens_.n_embd;
  const WireRows wire(opt_.combine_rows(), D);
  const LlLayout lay =
      ll_layout(placement_.n_local(), tokens_.n_expert_used, wire.words(), step_tokens_);
  const int64_t L = lay.L, RW = lay.RW;
  const int64_t l0 = c == 0 ? 0 : batch_.chunk_ends[c - 1], l1 = batch_.chunk_ends[c];
  ll_pack_rows(batch_.offsets[l0], batch_.offsets[l1]);  // the chunk's outputs into their slots
  // Word offsets of the runs, by rank (the own rank's run stays in place: 0 bytes).
  const size_t n = static_cast<size_t>(n_rank_);
  std::vector<int64_t> send_at(n), send_bytes(n, 0), recv_at(n), recv_bytes(n, 0);
  for (int r = 0; r < n_rank_; ++r) {
    const int64_t base = ll_pos(r, rank_, n_rank_) * lay.BW + L;
    int64_t before = 0, rows_out = 0;
    for (int64_t l = 0; l < l0; ++l) before += sent_count_[r * L + l];
    for (int64_t l = l0; l < l1; ++l) rows_out += sent_count_[r * L + l];
    // Source r's rows of experts [l0, l1): from its first row of l0 to its first of l1.
    const int64_t rows_in =
        r == rank_ ? 0 : (l1 < L ? blk_row_[r * L + l1] : rows_from_[r]) - blk_row_[r * L + l0];
    send_at[r] = base + blk_row_[r * L + l0] * RW;
    send_bytes[r] = r == rank_ ? 0 : rows_in * RW * 4;
    recv_at[r] = base + before * RW;
    recv_bytes[r] = r == rank_ ? 0 : rows_out * RW * 4;
    combine_bytes_ += (r == rank_ ? rows_out : rows_in) * RW * 4;
  }
  pending_ =
      comm_.start(with_bytes("ep_combine(low_latency, chunk)", send_bytes),
                  [this, send_at, send_bytes, recv_at, want = recv_bytes, c](CollectiveOps& ops) {
                    runs_all_to_all(ops, rank_, back_.data(), send_at, send_bytes, ret_.data(),
                                    recv_at, want, "low_latency combine", c);
                  });
  ++posted_chunks_;
}

// The experts wrote the outputs in the layout their inputs came in: they go back as they are,
// as much of each buffer as came from its rank (or the chunks the experts did not post yet).
void EpDispatcher::ll_combine_send() {
  if (own_last_) {  // posted after its chunk (a runner that ignored chunks: here)
    while (posted_chunks_ < static_cast<int>(batch_.chunk_ends.size())) {
      if (posted_chunks_ == own_wait_chunk_) ll_own_last_ready(posted_chunks_);
      ll_own_last_done(posted_chunks_);
    }
    return;
  }
  if (!batch_.chunk_ends.empty()) {
    while (posted_chunks_ < static_cast<int>(batch_.chunk_ends.size()))
      ll_combine_chunk(posted_chunks_);
    return;
  }
  ll_pack_rows(0, batch_.n_rows());
  ll_post_combine();
}

void EpDispatcher::ll_post_combine() {
  const WireRows wire(opt_.combine_rows(), tokens_.n_embd);
  const LlLayout lay =
      ll_layout(placement_.n_local(), tokens_.n_expert_used, wire.words(), step_tokens_);
  // Each source gets as many rows back as it sent (its counts, then the rows: the counts' words
  // travel unread, as the layout's).
  const int64_t L = lay.L;
  back_bytes_.assign(static_cast<size_t>(n_rank_), 0);
  combine_bytes_ = 0;
  for (int s = 0; s < n_rank_; ++s) {
    const int64_t bytes = (L + rows_from_[s] * lay.RW) * 4;
    if (s != rank_) back_bytes_[s] = bytes;
    combine_bytes_ += bytes;
  }
  ll_transfer("ep_combine(low_latency)", back_.data(), back_bytes_, ret_.data(), lay.BW);
}

// The weights are applied here, in k order, exactly as the single-rank dispatcher does.
void EpDispatcher::ll_combine_recv() {
  const int64_t K = tokens_.n_expert_used, D = tokens_.n_embd;
  const WireRows wire(opt_.combine_rows(), D);
  for (int64_t t = 0; t < tokens_.n_tokens; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      wire.add(ret_.data() + slot_of_[t * K + k], tokens_.topk_weights[t * K + k],
               tokens_.out + t * D);
    }
  }
}

}  // namespace duet
