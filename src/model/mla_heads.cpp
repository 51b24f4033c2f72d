#include "model/mla_heads.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/grouped_matmul.h"
#include "kernels/matmul.h"

namespace duet {

namespace {

// Floats of the per-head copies one job may hold (4 MiB).
constexpr int64_t kJobFloats = int64_t{1} << 20;

void check_heads(const Matrix& kv_b, const MlaHeads& m, int64_t job_heads) {
  DUET_CHECK(kv_b.rows == m.n_head * (m.nope + m.v_dim) && kv_b.cols == m.rank && job_heads >= 1,
             "MLA heads: kv_b [" << kv_b.rows << ", " << kv_b.cols << "] for " << m.n_head
                                 << " heads of nope " << m.nope << " v " << m.v_dim << " rank "
                                 << m.rank << ", " << job_heads << " heads a job");
}

}  // namespace

int64_t mla_heads_per_job(const MlaHeads& m, int64_t n_tokens) {
  const int64_t per_head = std::max<int64_t>(1, n_tokens * std::max(m.nope, m.v_dim));
  return std::clamp<int64_t>(kJobFloats / per_head, 1, std::max<int64_t>(1, m.n_head));
}

void mla_absorb_queries(ThreadPool& pool, const Matrix& kv_b, const MlaHeads& m, const float* q,
                        int64_t n_tokens, int64_t job_heads, float* q_lat,
                        std::vector<float>& buf) {
  check_heads(kv_b, m, job_heads);
  const int64_t H = m.n_head, n = n_tokens, kv_rows = m.nope + m.v_dim;
  buf.resize(static_cast<size_t>(std::min(job_heads, H) * n * m.nope));
  thread_local std::vector<XwGroup> groups;  // reused: a decode step does not allocate
  for (int64_t h0 = 0; h0 < H; h0 += job_heads) {
    groups.clear();
    for (int64_t h = h0; h < std::min(H, h0 + job_heads); ++h) {
      float* q_nope = buf.data() + (h - h0) * n * m.nope;  // [n, nope]
      for (int64_t t = 0; t < n; ++t) {
        const float* src = q + (t * H + h) * m.qk_dim;
        std::copy(src, src + m.nope, q_nope + t * m.nope);
      }
      groups.push_back({kv_b.row_slice(h * kv_rows, m.nope), q_nope, n, q_lat + h * n * m.rank});
    }
    matmul_xw_grouped(pool, groups);
  }
}

void mla_head_outputs(ThreadPool& pool, const Matrix& kv_b, const MlaHeads& m, const float* o_lat,
                      int64_t n_tokens, int64_t job_heads, float* out, std::vector<float>& buf) {
  check_heads(kv_b, m, job_heads);
  const int64_t H = m.n_head, n = n_tokens, kv_rows = m.nope + m.v_dim, vd = m.v_dim;
  buf.resize(static_cast<size_t>(std::min(job_heads, H) * n * vd));
  thread_local std::vector<MatmulGroup> groups;
  for (int64_t h0 = 0; h0 < H; h0 += job_heads) {
    const int64_t h1 = std::min(H, h0 + job_heads);
    groups.clear();
    for (int64_t h = h0; h < h1; ++h) {
      groups.push_back({kv_b.row_slice(h * kv_rows + m.nope, vd), o_lat + h * n * m.rank, n,
                        buf.data() + (h - h0) * n * vd});
    }
    matmul_grouped(pool, groups);
    for (int64_t h = h0; h < h1; ++h) {
      const float* out_h = buf.data() + (h - h0) * n * vd;  // [n, vd]
      for (int64_t t = 0; t < n; ++t)
        std::copy(out_h + t * vd, out_h + (t + 1) * vd, out + (t * H + h) * vd);
    }
  }
}

}  // namespace duet
