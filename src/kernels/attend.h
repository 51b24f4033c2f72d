// Attention of a few query heads over one sequence's cached keys and values, reading the KV
// rows in place from the spans a KV store hands out (no copy, no call per position).
#pragma once

#include <cstdint>
#include <vector>

namespace duet {

// n consecutive positions whose rows sit at fixed strides (in floats), as a KV store holds them.
struct KvSpan {
  const float* k = nullptr;  // key of the span's position i at k + i * k_stride
  const float* v = nullptr;  // value of position i at v + i * v_stride (may equal k, as in MLA)
  int64_t k_stride = 0;
  int64_t v_stride = 0;
  int64_t n = 0;
};

struct AttendShape {
  int64_t n_q = 0;     // query heads sharing the keys and values (a GQA group; MLA: any heads)
  int64_t k_dim = 0;   // floats of each query and key used
  int64_t v_dim = 0;   // floats of each value used
  int64_t ldq = 0;     // floats between the query heads' rows (>= k_dim)
  int64_t ldo = 0;     // floats between the output heads' rows (>= v_dim)
  float scale = 1.0f;  // applied to q · k before the softmax
};

// out[h * ldo + :v_dim] = Σ_j p[h, j] · v_j with p[h, :] = softmax_j(scale · q[h * ldq + :k_dim] ·
// k_j) over the positions j of all spans in order, for h < n_q. At least one position; q, out
// f32; out must not overlap q or the KV rows. `scores` is scratch ([n_q, n_ctx] f32), reused
// across calls to avoid allocating. AVX-512 when the CPU has it, else the scalar version.
void attend(const AttendShape& shape, const float* q, const std::vector<KvSpan>& spans, float* out,
            std::vector<float>& scores);

// The plain version (sums in double): the reference for tests and the fallback.
void attend_scalar(const AttendShape& shape, const float* q, const std::vector<KvSpan>& spans,
                   float* out, std::vector<float>& scores);

}  // namespace duet
