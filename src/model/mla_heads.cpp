#include "model/mla_heads.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "kernels/grouped_matmul.h"
#include "kernels/matmul.h"
#include "kernels/matmul_fp8.h"

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
  if (w.dtype == DType::kF8E4M3) return fp8_weight(w, r, c);
  const int64_t i = r * w.cols + c;
  return w.dtype == DType::kBF16 ? bf16_to_f32(static_cast<const uint16_t*>(w.data)[i])
                                 : static_cast<const float*>(w.data)[i];
}

}  // namespace

void mla_split_kv_b(const Matrix& kv_b, const MlaHeads& m, std::vector<float>& k_b,
                    std::vector<float>& v_b) {
  check_kv_b(kv_b, m);
  DUET_CHECK(
      kv_b.dtype == DType::kF32 || kv_b.dtype == DType::kBF16 || kv_b.dtype == DType::kF8E4M3,
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

void mla_split_kv_b_elements(const Matrix& kv_b, const MlaHeads& m, void* k_b, void* v_b) {
  check_kv_b(kv_b, m);
  DUET_CHECK(
      kv_b.dtype == DType::kF32 || kv_b.dtype == DType::kBF16 || kv_b.dtype == DType::kF8E4M3,
      "MLA heads: kv_b of dtype " << dtype_name(kv_b.dtype) << " cannot be split");
  const size_t el = dtype_size(kv_b.dtype);
  const int64_t L = m.rank, kv_rows = m.nope + m.v_dim;
  const auto* src = static_cast<const char*>(kv_b.data);
  auto* k = static_cast<char*>(k_b);
  auto* v = static_cast<char*>(v_b);
  for (int64_t h = 0; h < m.n_head; ++h) {
    const char* w_uk = src + h * kv_rows * L * el;  // [nope, L]
    char* k_h = k + h * L * m.nope * el;            // [L, nope]
    for (int64_t r = 0; r < m.nope; ++r)
      for (int64_t l = 0; l < L; ++l)
        std::memcpy(k_h + (l * m.nope + r) * el, w_uk + (r * L + l) * el, el);
    const char* w_uv = w_uk + m.nope * L * el;  // [v_dim, L], as stored
    std::memcpy(v + h * m.v_dim * L * el, w_uv, m.v_dim * L * el);
  }
}

Matrix Fp8Part::view() const {
  Matrix w{DType::kF8E4M3, rows, cols, codes.data()};
  w.f8 = {scales.data(), block_rows, block_cols, 0};
  return w;
}

bool mla_split_kv_b_fp8(const Matrix& kv_b, const MlaHeads& m, Fp8Part& k_b, Fp8Part& v_b) {
  if (kv_b.dtype != DType::kF8E4M3) return false;
  check_kv_b(kv_b, m);
  const int64_t br = kv_b.f8.block_rows, bc = kv_b.f8.block_cols;
  const int64_t g = std::gcd(br, std::gcd(m.nope, m.v_dim));
  if (g % 16 != 0) return false;
  const int64_t H = m.n_head, L = m.rank, kv_rows = m.nope + m.v_dim;
  const auto scale_at = [&](int64_t r, int64_t c) { return fp8_impl::scale_row(kv_b, r)[c / bc]; };

  Fp8Part k;  // [H · L, nope], blocks [gcd(bc, L), g]
  k.rows = H * L;
  k.cols = m.nope;
  k.block_rows = std::gcd(bc, L);
  k.block_cols = g;
  k.codes.resize(static_cast<size_t>(k.rows * k.cols));
  for (int64_t rb = 0; rb < k.rows / k.block_rows; ++rb) {
    const int64_t h = rb * k.block_rows / L, l = rb * k.block_rows % L;
    for (int64_t cb = 0; cb < m.nope / g; ++cb)
      k.scales.push_back(scale_at(h * kv_rows + cb * g, l));
  }

  Fp8Part v;  // [H · v_dim, L], blocks [g, bc]
  v.rows = H * m.v_dim;
  v.cols = L;
  v.block_rows = g;
  v.block_cols = bc;
  v.codes.resize(static_cast<size_t>(v.rows * v.cols));
  mla_split_kv_b_elements(kv_b, m, k.codes.data(), v.codes.data());
  for (int64_t rb = 0; rb < v.rows / g; ++rb) {
    const int64_t h = rb * g / m.v_dim, i = rb * g % m.v_dim;
    for (int64_t c = 0; c < L; c += bc) v.scales.push_back(scale_at(h * kv_rows + m.nope + i, c));
  }
  k_b = std::move(k);
  v_b = std::move(v);
  return true;
}

namespace {

constexpr int64_t kHeadBlock = 4;        // heads a task of a token attended whole
constexpr int64_t kChunkHeadBlock = 16;  // heads a task of a part of a longer one

// The positions [c0, c1) of `all` (spans in position order) as spans of their own.
void slice_spans(const std::vector<KvSpan>& all, int64_t c0, int64_t c1, std::vector<KvSpan>& out) {
  out.clear();
  int64_t j = 0;
  for (const KvSpan& sp : all) {
    const int64_t b = std::max(c0, j), e = std::min(c1, j + sp.n);
    if (b < e) {
      KvSpan part = sp;
      const size_t el = dtype_size(sp.dtype);
      part.k = static_cast<const char*>(sp.k) + (b - j) * sp.k_stride * el;
      part.v = static_cast<const char*>(sp.v) + (b - j) * sp.v_stride * el;
      part.n = e - b;
      out.push_back(part);
    }
    j += sp.n;
  }
}

// Floats of one part's results: kChunkHeadBlock rows of `rank` outputs, then their log-sum-exps.
int64_t part_floats(int64_t rank) {
  return kChunkHeadBlock * (rank + 1);
}

// Bytes of parts kept for a merge after the tasks (a token's parts as tasks of their own);
// beyond them a task attends its token's parts one after another.
constexpr int64_t kPartBytes = int64_t{8} << 20;

// One task of mla_attend: heads [h0, h0 + nh) of token t over positions [c0, c1), into o_lat
// (part < 0, c0 == 0 and c1 the token's n_ctx: attended whole; or its parts one after another,
// part == kSequential) or into part `part` of the partials, merged after the tasks.
struct MlaTask {
  static constexpr int64_t kWhole = -1, kSequential = -2;
  int64_t t, h0, nh, c0, c1, part;
};

// out row h (at out + h * ldo) = Σ_c exp(lse_c[h] - lse[h]) · part_c row h over the n_parts
// parts (results of part_floats(rank) floats each, from `parts`), lse = log Σ_c exp(lse_c).
void merge_parts(const float* parts, int64_t n_parts, int64_t nh, int64_t rank, float* out,
                 int64_t ldo) {
  const int64_t stride = part_floats(rank), lse_at = kChunkHeadBlock * rank;
  for (int64_t h = 0; h < nh; ++h) {
    float top = -INFINITY;
    for (int64_t c = 0; c < n_parts; ++c) top = std::max(top, parts[c * stride + lse_at + h]);
    double total = 0;
    for (int64_t c = 0; c < n_parts; ++c)
      total += std::exp(double(parts[c * stride + lse_at + h]) - top);
    float* o = out + h * ldo;
    std::fill(o, o + rank, 0.0f);
    for (int64_t c = 0; c < n_parts; ++c) {
      const float w =
          static_cast<float>(std::exp(double(parts[c * stride + lse_at + h]) - top) / total);
      const float* row = parts + c * stride + h * rank;
      for (int64_t d = 0; d < rank; ++d) o[d] += w * row[d];
    }
  }
}

}  // namespace

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

void mla_attend(ThreadPool& pool, const MlaHeads& m, const float* q_lat, const float* q,
                int64_t n_tokens, const std::vector<int64_t>& n_ctx, float scale,
                const std::function<void(int64_t t, std::vector<KvSpan>& spans)>& spans_of,
                float* o_lat, std::vector<float>& partials, int64_t chunk_positions) {
  DUET_CHECK(static_cast<int64_t>(n_ctx.size()) == n_tokens && chunk_positions >= 1,
             "mla_attend: " << n_ctx.size() << " contexts for " << n_tokens << " tokens, parts of "
                            << chunk_positions << " positions");
  const int64_t H = m.n_head, L = m.rank, n = n_tokens, rope = m.qk_dim - m.nope;
  const int64_t n_blocks = (H + kChunkHeadBlock - 1) / kChunkHeadBlock;
  const auto parts_of = [&](int64_t t) {
    return (n_ctx[t] + chunk_positions - 1) / chunk_positions;
  };
  // A few tokens (decode) keep every part for a merge after the tasks, so that the parts of one
  // token go to different threads; many (prefill) have work enough, and a task takes all the
  // parts of its token and head block.
  int64_t all_parts = 0;
  for (int64_t t = 0; t < n; ++t)
    all_parts += n_ctx[t] > chunk_positions ? parts_of(t) * n_blocks : 0;
  const bool parts_as_tasks =
      all_parts * part_floats(L) * static_cast<int64_t>(sizeof(float)) <= kPartBytes;
  // Reused (a decode step does not allocate); named by reference, as the pool's threads see the
  // calling thread's copy only that way.
  thread_local std::vector<MlaTask> task_list;
  std::vector<MlaTask>& tasks = task_list;
  tasks.clear();
  int64_t n_parts = 0;
  for (int64_t t = 0; t < n; ++t) {
    if (n_ctx[t] <= chunk_positions) {
      for (int64_t h0 = 0; h0 < H; h0 += kHeadBlock)
        tasks.push_back({t, h0, std::min(kHeadBlock, H - h0), 0, n_ctx[t], MlaTask::kWhole});
      continue;
    }
    for (int64_t h0 = 0; h0 < H; h0 += kChunkHeadBlock) {
      const int64_t nh = std::min(kChunkHeadBlock, H - h0);
      if (!parts_as_tasks) {
        tasks.push_back({t, h0, nh, 0, n_ctx[t], MlaTask::kSequential});
        continue;
      }
      for (int64_t c0 = 0; c0 < n_ctx[t]; c0 += chunk_positions)
        tasks.push_back({t, h0, nh, c0, std::min(n_ctx[t], c0 + chunk_positions), n_parts++});
    }
  }
  partials.resize(static_cast<size_t>(n_parts * part_floats(L)));
  pool.parallel_for(static_cast<int64_t>(tasks.size()), [&](int64_t begin, int64_t end) {
    std::vector<KvSpan> all, spans;
    std::vector<float> scores, q_cat;  // q_cat [heads, L + rope]: q_lat | q_pe of each head
    thread_local std::vector<float> own_parts;  // a kSequential task's parts
    int64_t spans_of_t = -1;
    for (int64_t i = begin; i < end; ++i) {
      const MlaTask& k = tasks[i];
      if (k.t != spans_of_t) {
        spans_of(k.t, all);
        for (KvSpan& sp : all) {  // values: the first L elements of the rows
          sp.v = sp.k;
          sp.v_stride = sp.k_stride;
        }
        spans_of_t = k.t;
      }
      q_cat.resize(static_cast<size_t>(k.nh * (L + rope)));
      for (int64_t h = 0; h < k.nh; ++h) {
        const float* ql = q_lat + ((k.h0 + h) * n + k.t) * L;
        const float* qpe = q + (k.t * H + k.h0 + h) * m.qk_dim + m.nope;
        std::copy(ql, ql + L, q_cat.data() + h * (L + rope));
        std::copy(qpe, qpe + rope, q_cat.data() + h * (L + rope) + L);
      }
      float* out = o_lat + (k.h0 * n + k.t) * L;
      if (k.part == MlaTask::kWhole) {
        attend({k.nh, L + rope, L, L + rope, n * L, scale}, q_cat.data(), all, out, scores);
        continue;
      }
      const AttendShape a{k.nh, L + rope, L, L + rope, L, scale};
      const auto attend_part = [&](int64_t c0, float* part) {
        slice_spans(all, c0, std::min(k.c1, c0 + chunk_positions), spans);
        attend(a, q_cat.data(), spans, part, scores, part + kChunkHeadBlock * L);
      };
      if (k.part >= 0) {
        attend_part(k.c0, partials.data() + k.part * part_floats(L));
        continue;
      }
      const int64_t n_own = (k.c1 + chunk_positions - 1) / chunk_positions;
      own_parts.resize(static_cast<size_t>(n_own * part_floats(L)));
      for (int64_t c = 0; c < n_own; ++c)
        attend_part(c * chunk_positions, own_parts.data() + c * part_floats(L));
      merge_parts(own_parts.data(), n_own, k.nh, L, out, n * L);
    }
  });
  if (n_parts == 0) return;
  // The parts of a (token, head block) are consecutive tasks and consecutive parts, in position
  // order: merged as a kSequential task merges its own.
  thread_local std::vector<int64_t> first_list;
  std::vector<int64_t>& firsts = first_list;  // the task of each (token, head block)'s first part
  firsts.clear();
  for (int64_t i = 0; i < static_cast<int64_t>(tasks.size()); ++i) {
    if (tasks[i].part >= 0 && tasks[i].c0 == 0) firsts.push_back(i);
  }
  pool.parallel_for(static_cast<int64_t>(firsts.size()), [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const MlaTask& k = tasks[firsts[b]];
      merge_parts(partials.data() + k.part * part_floats(L), parts_of(k.t), k.nh, L,
                  o_lat + (k.h0 * n + k.t) * L, n * L);
    }
  });
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
