#include "moe/experts.h"

#include "core/error.h"

namespace duet {

namespace {

uint64_t mlp_bytes(const MlpWeights& w) {
  uint64_t bytes = 0;
  for (const Matrix* m : {&w.gate, &w.up, &w.down}) bytes += m->nbytes();
  return bytes;
}

}  // namespace

void mlp_forward(ThreadPool& pool, const MlpWeights& w, const float* x, int64_t n_tokens,
                 MlpScratch& scratch, float* y) {
  if (n_tokens == 0) return;
  scratch.act.resize(static_cast<size_t>(n_tokens * w.gate.rows));
  scratch.gated.assign(1, GatedGroup{w.gate, w.up, x, n_tokens, scratch.act.data()});
  scratch.down.assign(1, MatmulGroup{w.down, scratch.act.data(), n_tokens, y});
  gated_matmul_grouped(pool, scratch.gated);
  matmul_grouped(pool, scratch.down);
}

uint64_t run_experts(ThreadPool& pool, const std::vector<MlpWeights>& experts, ExpertBatch& batch,
                     MlpScratch& scratch, const SharedExperts* shared) {
  DUET_CHECK(static_cast<int64_t>(experts.size()) == batch.n_local_expert,
             "experts " << experts.size() << " batch " << batch.n_local_expert);
  DUET_CHECK(batch.x.size() == static_cast<size_t>(batch.n_rows()) &&
                 batch.out.size() == batch.x.size() && batch.weight.size() == batch.x.size(),
             "expert batch of " << batch.n_rows() << " rows has " << batch.x.size() << " inputs, "
                                << batch.out.size() << " outputs, " << batch.weight.size()
                                << " weights");
  scratch.gated.clear();
  scratch.scatter.clear();
  // act rows follow the batch's rows; each expert's n_ff may differ in principle, so offsets
  // into act are accumulated rather than computed.
  int64_t act_size = 0;
  for (int64_t e = 0; e < batch.n_local_expert; ++e) {
    const int64_t n = batch.offsets[e + 1] - batch.offsets[e];
    act_size += n * experts[e].gate.rows;
  }
  DUET_CHECK(!shared || (batch.chunk_ends.empty() && shared->w && shared->x && shared->out),
             "shared experts in run_experts: " << batch.chunk_ends.size() << " chunks");
  if (shared) act_size += shared->n_tokens * shared->w->gate.rows;
  scratch.act.resize(static_cast<size_t>(act_size));
  uint64_t bytes = 0;
  float* act = scratch.act.data();
  for (int64_t e = 0; e < batch.n_local_expert; ++e) {
    const int64_t r0 = batch.offsets[e], n = batch.offsets[e + 1] - r0;
    if (n == 0) continue;
    const MlpWeights& w = experts[e];
    scratch.gated.push_back(GatedGroup{w.gate, w.up, XRows(batch.x.data() + r0), n, act});
    scratch.scatter.push_back(
        ScatterGroup{w.down, act, n, batch.out.data() + r0, batch.weight.data() + r0});
    act += n * w.gate.rows;
    bytes += mlp_bytes(w);
  }
  if (shared && shared->n_tokens > 0) {  // after the routed groups: added to out after them
    const MlpWeights& w = *shared->w;
    const int64_t n = shared->n_tokens, d = w.down.rows;
    scratch.shared_out.resize(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) scratch.shared_out[t] = shared->out + t * d;
    scratch.shared_weight.assign(static_cast<size_t>(n), 1.0f);
    scratch.gated.push_back(GatedGroup{w.gate, w.up, XRows(shared->x), n, act});
    scratch.scatter.push_back(
        ScatterGroup{w.down, act, n, scratch.shared_out.data(), scratch.shared_weight.data()});
  }
  if (batch.chunk_ends.empty()) {
    gated_matmul_grouped(pool, scratch.gated);
    matmul_grouped_scatter(pool, scratch.scatter, batch.clear);
    return bytes;
  }
  // Chunked combine: one chunk of experts at a time, gate/up and down, each chunk's rows handed
  // to the dispatcher as soon as they are final, so the first rows leave after a chunk's share
  // of the experts' work rather than after every gate/up product; with a chunked dispatch, each
  // chunk starts as soon as its inputs are in. Each expert's weights are still read once: a
  // chunk holds whole experts.
  DUET_CHECK((batch.clear.empty() || batch.clear.size() == static_cast<size_t>(batch.n_rows())) &&
                 batch.chunk_done && batch.chunk_ends.back() == batch.n_local_expert,
             "chunked expert batch: " << batch.clear.size() << " clear rows of " << batch.n_rows()
                                      << ", chunks end at " << batch.chunk_ends.back());
  // A chunk's experts are positions [chunk_ends[c - 1], chunk_ends[c]) of batch.order (or of
  // the experts in index order); group_of maps an expert to its groups in scratch.gated and
  // scratch.scatter, which hold the experts with rows in index order.
  DUET_CHECK(
      batch.order.empty() || static_cast<int64_t>(batch.order.size()) == batch.n_local_expert,
      "expert order of " << batch.order.size() << " for " << batch.n_local_expert << " experts");
  std::vector<int32_t>& group_of = scratch.group_of;
  group_of.assign(static_cast<size_t>(batch.n_local_expert), -1);
  for (int64_t e = 0, g = 0; e < batch.n_local_expert; ++e)
    if (batch.offsets[e + 1] > batch.offsets[e]) group_of[e] = static_cast<int32_t>(g++);
  std::vector<GatedGroup>& gated_part = scratch.gated_part;
  std::vector<ScatterGroup>& part = scratch.scatter_part;
  for (size_t c = 0; c < batch.chunk_ends.size(); ++c) {
    const int64_t p0 = c == 0 ? 0 : batch.chunk_ends[c - 1], p1 = batch.chunk_ends[c];
    if (batch.chunk_ready) batch.chunk_ready(static_cast<int>(c));
    part.clear();
    gated_part.clear();
    scratch.clear_part.clear();
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t e = batch.expert_at(p);
      DUET_CHECK(e >= 0 && e < batch.n_local_expert, "expert " << e << " in the order");
      if (group_of[e] < 0) continue;
      gated_part.push_back(scratch.gated[group_of[e]]);
      part.push_back(scratch.scatter[group_of[e]]);
      if (!batch.clear.empty()) {
        scratch.clear_part.insert(scratch.clear_part.end(), batch.clear.begin() + batch.offsets[e],
                                  batch.clear.begin() + batch.offsets[e + 1]);
      }
    }
    if (!part.empty()) {
      gated_matmul_grouped(pool, gated_part);
      matmul_grouped_scatter(pool, part, scratch.clear_part);
    }
    batch.chunk_done(static_cast<int>(c));
  }
  return bytes;
}

}  // namespace duet
