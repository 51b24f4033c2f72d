#include "kernels/attend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/simd_impl.h"

namespace duet {
namespace {

// A sequence's K/V rows laid out as a store might: row j of the key at keys[j * stride], cut
// into spans of the given lengths (cycled). A bf16 cache keeps its rows in keys_bf16 /
// values_bf16, which the spans point into; keys / values then hold their widened values, which
// is what attention must compute with.
struct Cache {
  int64_t stride;
  std::vector<float> keys;    // [n_ctx, stride]
  std::vector<float> values;  // [n_ctx, stride]
  std::vector<uint16_t> keys_bf16, values_bf16;
  std::vector<KvSpan> spans;
};

std::vector<uint16_t> to_bf16(std::vector<float>& x) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_f32(h[i] = f32_to_bf16(x[i]));
  return h;
}

Cache make_cache(std::mt19937& rng, int64_t n_ctx, int64_t stride,
                 const std::vector<int64_t>& span_lens, bool v_is_k, DType dtype = DType::kF32) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Cache c{stride, {}, {}, {}, {}, {}};
  c.keys.resize(static_cast<size_t>(n_ctx * stride));
  c.values.resize(c.keys.size());
  for (float& v : c.keys) v = normal(rng);
  for (float& v : c.values) v = normal(rng);
  const bool bf16 = dtype == DType::kBF16;
  if (bf16) {
    c.keys_bf16 = to_bf16(c.keys);
    c.values_bf16 = to_bf16(c.values);
  }
  const void* keys = bf16 ? static_cast<const void*>(c.keys_bf16.data()) : c.keys.data();
  const void* vals = v_is_k ? keys
                     : bf16 ? static_cast<const void*>(c.values_bf16.data())
                            : c.values.data();
  const int64_t row_bytes = stride * static_cast<int64_t>(dtype_size(dtype));
  for (int64_t j = 0, i = 0; j < n_ctx; ++i) {
    const int64_t n = std::min(span_lens[i % span_lens.size()], n_ctx - j);
    c.spans.push_back({static_cast<const char*>(keys) + j * row_bytes,
                       static_cast<const char*>(vals) + j * row_bytes, stride, stride, n, dtype});
    j += n;
  }
  return c;
}

float round_bf16(float x) {
  return bf16_to_f32(f32_to_bf16(x));
}

// What the textbook computation is compared with: its output and the error allowed for each
// element.
struct Expected {
  std::vector<double> out, tol;
};

// The textbook computation, independent of attend_scalar: out[h] = Σ_j softmax(s)_j v_j. The
// tolerance is 2e-5 · Σ_j p_j |v_j[d]|. With `pairs` (the bf16-pair kernel's numerics), q and
// the probabilities are rounded to bf16 first; the kernel rounds its f32 softmax, this one its
// double one rounded to f32, so a probability near a rounding boundary may land one bf16 step
// (2^-7 of it at most) away: each element also allows that for its largest term.
Expected naive(const AttendShape& a, const float* q, const Cache& c, int64_t n_ctx, bool v_is_k,
               bool pairs = false) {
  const float* vals = v_is_k ? c.keys.data() : c.values.data();
  Expected e{std::vector<double>(static_cast<size_t>(a.n_q * a.v_dim), 0.0), {}};
  std::vector<double> scale(e.out.size(), 0.0), largest(e.out.size(), 0.0);
  for (int64_t h = 0; h < a.n_q; ++h) {
    std::vector<double> s(static_cast<size_t>(n_ctx));
    double max = -INFINITY, sum = 0;
    for (int64_t j = 0; j < n_ctx; ++j) {
      double d = 0;
      for (int64_t i = 0; i < a.k_dim; ++i) {
        const float qi = q[h * a.ldq + i];
        d += double(pairs ? round_bf16(qi) : qi) * c.keys[j * c.stride + i];
      }
      s[j] = d * a.scale;
      max = std::max(max, s[j]);
    }
    for (double& v : s) sum += (v = std::exp(v - max));
    for (int64_t j = 0; j < n_ctx; ++j) {
      const double p = pairs ? round_bf16(static_cast<float>(s[j] / sum)) : s[j] / sum;
      for (int64_t d = 0; d < a.v_dim; ++d) {
        const double v = vals[j * c.stride + d];
        const size_t i = static_cast<size_t>(h * a.v_dim + d);
        e.out[i] += p * v;
        scale[i] += p * std::fabs(v);
        largest[i] = std::max(largest[i], p * std::fabs(v));
      }
    }
  }
  e.tol.resize(e.out.size());
  for (size_t i = 0; i < e.tol.size(); ++i) {
    e.tol[i] = 2e-5 * scale[i] + (pairs ? 0x1p-7 * largest[i] : 0.0) + 1e-30;
  }
  return e;
}

// Every head count around the kernel's block of 4, dims around the vector width, the MLA shape
// (values = the first v_dim floats of the keys), runs of 1, 3 and 16 positions (paged blocks)
// or one run (the contiguous cache), against the textbook version; both attend and
// attend_scalar.
constexpr float kGuard = 777.0f;

using simd::Isa;

// attend_with(isa) (kScalar: attend_scalar) into a fresh output of n floats that starts as
// kGuard.
std::vector<float> run_attend(Isa isa, const AttendShape& a, const float* q,
                              const std::vector<KvSpan>& spans, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n), kGuard), scores;
  if (isa == Isa::kScalar) {
    attend_scalar(a, q, spans, out.data(), scores);
  } else {
    attend_with(isa, a, q, spans, out.data(), scores);
  }
  return out;
}

// The kernels under test: f32 rows and bf16 rows on the f32 kernels (AVX-512, scalar), the bf16
// ones against the textbook version on the widened values; bf16 rows on the bf16-pair kernel
// (its emulation everywhere, vdpbf16ps where the CPU has it) against the rounded textbook
// version.
enum class Numerics { kF32Rows, kBf16Rows, kBf16Pairs };

DType rows_dtype(Numerics n) {
  return n == Numerics::kF32Rows ? DType::kF32 : DType::kBF16;
}

std::vector<Isa> isas_for(Numerics n) {
  std::vector<Isa> isas;
  const std::vector<Isa> candidates =
      n == Numerics::kBf16Pairs ? std::vector<Isa>{Isa::kAvx512Bf16Emulated, Isa::kAvx512Bf16}
                                : std::vector<Isa>{Isa::kAvx512, Isa::kScalar};
  for (Isa isa : candidates) {
    if (simd::isa_supported(isa)) isas.push_back(isa);
  }
  return isas;
}

class AttendDtypeTest : public ::testing::TestWithParam<Numerics> {};

TEST_P(AttendDtypeTest, MatchesNaiveOnEdgeShapes) {
  std::mt19937 rng(2024);
  struct Dims {
    int64_t k_dim, v_dim;
    bool v_is_k;
  };
  const std::vector<Dims> dims = {{1, 1, false},   {7, 9, false},   {16, 16, false},
                                  {17, 33, false}, {64, 64, false}, {128, 128, false},
                                  {72, 64, true},  {576, 512, true}};
  const std::vector<std::vector<int64_t>> span_sets = {{1 << 20}, {16}, {1, 3}};
  for (const Dims& dm : dims) {
    for (int64_t n_q : {1, 3, 4, 5, 8}) {
      for (int64_t n_ctx : {1, 2, 17, 100}) {
        for (const std::vector<int64_t>& lens : span_sets) {
          const int64_t stride = std::max(dm.k_dim, dm.v_dim) + 5;
          Cache c = make_cache(rng, n_ctx, stride, lens, dm.v_is_k, rows_dtype(GetParam()));
          AttendShape a{n_q,          dm.k_dim,
                        dm.v_dim,     dm.k_dim + 3,
                        dm.v_dim + 2, static_cast<float>(1.0 / std::sqrt(double(dm.k_dim)))};
          std::normal_distribution<float> normal(0.0f, 1.0f);
          std::vector<float> q(static_cast<size_t>(n_q * a.ldq));
          for (float& v : q) v = normal(rng);
          const Expected want =
              naive(a, q.data(), c, n_ctx, dm.v_is_k, GetParam() == Numerics::kBf16Pairs);
          const std::string what = std::string(dtype_name(rows_dtype(GetParam()))) + " k_dim " +
                                   std::to_string(dm.k_dim) + " v_dim " + std::to_string(dm.v_dim) +
                                   " n_q " + std::to_string(n_q) + " n_ctx " +
                                   std::to_string(n_ctx) + " spans " +
                                   std::to_string(c.spans.size());
          for (Isa isa : isas_for(GetParam())) {
            const std::vector<float> out = run_attend(isa, a, q.data(), c.spans, n_q * a.ldo);
            for (int64_t h = 0; h < n_q; ++h) {
              for (int64_t d = 0; d < a.ldo; ++d) {
                const float got = out[h * a.ldo + d];
                if (d >= a.v_dim) {
                  ASSERT_EQ(got, kGuard) << what << ": wrote head " << h << " lane " << d;
                  continue;
                }
                const size_t i = static_cast<size_t>(h * a.v_dim + d);
                ASSERT_NEAR(got, want.out[i], want.tol[i])
                    << what << " " << simd::isa_name(isa) << " head " << h << " lane " << d;
              }
            }
          }
        }
      }
    }
  }
}

// Causal blocks of n_t query positions (the last n_t of the context, each seeing the positions up
// to its own): row counts n_t · n_q around the kernel's block of 4, one position, a block as long
// as the context (the first position sees one key), GQA groups, the MLA shape, paged runs. Each
// position must match the textbook version, and the SIMD result must equal, bit for bit, attend
// called on that position alone.
TEST_P(AttendDtypeTest, CausalBlockMatchesPerPosition) {
  std::mt19937 rng(77);
  struct Dims {
    int64_t k_dim, v_dim;
    bool v_is_k;
  };
  const std::vector<Dims> dims = {
      {7, 9, false}, {33, 17, false}, {128, 128, false}, {72, 64, true}, {576, 512, true}};
  const std::vector<std::vector<int64_t>> span_sets = {{1 << 20}, {16}, {1, 3}};
  for (const Dims& dm : dims) {
    for (int64_t n_q : {1, 3, 4}) {
      for (int64_t n_t : {1, 2, 3, 5, 8}) {
        for (int64_t n_ctx : {n_t, n_t + 1, int64_t{70}}) {
          for (const std::vector<int64_t>& lens : span_sets) {
            const int64_t stride = std::max(dm.k_dim, dm.v_dim) + 5;
            Cache c = make_cache(rng, n_ctx, stride, lens, dm.v_is_k, rows_dtype(GetParam()));
            AttendShape a{n_q,          dm.k_dim,
                          dm.v_dim,     dm.k_dim + 3,
                          dm.v_dim + 2, static_cast<float>(1.0 / std::sqrt(double(dm.k_dim)))};
            a.n_t = n_t;
            a.ldq_t = n_q * a.ldq + 1;
            a.ldo_t = n_q * a.ldo + 3;
            std::normal_distribution<float> normal(0.0f, 1.0f);
            std::vector<float> q(static_cast<size_t>(n_t * a.ldq_t));
            for (float& v : q) v = normal(rng);
            const std::string what = std::string(dtype_name(rows_dtype(GetParam()))) + " k_dim " +
                                     std::to_string(dm.k_dim) + " n_q " + std::to_string(n_q) +
                                     " n_t " + std::to_string(n_t) + " n_ctx " +
                                     std::to_string(n_ctx) + " spans " +
                                     std::to_string(c.spans.size());
            for (Isa isa : isas_for(GetParam())) {
              const std::vector<float> out = run_attend(isa, a, q.data(), c.spans, n_t * a.ldo_t);
              for (int64_t i = 0; i < n_t; ++i) {
                const int64_t n_i = n_ctx - n_t + 1 + i;  // positions token i sees
                AttendShape one = a;
                one.n_t = 1;
                const Expected want = naive(one, q.data() + i * a.ldq_t, c, n_i, dm.v_is_k,
                                            GetParam() == Numerics::kBf16Pairs);
                std::vector<KvSpan> prefix;
                for (int64_t j = 0; j < n_i;) {
                  KvSpan sp = c.spans[prefix.size()];
                  sp.n = std::min(sp.n, n_i - j);
                  prefix.push_back(sp);
                  j += sp.n;
                }
                const std::vector<float> alone =
                    run_attend(isa, one, q.data() + i * a.ldq_t, prefix, n_q * a.ldo);
                for (int64_t d = 0; d < a.ldo_t; ++d) {
                  const float got = out[i * a.ldo_t + d];
                  const int64_t h = d / a.ldo, lane = d % a.ldo;
                  if (h >= n_q || lane >= a.v_dim) {
                    ASSERT_EQ(got, kGuard) << what << ": wrote token " << i << " float " << d;
                    continue;
                  }
                  const size_t w = static_cast<size_t>(h * a.v_dim + lane);
                  ASSERT_NEAR(got, want.out[w], want.tol[w])
                      << what << " " << simd::isa_name(isa) << " token " << i << " head " << h
                      << " lane " << lane;
                  if (isa != Isa::kScalar) {
                    ASSERT_EQ(got, alone[h * a.ldo + lane]) << what << " token " << i;
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}

// With lse, each row's log-sum-exp of its scaled scores; attention over two parts of the
// positions, weighted by exp(lse_part - lse), gives attention over all of them.
TEST_P(AttendDtypeTest, LogSumExpMergesParts) {
  const Numerics numerics = GetParam();
  const bool pairs = numerics == Numerics::kBf16Pairs;
  std::mt19937 rng(2025);
  const int64_t n_q = 5, k_dim = 40, v_dim = 24, n_ctx = 70, cut = 30;
  const Cache c = make_cache(rng, n_ctx, k_dim, {16}, false, rows_dtype(numerics));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(n_q * k_dim));
  for (float& v : q) v = normal(rng);
  const AttendShape a{n_q, k_dim, v_dim, k_dim, v_dim, 0.3f};
  // The spans of positions [b, e), cut from c's.
  const auto part = [&](int64_t b, int64_t e) {
    std::vector<KvSpan> out;
    const int64_t row = k_dim * static_cast<int64_t>(dtype_size(rows_dtype(numerics)));
    for (int64_t j = b; j < e; j += 16) {
      const KvSpan& sp = c.spans[0];
      out.push_back({static_cast<const char*>(sp.k) + j * row,
                     static_cast<const char*>(sp.v) + j * row, k_dim, k_dim,
                     std::min<int64_t>(16, e - j), sp.dtype});
    }
    return out;
  };
  for (Isa isa : isas_for(numerics)) {
    std::vector<float> whole(static_cast<size_t>(n_q * v_dim)), lse(n_q), scores;
    std::vector<float> p0(whole.size()), p1(whole.size()), lse0(n_q), lse1(n_q);
    const auto run = [&](const std::vector<KvSpan>& spans, float* out, float* l) {
      if (isa == Isa::kScalar) {
        attend_scalar(a, q.data(), spans, out, scores, l);
      } else {
        attend_with(isa, a, q.data(), spans, out, scores, l);
      }
    };
    run(c.spans, whole.data(), lse.data());
    run(part(0, cut), p0.data(), lse0.data());
    run(part(cut, n_ctx), p1.data(), lse1.data());
    for (int64_t h = 0; h < n_q; ++h) {
      double sum = 0;
      for (int64_t j = 0; j < n_ctx; ++j) {
        double d = 0;
        for (int64_t i = 0; i < k_dim; ++i) {
          const float qi = q[h * k_dim + i];
          d += double(pairs ? round_bf16(qi) : qi) * c.keys[j * k_dim + i];
        }
        sum += std::exp(d * a.scale);
      }
      ASSERT_NEAR(lse[h], std::log(sum), 1e-5 * std::max(1.0, std::fabs(std::log(sum))))
          << simd::isa_name(isa) << " head " << h;
      const double top = std::max(lse0[h], lse1[h]);
      const double w0 = std::exp(lse0[h] - top), w1 = std::exp(lse1[h] - top);
      for (int64_t d = 0; d < v_dim; ++d) {
        double largest = 0;
        for (int64_t j = 0; j < n_ctx; ++j)
          largest = std::max(largest, std::fabs(double(c.values[j * k_dim + d])));
        const double merged = (w0 * p0[h * v_dim + d] + w1 * p1[h * v_dim + d]) / (w0 + w1);
        ASSERT_NEAR(merged, whole[h * v_dim + d], (pairs ? 0x1p-7 : 1e-5) * largest)
            << simd::isa_name(isa) << " head " << h << " dim " << d;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernel, AttendDtypeTest,
                         ::testing::Values(Numerics::kF32Rows, Numerics::kBf16Rows,
                                           Numerics::kBf16Pairs),
                         [](const ::testing::TestParamInfo<Numerics>& p) {
                           return std::string(p.param == Numerics::kF32Rows    ? "f32"
                                              : p.param == Numerics::kBf16Rows ? "bf16"
                                                                               : "bf16_pairs");
                         });

// The spans of c over its f32 rows (for a bf16 cache: the widened values), cut as c.spans are.
std::vector<KvSpan> f32_spans(const Cache& c, bool v_is_k) {
  std::vector<KvSpan> out;
  int64_t j = 0;
  for (const KvSpan& sp : c.spans) {
    const float* k = c.keys.data() + j * c.stride;
    const float* v = v_is_k ? k : c.values.data() + j * c.stride;
    out.push_back({k, v, c.stride, c.stride, sp.n, DType::kF32});
    j += sp.n;
  }
  return out;
}

// On the f32 kernels, bf16 rows are widened exactly and then go through the same arithmetic in
// the same order, so attend_with(kAvx512) and attend_scalar over bf16 rows must equal, bit for
// bit, the same function over f32 rows holding the widened values: one position, odd dims, GQA
// groups, causal blocks, the MLA shape (values = the keys' first v_dim elements), several spans,
// and spans of both dtypes in one call (which the bf16-pair instruction sets also run on the f32
// kernel).
TEST(AttendTest, Bf16RowsGiveTheWidenedF32ResultBitForBit) {
  std::mt19937 rng(4242);
  struct Dims {
    int64_t k_dim, v_dim;
    bool v_is_k;
  };
  const std::vector<Dims> dims = {{1, 1, false},     {7, 9, false},  {17, 33, false},
                                  {128, 128, false}, {72, 64, true}, {576, 512, true}};
  const std::vector<std::vector<int64_t>> span_sets = {{1 << 20}, {16}, {1, 3}};
  for (const Dims& dm : dims) {
    for (int64_t n_q : {1, 4, 5}) {
      for (int64_t n_t : {1, 3, 8}) {
        for (int64_t n_ctx : {n_t, int64_t{37}}) {
          for (const std::vector<int64_t>& lens : span_sets) {
            const int64_t stride = std::max(dm.k_dim, dm.v_dim) + 3;
            Cache c = make_cache(rng, n_ctx, stride, lens, dm.v_is_k, DType::kBF16);
            const std::vector<KvSpan> widened = f32_spans(c, dm.v_is_k);
            std::vector<KvSpan> mixed = c.spans;  // every other span f32
            for (size_t i = 1; i < mixed.size(); i += 2) mixed[i] = widened[i];
            AttendShape a{n_q,          dm.k_dim,
                          dm.v_dim,     dm.k_dim + 1,
                          dm.v_dim + 2, static_cast<float>(1.0 / std::sqrt(double(dm.k_dim)))};
            a.n_t = n_t;
            a.ldq_t = n_q * a.ldq;
            a.ldo_t = n_q * a.ldo;
            std::normal_distribution<float> normal(0.0f, 1.0f);
            std::vector<float> q(static_cast<size_t>(n_t * a.ldq_t));
            for (float& v : q) v = normal(rng);
            const std::string what = "k_dim " + std::to_string(dm.k_dim) + " n_q " +
                                     std::to_string(n_q) + " n_t " + std::to_string(n_t) +
                                     " n_ctx " + std::to_string(n_ctx) + " spans " +
                                     std::to_string(c.spans.size());
            const int64_t n_out = n_t * a.ldo_t;
            for (Isa isa : isas_for(Numerics::kBf16Rows)) {
              const std::vector<float> want = run_attend(isa, a, q.data(), widened, n_out);
              const std::vector<float> got = run_attend(isa, a, q.data(), c.spans, n_out);
              const std::vector<float> got_mixed = run_attend(isa, a, q.data(), mixed, n_out);
              for (int64_t i = 0; i < n_out; ++i) {
                ASSERT_EQ(got[i], want[i]) << what << " " << simd::isa_name(isa) << " float " << i;
                ASSERT_EQ(got_mixed[i], want[i])
                    << what << " " << simd::isa_name(isa) << " mixed spans, float " << i;
              }
              if (isa == Isa::kAvx512 && mixed.size() > 1 &&
                  simd::isa_supported(Isa::kAvx512Bf16Emulated)) {
                const std::vector<float> pairs_mixed =
                    run_attend(Isa::kAvx512Bf16Emulated, a, q.data(), mixed, n_out);
                for (int64_t i = 0; i < n_out; ++i) {
                  ASSERT_EQ(pairs_mixed[i], want[i]) << what << " mixed spans on a pair ISA";
                }
              }
            }
          }
        }
      }
    }
  }
}

// A causal block of query rows over bf16 rows cut into spans of 1 and 3 (odd ones: pairs at
// span ends), head_dim 128 (qwen3's) and the MLA shape, and its result from attend and from
// attend_with each kernel.
struct PairCase {
  Cache c;
  AttendShape a;
  std::vector<float> q;
  int64_t n_out;
};

std::vector<PairCase> pair_cases() {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<PairCase> cases;
  for (bool mla : {false, true}) {
    for (const std::vector<int64_t>& lens :
         std::vector<std::vector<int64_t>>{{1 << 20}, {16}, {1, 3}}) {
      const int64_t k_dim = mla ? 576 : 128, v_dim = mla ? 512 : 128, n_q = mla ? 8 : 4;
      const int64_t n_ctx = 75, n_t = 3;
      PairCase p{make_cache(rng, n_ctx, k_dim + 8, lens, mla, DType::kBF16),
                 AttendShape{n_q, k_dim, v_dim, k_dim, v_dim,
                             static_cast<float>(1.0 / std::sqrt(double(k_dim)))},
                 {},
                 0};
      p.a.n_t = n_t;
      p.a.ldq_t = n_q * k_dim;
      p.a.ldo_t = n_q * v_dim;
      p.q.resize(static_cast<size_t>(n_t * p.a.ldq_t));
      for (float& v : p.q) v = 2.0f * normal(rng);
      p.n_out = n_t * p.a.ldo_t;
      cases.push_back(std::move(p));
    }
  }
  return cases;
}

// vdpbf16ps follows Intel's pseudocode bit for bit (SimdTest.RealDpbf16MatchesPseudocode), so the
// kernel on it must give its emulation's result bit for bit.
TEST(AttendTest, PairKernelMatchesItsEmulationBitForBit) {
  if (!simd::isa_supported(Isa::kAvx512Bf16)) {
    GTEST_SKIP() << "this CPU lacks AVX-512 BF16: the pair kernel runs only as its emulation";
  }
  for (const PairCase& p : pair_cases()) {
    const std::vector<float> want =
        run_attend(Isa::kAvx512Bf16Emulated, p.a, p.q.data(), p.c.spans, p.n_out);
    const std::vector<float> got =
        run_attend(Isa::kAvx512Bf16, p.a, p.q.data(), p.c.spans, p.n_out);
    for (int64_t i = 0; i < p.n_out; ++i) {
      ASSERT_EQ(got[i], want[i]) << "k_dim " << p.a.k_dim << " spans " << p.c.spans.size()
                                 << " float " << i;
    }
  }
}

// The pair kernel rounds q and the probabilities (the textbook comparison allows for that much):
// its results stand off the f32 kernel's by far more than f32 sums do, at a few 1e-3 of a value.
TEST(AttendTest, PairKernelRoundsTheQueryAndTheProbabilities) {
  if (!simd::isa_supported(Isa::kAvx512Bf16Emulated)) GTEST_SKIP() << "no AVX-512 on this CPU";
  for (const PairCase& p : pair_cases()) {
    const std::vector<float> f32 = run_attend(Isa::kAvx512, p.a, p.q.data(), p.c.spans, p.n_out);
    const std::vector<float> pairs =
        run_attend(Isa::kAvx512Bf16Emulated, p.a, p.q.data(), p.c.spans, p.n_out);
    double max_diff = 0, max_abs = 0;
    for (int64_t i = 0; i < p.n_out; ++i) {
      max_diff = std::max(max_diff, double(std::fabs(pairs[i] - f32[i])));
      max_abs = std::max(max_abs, double(std::fabs(f32[i])));
    }
    EXPECT_GT(max_diff, 1e-4 * max_abs) << "k_dim " << p.a.k_dim;
    EXPECT_LT(max_diff, 3e-2 * max_abs) << "k_dim " << p.a.k_dim;
  }
}

// Where the spans cut a sequence's positions (a contiguous cache's one span, a paged cache's
// blocks of any size, odd ones included) changes no bit of the result, on every kernel: the
// pair kernel pairs positions (2m, 2m + 1) across span ends.
TEST(AttendTest, WhereTheSpansCutChangesNothing) {
  std::mt19937 rng(21);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::pair<Isa, DType>> kernels;
  for (Numerics n : {Numerics::kF32Rows, Numerics::kBf16Rows, Numerics::kBf16Pairs}) {
    for (Isa isa : isas_for(n)) kernels.push_back({isa, rows_dtype(n)});
  }
  for (const auto& [isa, dtype] : kernels) {
    for (int64_t n_ctx : {int64_t{1}, int64_t{2}, int64_t{37}, int64_t{150}}) {
      const int64_t hd = 128, n_q = 4, n_t = std::min<int64_t>(3, n_ctx);
      std::mt19937 same(n_ctx);  // the same rows for every cut
      std::vector<Cache> caches;
      for (const std::vector<int64_t>& lens :
           std::vector<std::vector<int64_t>>{{1 << 20}, {16}, {3}, {1, 3}, {5, 2}, {64, 1}}) {
        same.seed(static_cast<unsigned>(n_ctx));
        caches.push_back(make_cache(same, n_ctx, hd + 8, lens, false, dtype));
      }
      AttendShape a{n_q, hd, hd, hd, hd, 0.09f};
      a.n_t = n_t;
      a.ldq_t = n_q * hd;
      a.ldo_t = n_q * hd;
      std::vector<float> q(static_cast<size_t>(n_t * a.ldq_t));
      for (float& v : q) v = normal(rng);
      const std::vector<float> want = run_attend(isa, a, q.data(), caches[0].spans, n_t * a.ldo_t);
      for (size_t c = 1; c < caches.size(); ++c) {
        EXPECT_EQ(run_attend(isa, a, q.data(), caches[c].spans, n_t * a.ldo_t), want)
            << simd::isa_name(isa) << " " << dtype_name(dtype) << " n_ctx " << n_ctx << ", "
            << caches[c].spans.size() << " spans";
      }
    }
  }
}

// attend runs what the instruction set of products with bf16 weights runs (simd::bf16_isa): the
// pair kernel on bf16 rows where it multiplies bf16 pairs, the f32 one elsewhere.
TEST(AttendTest, AttendRunsTheKernelOfTheBf16ProductsInstructionSet) {
  for (const PairCase& p : pair_cases()) {
    std::vector<float> got(static_cast<size_t>(p.n_out), kGuard), scores;
    attend(p.a, p.q.data(), p.c.spans, got.data(), scores);
    const Isa isa = simd::bf16_isa();
    const std::vector<float> want = run_attend(isa, p.a, p.q.data(), p.c.spans, p.n_out);
    EXPECT_EQ(got, want) << simd::isa_name(isa);
  }
}

TEST(AttendTest, OneBf16PositionReturnsItsWidenedValue) {
  std::vector<float> k = {1, 2}, v = {3.14159f, -4.001f, 1e-3f};
  std::vector<uint16_t> kh, vh;
  for (float x : k) kh.push_back(f32_to_bf16(x));
  for (float x : v) vh.push_back(f32_to_bf16(x));
  const std::vector<float> want = {bf16_to_f32(vh[0]), bf16_to_f32(vh[1]), bf16_to_f32(vh[2])};
  ASSERT_NE(want[0], v[0]);  // the value is rounded, so the test sees the widening
  std::vector<float> q = {0.5f, -1};
  for (Numerics n : {Numerics::kBf16Rows, Numerics::kBf16Pairs}) {
    for (Isa isa : isas_for(n)) {
      const std::vector<float> out = run_attend(isa, {1, 2, 3, 2, 3, 1.0f}, q.data(),
                                                {{kh.data(), vh.data(), 2, 3, 1, DType::kBF16}}, 3);
      EXPECT_EQ(out, want) << simd::isa_name(isa);
    }
  }
}

TEST(AttendTest, RejectsMoreQueryPositionsThanContext) {
  std::vector<float> k(4), q(8), out(8), scores;
  AttendShape a{1, 4, 4, 4, 4, 1.0f};
  a.n_t = 2;
  a.ldq_t = 4;
  a.ldo_t = 4;
  EXPECT_THROW(attend(a, q.data(), {{k.data(), k.data(), 4, 4, 1}}, out.data(), scores), Error);
}

TEST(AttendTest, OnePositionReturnsItsValue) {
  std::vector<float> k = {1, 2}, v = {3, -4, 5};
  std::vector<float> q = {0.5f, -1, 2, 2};  // two heads
  std::vector<float> out(6), scores;
  attend({2, 2, 3, 2, 3, 1.0f}, q.data(), {{k.data(), v.data(), 2, 3, 1}}, out.data(), scores);
  EXPECT_EQ(out, (std::vector<float>{3, -4, 5, 3, -4, 5}));
}

TEST(AttendTest, RejectsEmptyContext) {
  std::vector<float> q(4), out(4), scores;
  EXPECT_THROW(attend({1, 4, 4, 4, 4, 1.0f}, q.data(), {}, out.data(), scores), Error);
}

}  // namespace
}  // namespace duet
