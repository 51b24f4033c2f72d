#include "model/mla_heads.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/grouped_matmul.h"
#include "kernels/matmul.h"

namespace duet {

namespace {

// Floats of the per-head copies one job may hold (4 MiB).
constexpr int64_t kJobFloats = int64_t{1} << 20;

void check_kv_b(const Matrix& kv_b, const MlaHeads& m) {
  DUET_CHECK(kv_b.rows == m.n_head * (m.nope + m.v_dim) && kv_b.cols == m.rank,
             "MLA heads: kv_b [" << kv_b.rows << ", " << kv_b.cols << "] for " << m.n_head
                                 << " heads of nope " << m.nope << " v " << m.v_dim << " rank "
                                 << m.rank);
}

void check_heads(const MlaKvB& w, const MlaHeads& m, int64_t job_heads) {
  DUET_CHECK(job_heads >= 1, "MLA heads: " << job_heads << " heads a job");
  if (!w.split()) return check_kv_b(w.kv_b, m);
  DUET_CHECK(w.k_b.rows == m.n_head * m.rank && w.k_b.cols == m.nope &&
                 w.v_b.rows == m.n_head * m.v_dim && w.v_b.cols == m.rank,
             "MLA heads: k_b [" << w.k_b.rows << ", " << w.k_b.cols << "] and v_b [" << w.v_b.rows
                                << ", " << w.v_b.cols << "] for " << m.n_head << " heads of nope "
                                << m.nope << " v " << m.v_dim << " rank " << m.rank);
}

float weight_at(const Matrix& w, int64_t r, int64_t c) {
  const int64_t i = r * w.cols + c;
  return w.dtype == DType::kBF16 ? bf16_to_f32(static_cast<const uint16_t*>(w.data)[i])
                                 : static_cast<const float*>(w.data)[i];
}

}  // namespace

void mla_split_kv_b(const Matrix& kv_b, const MlaHeads& m, std::vector<float>& k_b,
                    std::vector<float>& v_b) {
  check_kv_b(kv_b, m);
  DUET_CHECK(kv_b.dtype == DType::kF32 || kv_b.dtype == DType::kBF16,
             "MLA heads: kv_b of dtype " << dtype_name(kv_b.dtype) << " cannot be split");
  const int64_t kv_rows = m.nope + m.v_dim;
  k_b.resize(static_cast<size_t>(m.n_head * m.rank * m.nope));
  v_b.resize(static_cast<size_t>(m.n_head * m.v_dim * m.rank));
  for (int64_t h = 0; h < m.n_head; ++h) {
    for (int64_t r = 0; r < m.nope; ++r) {
      for (int64_t l = 0; l < m.rank; ++l)
        k_b[(h * m.rank + l) * m.nope + r] = weight_at(kv_b, h * kv_rows + r, l);
    }
    for (int64_t r = 0; r < m.v_dim; ++r) {
      for (int64_t l = 0; l < m.rank; ++l)
        v_b[(h * m.v_dim + r) * m.rank + l] = weight_at(kv_b, h * kv_rows + m.nope + r, l);
    }
  }
}

int64_t mla_heads_per_job(const MlaHeads& m, int64_t n_tokens) {
  const int64_t per_head = std::max<int64_t>(1, n_tokens * std::max(m.nope, m.v_dim));
  return std::clamp<int64_t>(kJobFloats / per_head, 1, std::max<int64_t>(1, m.n_head));
}

void mla_absorb_queries(ThreadPool& pool, const MlaKvB& w, const MlaHeads& m, const float* q,
                        int64_t n_tokens, int64_t job_heads, float* q_lat,
                        std::vector<float>& buf) {
  check_heads(w, m, job_heads);
  const int64_t H = m.n_head, n = n_tokens, kv_rows = m.nope + m.v_dim;
  buf.resize(static_cast<size_t>(std::min(job_heads, H) * n * m.nope));
  // Reused: a decode step does not allocate. One of the two, as w is split or not.
  thread_local std::vector<XwGroup> xw_groups;
  thread_local std::vector<MatmulGroup> groups;
  for (int64_t h0 = 0; h0 < H; h0 += job_heads) {
    xw_groups.clear();
    groups.clear();
    for (int64_t h = h0; h < std::min(H, h0 + job_heads); ++h) {
      float* q_nope = buf.data() + (h - h0) * n * m.nope;  // [n, nope]
      for (int64_t t = 0; t < n; ++t) {
        const float* src = q + (t * H + h) * m.qk_dim;
        std::copy(src, src + m.nope, q_nope + t * m.nope);
      }
      float* out = q_lat + h * n * m.rank;
      if (w.split()) {
        groups.push_back({w.k_b.row_slice(h * m.rank, m.rank), q_nope, n, out});
      } else {
        xw_groups.push_back({w.kv_b.row_slice(h * kv_rows, m.nope), q_nope, n, out});
      }
    }
    if (w.split()) {
      matmul_grouped(pool, groups);
    } else {
      matmul_xw_grouped(pool, xw_groups);
    }
  }
}

void mla_head_outputs(ThreadPool& pool, const MlaKvB& w, const MlaHeads& m, const float* o_lat,
                      int64_t n_tokens, int64_t job_heads, float* out, std::vector<float>& buf) {
  check_heads(w, m, job_heads);
  const int64_t H = m.n_head, n = n_tokens, kv_rows = m.nope + m.v_dim, vd = m.v_dim;
  buf.resize(static_cast<size_t>(std::min(job_heads, H) * n * vd));
  thread_local std::vector<MatmulGroup> groups;
  for (int64_t h0 = 0; h0 < H; h0 += job_heads) {
    const int64_t h1 = std::min(H, h0 + job_heads);
    groups.clear();
    for (int64_t h = h0; h < h1; ++h) {
      const Matrix w_uv =
          w.split() ? w.v_b.row_slice(h * vd, vd) : w.kv_b.row_slice(h * kv_rows + m.nope, vd);
      groups.push_back({w_uv, o_lat + h * n * m.rank, n, buf.data() + (h - h0) * n * vd});
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
