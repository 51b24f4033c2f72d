#include "kernels/grouped_matmul.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/grouped_matmul_impl.h"
#include "kernels/matmul_impl.h"
#include "kernels/ops.h"
#include "kernels/simd_impl.h"

namespace duet {

namespace {

// Weight rows per task from kStreamMaxTokens + 1 tokens in a group on: whole prefill tiles (16
// rows), and few enough to spread a group's rows over the threads.
constexpr int64_t kTaskRows = 64;

// Up to this many tokens in every group (decode), products share out long runs of rows instead:
// the groups' rows, end to end, cut into two equal runs per thread, each read as few streams.
// Tasks of 64 rows cut a one-token MoE layer into segments of 18-128 KB, each a stream started
// cold. One layer's four experts at one token (gate/up [512, 1024], down [1024, 512]), cold, 2
// threads, Zen 4, the two alternating in one process, medians of 21: int4 174 -> 153 us, bf16
// 472-485 -> 461-465 us. (Runs of whole rows per group instead, 768 rows for attention's q, k, v
// of 2048, 512, 512 rows, left the threads 1792 and 1280 rows: equal runs across groups.)
constexpr int64_t kStreamMaxTokens = 4;

template <typename G>
int64_t most_tokens(const std::vector<G>& groups) {
  int64_t most = 0;
  for (const G& g : groups) most = std::max(most, g.n_tokens);
  return most;
}

// Rows [r_begin, r_end) of group g's product.
struct Task {
  int32_t g;
  int64_t r_begin;
  int64_t r_end;
};

// A product's work: runs of tasks, run i being tasks [runs[i], runs[i + 1]); the pool shares out
// runs.
struct Work {
  std::vector<Task> tasks;
  std::vector<size_t> runs;  // [n_runs + 1]
  int64_t n_runs() const { return static_cast<int64_t>(runs.size()) - 1; }
};

// The work of the groups with work, in group order: tasks of kTaskRows rows, each a run of its
// own; or, up to kStreamMaxTokens tokens in every group, the groups' rows end to end in two equal
// runs per thread (of whole 16-row tiles, at least kTaskRows). A run is cut inside a group only
// at a multiple of 4 rows (a block of int8 rows). Reuses the calling thread's buffers, so a step
// does not allocate.
template <typename G, typename RowsOf>
const Work& make_work(const std::vector<G>& groups, RowsOf rows_of, int n_threads) {
  thread_local Work w;
  w.tasks.clear();
  w.runs.assign(1, 0);
  const auto close_run = [&] {
    if (w.tasks.size() > w.runs.back()) w.runs.push_back(w.tasks.size());
  };
  const bool stream = most_tokens(groups) <= kStreamMaxTokens;
  int64_t per_run = kTaskRows;
  if (stream) {
    int64_t total = 0;
    for (const G& g : groups) total += g.n_tokens > 0 ? rows_of(g) : 0;
    const int64_t share = (total + 2 * n_threads - 1) / (2 * n_threads);
    per_run = std::max(kTaskRows, (share + 15) / 16 * 16);
  }
  int64_t left = per_run;  // rows the current run still takes
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].n_tokens == 0) continue;
    if (!stream) {  // runs of 64-row tasks stay inside their group
      close_run();
      left = per_run;
    }
    const int64_t rows = rows_of(groups[g]);
    for (int64_t r = 0; r < rows;) {
      int64_t take = std::min(rows - r, left);
      if (take < rows - r) take = take / 4 * 4;
      if (take > 0) {
        w.tasks.push_back({static_cast<int32_t>(g), r, r + take});
        r += take;
        left -= take;
      }
      if (left < 4 || take == 0) {
        close_run();
        left = per_run;
      }
    }
  }
  close_run();
  return w;
}

void check_group(const char* op, const Matrix& w, const XRows& x, int64_t n_tokens,
                 const float* y) {
  DUET_CHECK(n_tokens >= 0 && (n_tokens == 0 || (!x.empty() && y && x.base != y)),
             op << ": n_tokens " << n_tokens << " x " << x.base << " rows " << x.rows << " y "
                << y);
  DUET_CHECK(w.rows == 0 || w.cols == 0 || w.data, op << ": null weights");
}

// Whether groups a and b multiply the same f32 rows of x by weights that read x made the same
// way (quantized for int8/int4 weights, or rounded for bf16 pairs, at the same width), so that one
// direct_x serves both: attention's q, k and v, and at one token a MoE layer's experts.
bool same_direct_x(simd::Isa isa, const Matrix& wa, const XRows& xa, int64_t na, const Matrix& wb,
                   const XRows& xb, int64_t nb) {
  const auto prepared = [&](const Matrix& w) {
    return is_int_quantized(w.dtype) ||
           (w.dtype == DType::kBF16 && matmul_impl::rounds_x(isa, w.dtype));
  };
  if (na != nb || na == 0 || wa.cols != wb.cols || !prepared(wa) || !prepared(wb) ||
      is_int_quantized(wa.dtype) != is_int_quantized(wb.dtype) || xa.bf16 || xb.bf16 || xa.q8 ||
      xb.q8) {
    return false;
  }
  for (int64_t t = 0; t < na; ++t) {
    if (xa.row(t, wa.cols) != xb.row(t, wb.cols)) return false;
  }
  return true;
}

// Each group's x as the kernels of isa read it (matmul_impl::direct_x: quantized, rounded to
// bf16, or copied into aligned rows), made once here rather than by each of the group's tasks,
// and once for consecutive groups that share it (same_direct_x). The copies live on the calling
// thread until its next call.
template <typename G, typename WeightOf>
std::vector<XRows> direct_xs(simd::Isa isa, const std::vector<G>& groups, WeightOf weight_of) {
  thread_local std::vector<matmul_impl::XBuffer> bufs;
  if (bufs.size() < groups.size()) bufs.resize(groups.size());
  std::vector<XRows> xs;
  xs.reserve(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const Matrix& w = weight_of(groups[g]);
    // Groups sharing x come one after another (q, k, v; a token's experts): only the previous
    // group is compared, so a layer of many experts makes no comparisons of every pair.
    const bool shared =
        g > 0 && same_direct_x(isa, weight_of(groups[g - 1]), groups[g - 1].x,
                               groups[g - 1].n_tokens, w, groups[g].x, groups[g].n_tokens);
    xs.push_back(shared ? xs[g - 1]
                        : matmul_impl::direct_x(isa, w, groups[g].x, groups[g].n_tokens, bufs[g]));
  }
  return xs;
}

// Output columns per matmul_grouped_scatter task: two tasks per thread in whole tiles of 16, at
// most kTaskRows (a whole prefill panel of weight rows) from kStreamMaxTokens + 1 tokens in a
// group on; never less than 16.
int64_t scatter_cols_per_task(int64_t n_out, int64_t most, int n_threads) {
  constexpr int64_t kTile = 16;
  const int64_t want = n_out / (2 * static_cast<int64_t>(n_threads)) / kTile * kTile;
  return most > kStreamMaxTokens ? std::clamp<int64_t>(want, kTile, kTaskRows)
                                 : std::max(kTile, want);
}

}  // namespace

namespace grouped_impl {

void matmul_grouped_with(simd::Isa isa, ThreadPool& pool, const std::vector<MatmulGroup>& groups) {
  for (const MatmulGroup& g : groups) check_group("matmul_grouped", g.w, g.x, g.n_tokens, g.y);
  const Work& work = make_work(
      groups, [](const MatmulGroup& g) { return g.w.rows; }, pool.n_threads());
  const std::vector<XRows> xs =
      direct_xs(isa, groups, [](const MatmulGroup& g) -> const Matrix& { return g.w; });
  pool.parallel_for(work.n_runs(), [&](int64_t begin, int64_t end) {
    for (size_t i = work.runs[begin]; i < work.runs[end]; ++i) {
      const Task& t = work.tasks[i];
      const MatmulGroup& g = groups[t.g];
      matmul_impl::matmul_rows_with(isa, matmul_impl::Path::kAuto, g.w, xs[t.g], g.n_tokens,
                                    g.y + t.r_begin, g.w.rows, t.r_begin, t.r_end);
    }
  });
}

void gated_matmul_grouped_with(simd::Isa isa, ThreadPool& pool,
                               const std::vector<GatedGroup>& groups) {
  for (const GatedGroup& g : groups) {
    check_group("gated_matmul_grouped", g.gate, g.x, g.n_tokens, g.y);
    check_group("gated_matmul_grouped", g.up, g.x, g.n_tokens, g.y);
    DUET_CHECK(g.gate.rows == g.up.rows && g.gate.cols == g.up.cols && g.gate.dtype == g.up.dtype,
               "gated_matmul_grouped: gate ["
                   << g.gate.rows << ", " << g.gate.cols << "] " << dtype_name(g.gate.dtype)
                   << " up [" << g.up.rows << ", " << g.up.cols << "] " << dtype_name(g.up.dtype));
  }
  const Work& work = make_work(
      groups, [](const GatedGroup& g) { return g.gate.rows; }, pool.n_threads());
  const std::vector<XRows> xs =
      direct_xs(isa, groups, [](const GatedGroup& g) -> const Matrix& { return g.gate; });
  pool.parallel_for(work.n_runs(), [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> up;  // [n_tokens, nr] the task's up rows
    for (size_t i = work.runs[begin]; i < work.runs[end]; ++i) {
      const Task& t = work.tasks[i];
      const GatedGroup& g = groups[t.g];
      const int64_t n_ff = g.gate.rows, nr = t.r_end - t.r_begin;
      up.resize(static_cast<size_t>(g.n_tokens * nr));
      float* y = g.y + t.r_begin;  // [n_tokens, nr] at row stride n_ff
      matmul_impl::matmul_rows_with(isa, matmul_impl::Path::kAuto, g.gate, xs[t.g], g.n_tokens, y,
                                    n_ff, t.r_begin, t.r_end);
      matmul_impl::matmul_rows_with(isa, matmul_impl::Path::kAuto, g.up, xs[t.g], g.n_tokens,
                                    up.data(), nr, t.r_begin, t.r_end);
      for (int64_t tok = 0; tok < g.n_tokens; ++tok) {
        silu_mul(y + tok * n_ff, up.data() + tok * nr, nr, y + tok * n_ff);
      }
    }
  });
}

namespace {

// Floats of results from which scatter_streamed adds them up on the pool rather than on the
// calling thread.
constexpr int64_t kSerialSumFloats = int64_t{1} << 14;

// matmul_grouped_scatter for decode (up to kStreamMaxTokens tokens in every group): each group's
// product whole, as matmul_grouped runs it (the groups' rows end to end in a few long runs, where
// blocks of output columns would read each group's matrix as short streams, one per block), into
// a buffer of results, which are then added to their output rows in group order, then row order,
// as the blocks of columns add them.
void scatter_streamed(simd::Isa isa, ThreadPool& pool, const std::vector<ScatterGroup>& groups,
                      const std::vector<float*>& clear, int64_t n_out, int64_t n_rows) {
  thread_local std::vector<float> parts;  // [n_rows, n_out] the groups' results, in order
  thread_local std::vector<MatmulGroup> products;
  parts.resize(static_cast<size_t>(n_rows * n_out));
  products.clear();
  float* part = parts.data();
  for (const ScatterGroup& g : groups) {
    if (g.n_tokens == 0) continue;
    products.push_back(MatmulGroup{g.w, XRows(g.x), g.n_tokens, part});
    part += g.n_tokens * n_out;
  }
  grouped_impl::matmul_grouped_with(isa, pool, products);
  const float* results = parts.data();  // the caller's buffer (a worker's `parts` is its own)
  const auto add_up = [&](int64_t c0, int64_t c1) {
    for (float* o : clear) std::fill(o + c0, o + c1, 0.0f);
    const float* row = results;
    for (const ScatterGroup& g : groups) {
      for (int64_t i = 0; i < g.n_tokens; ++i, row += n_out) {
        axpy(g.weight[i], row + c0, c1 - c0, g.out[i] + c0);
      }
    }
  };
  if (n_rows * n_out < kSerialSumFloats) {
    add_up(0, n_out);
  } else {
    pool.parallel_for(n_out, add_up, 16);
  }
}

}  // namespace

void matmul_grouped_scatter_with(simd::Isa isa, ThreadPool& pool,
                                 const std::vector<ScatterGroup>& groups,
                                 const std::vector<float*>& clear) {
  int64_t n_out = -1, n_rows = 0;
  for (const ScatterGroup& g : groups) {
    check_group("matmul_grouped_scatter", g.w, g.x, g.n_tokens, g.n_tokens ? g.out[0] : nullptr);
    DUET_CHECK(g.n_tokens == 0 || g.weight, "matmul_grouped_scatter: null weights");
    DUET_CHECK(n_out < 0 || g.w.rows == n_out,
               "matmul_grouped_scatter: output widths " << n_out << " and " << g.w.rows);
    n_out = g.w.rows;
    n_rows += g.n_tokens;
  }
  if (n_rows == 0 || n_out <= 0) return;
  if (most_tokens(groups) <= kStreamMaxTokens) {
    scatter_streamed(isa, pool, groups, clear, n_out, n_rows);
    return;
  }
  const int64_t cols = scatter_cols_per_task(n_out, most_tokens(groups), pool.n_threads());
  const std::vector<XRows> xs =
      direct_xs(isa, groups, [](const ScatterGroup& g) -> const Matrix& { return g.w; });
  pool.parallel_for((n_out + cols - 1) / cols, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> part;  // [n_tokens, nc] one group's block of results
    for (int64_t b = begin; b < end; ++b) {
      const int64_t c0 = b * cols, nc = std::min(cols, n_out - c0);
      for (float* o : clear) std::fill_n(o + c0, nc, 0.0f);
      for (const ScatterGroup& g : groups) {
        if (g.n_tokens == 0) continue;
        part.resize(static_cast<size_t>(g.n_tokens * nc));
        matmul_impl::matmul_rows_with(isa, matmul_impl::Path::kAuto, g.w, xs[&g - groups.data()],
                                      g.n_tokens, part.data(), nc, c0, c0 + nc);
        for (int64_t i = 0; i < g.n_tokens; ++i) {
          axpy(g.weight[i], part.data() + i * nc, nc, g.out[i] + c0);
        }
      }
    }
  });
}

}  // namespace grouped_impl

namespace {

// matmul_impl::isa_for the groups' weights: bf16's where every group's weights are bf16 (a MoE
// layer's experts share one dtype), else the one of every other dtype.
template <typename Group>
simd::Isa isa_for_groups(const std::vector<Group>& groups) {
  for (const Group& g : groups) {
    if (g.w.dtype != DType::kBF16) return simd::best_isa();
  }
  return matmul_impl::isa_for(DType::kBF16);
}

simd::Isa isa_for_groups(const std::vector<GatedGroup>& groups) {
  for (const GatedGroup& g : groups) {
    if (g.gate.dtype != DType::kBF16 || g.up.dtype != DType::kBF16) return simd::best_isa();
  }
  return matmul_impl::isa_for(DType::kBF16);
}

}  // namespace

void matmul_grouped(ThreadPool& pool, const std::vector<MatmulGroup>& groups) {
  grouped_impl::matmul_grouped_with(isa_for_groups(groups), pool, groups);
}

void gated_matmul_grouped(ThreadPool& pool, const std::vector<GatedGroup>& groups) {
  grouped_impl::gated_matmul_grouped_with(isa_for_groups(groups), pool, groups);
}

void matmul_grouped_scatter(ThreadPool& pool, const std::vector<ScatterGroup>& groups,
                            const std::vector<float*>& clear) {
  grouped_impl::matmul_grouped_scatter_with(isa_for_groups(groups), pool, groups, clear);
}

}  // namespace duet
