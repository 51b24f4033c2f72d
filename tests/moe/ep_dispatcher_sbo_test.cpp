// EpDispatcher's single-batch-overlap combine (low_latency in chunks of experts, each sent as
// soon as its experts ran) and its bf16 rows, on in-process ranks, against the single-rank
// LocalDispatcher on the same routing. Each step of a test routes fresh data, so a row that a
// chunk failed to deliver would leave the previous step's value behind and show.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>

#include "core/dtype.h"
#include "dist/inproc_backend.h"
#include "moe/ep_dispatcher.h"
#include "moe/fake_experts.h"
#include "moe/local_dispatcher.h"

namespace duet {
namespace {

// One rank's tokens. Row t's first value is the integer 64 · rank + t (exact in bf16), so a row
// that arrives names its token; the rest are random.
struct Tokens {
  int64_t n = 0, D = 0, K = 0;
  std::vector<float> x, w;
  std::vector<int32_t> ids;
};

// How a rank's tokens pick experts.
enum class Shape {
  kRandom,     // K distinct experts at random
  kOneExpert,  // every token to expert 0 (one rank gets everything, experts with no rows)
  kIdleRank1,  // rank 1 has no tokens, the others random
};

Tokens make_tokens(int rank, int step, int64_t n_expert, int64_t n, int64_t D, int64_t K,
                   Shape shape) {
  std::mt19937 rng(static_cast<uint32_t>(97 * rank + 13 * step + 5));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Tokens t{shape == Shape::kIdleRank1 && rank == 1 ? 0 : n, D, K, {}, {}, {}};
  for (int64_t i = 0; i < t.n; ++i) {
    t.x.push_back(static_cast<float>(64 * rank + i));
    for (int64_t d = 1; d < D; ++d) t.x.push_back(u(rng));
    const int32_t start = static_cast<int32_t>(rng() % n_expert);
    for (int64_t j = 0; j < K; ++j) {
      t.ids.push_back(shape == Shape::kOneExpert
                          ? static_cast<int32_t>(j)
                          : static_cast<int32_t>((start + 3 * j) % n_expert));
      t.w.push_back(0.5f + 0.25f * u(rng));
    }
  }
  return t;
}

float expert_fn(int64_t e, float v) {
  return static_cast<float>(e + 1) * v + 0.25f * e;
}

float round_bf16(float v) {
  return bf16_to_f32(f32_to_bf16(v));
}

std::vector<float> run_step(Dispatcher& d, const Tokens& t,
                            const std::function<void(ExpertBatch&)>& check_batch = {}) {
  std::vector<float> out(static_cast<size_t>(t.n * t.D), 0.5f);
  d.dispatch_send({t.x.data(), t.ids.data(), t.w.data(), t.n, t.D, t.K, out.data()});
  ExpertBatch& b = d.dispatch_recv();
  if (check_batch) check_batch(b);
  run_fake_experts(b, expert_fn);
  d.combine_send();
  d.combine_recv();
  return out;
}

// What a rank's tokens come back as with bf16 or fp8 rows: each input row rounded (`rows`); each
// output row that travels rounded (`back_rows`) — under low_latency every (token, expert) row,
// under high_throughput the sum of the token's experts on each other rank (its own rank's experts
// add theirs unrounded).
std::vector<float> rounded_reference(const Tokens& t, const ExpertPlacement& p, int rank,
                                     All2AllBackend backend, RowDtype rows, RowDtype back_rows) {
  const WireRows wire(rows, t.D), back(back_rows, t.D);
  std::vector<float> out(static_cast<size_t>(t.n * t.D), 0.5f);
  std::vector<float> x(static_cast<size_t>(t.D)), y(x.size());
  for (int64_t i = 0; i < t.n; ++i) {
    wire.round(t.x.data() + i * t.D, x.data());
    std::vector<std::vector<float>> per_rank(static_cast<size_t>(p.world_size),
                                             std::vector<float>(x.size(), 0.0f));
    for (int64_t k = 0; k < t.K; ++k) {
      const int32_t e = t.ids[i * t.K + k];
      for (int64_t d = 0; d < t.D; ++d) y[d] = expert_fn(e, x[d]);
      if (backend == All2AllBackend::kLowLatency) {
        back.round(y.data(), y.data());
        for (int64_t d = 0; d < t.D; ++d) out[i * t.D + d] += t.w[i * t.K + k] * y[d];
      } else {
        for (int64_t d = 0; d < t.D; ++d) per_rank[p.owner(e)][d] += t.w[i * t.K + k] * y[d];
      }
    }
    if (backend == All2AllBackend::kHighThroughput) {
      for (int r = 0; r < p.world_size; ++r) {
        if (r != rank) back.round(per_rank[r].data(), per_rank[r].data());
        for (int64_t d = 0; d < t.D; ++d) out[i * t.D + d] += per_rank[r][d];
      }
    }
  }
  return out;
}

void expect_near(const std::vector<float>& got, const std::vector<float>& want,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5f * (1 + std::abs(want[i]))) << what << " at " << i;
}

struct SboCase {
  int world;
  int chunks;
  RowDtype rows;
  All2AllBackend backend;
  std::optional<RowDtype> back_rows = std::nullopt;  // the combine's, if not `rows`
  bool own_last = false;                             // EpDispatcherOptions::own_experts_last
  bool counts_first = false;  // and EpDispatcherOptions::own_rows_beside_dispatch
};

class EpDispatcherSboTest : public ::testing::TestWithParam<SboCase> {};

// Every rank's tokens come back as LocalDispatcher (or, with bf16 rows, the bf16 reference)
// gives them, over steps of fresh data, in three routing shapes; in a chunked combine each row an
// expert here produced travels once (the combine's bytes are exactly the batch's rows).
TEST_P(EpDispatcherSboTest, SameAsOneRank) {
  const SboCase c = GetParam();
  const int64_t n_expert = 12, D = 6, K = 2;
  for (Shape shape : {Shape::kRandom, Shape::kOneExpert, Shape::kIdleRank1}) {
    run_ranks(c.world, [&](DistContext& ctx) {
      const int r = ctx.rank();
      const ExpertPlacement p = place_experts(n_expert, c.world);
      EpDispatcherOptions opt{c.backend, 16};
      opt.row_dtype = c.rows;
      opt.combine_dtype = c.back_rows;
      opt.combine_chunks = c.chunks;
      opt.own_experts_last = c.own_last;
      opt.own_rows_beside_dispatch = c.counts_first;
      const RowDtype back_rows = c.back_rows.value_or(c.rows);
      EpDispatcher ep(ctx.comm(), p, opt);
      LocalDispatcher local(n_expert);
      for (int step = 0; step < 3; ++step) {
        if (step == 2) ep.plan_step(16);
        const Tokens t = make_tokens(r, step, n_expert, 5 + r, D, K, shape);
        int64_t rows = 0;
        const std::vector<float> got = run_step(ep, t, [&](ExpertBatch& b) {
          rows = b.n_rows();
          const bool chunked = c.backend == All2AllBackend::kLowLatency && c.chunks > 1;
          if (!c.own_last) {
            EXPECT_EQ(b.chunk_ends.size(),
                      chunked ? static_cast<size_t>(std::min<int64_t>(c.chunks, p.n_local())) : 0u);
          }
        });
        const std::string what = "shape " + std::to_string(static_cast<int>(shape)) + " rank " +
                                 std::to_string(r) + " step " + std::to_string(step);
        if (c.rows != RowDtype::kF32 || back_rows != RowDtype::kF32) {
          expect_near(got, rounded_reference(t, p, r, c.backend, c.rows, back_rows), what);
        } else {
          expect_near(got, run_step(local, t), what);
        }
        if (c.backend == All2AllBackend::kLowLatency && c.chunks > 1) {
          const int64_t row_bytes = WireRows(back_rows, D).words() * 4;
          EXPECT_EQ(ep.last_combine_bytes(), rows * row_bytes) << what;
        }
      }
    });
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, EpDispatcherSboTest,
    ::testing::Values(
        SboCase{2, 2, RowDtype::kF32, All2AllBackend::kLowLatency},
        SboCase{3, 4, RowDtype::kF32, All2AllBackend::kLowLatency},
        SboCase{4, 3, RowDtype::kF32, All2AllBackend::kLowLatency},
        SboCase{4, 2, RowDtype::kF32, All2AllBackend::kLowLatency},
        SboCase{1, 2, RowDtype::kF32, All2AllBackend::kLowLatency},
        SboCase{2, 1, RowDtype::kBF16, All2AllBackend::kLowLatency},
        SboCase{4, 3, RowDtype::kBF16, All2AllBackend::kLowLatency},
        SboCase{2, 1, RowDtype::kBF16, All2AllBackend::kHighThroughput},
        SboCase{3, 1, RowDtype::kBF16, All2AllBackend::kHighThroughput},
        SboCase{2, 1, RowDtype::kFp8, All2AllBackend::kLowLatency},
        SboCase{4, 3, RowDtype::kFp8, All2AllBackend::kLowLatency},
        SboCase{3, 1, RowDtype::kFp8, All2AllBackend::kHighThroughput},
        SboCase{4, 2, RowDtype::kF32, All2AllBackend::kHighThroughput},
        // A combine in other rows than the dispatch (DeepEP's fp8 / bf16).
        SboCase{2, 2, RowDtype::kFp8, All2AllBackend::kLowLatency, RowDtype::kBF16},
        SboCase{4, 3, RowDtype::kFp8, All2AllBackend::kLowLatency, RowDtype::kBF16},
        SboCase{3, 1, RowDtype::kFp8, All2AllBackend::kLowLatency, RowDtype::kBF16},
        SboCase{3, 1, RowDtype::kFp8, All2AllBackend::kHighThroughput, RowDtype::kBF16},
        SboCase{2, 2, RowDtype::kBF16, All2AllBackend::kLowLatency, RowDtype::kF32},
        SboCase{3, 1, RowDtype::kF32, All2AllBackend::kLowLatency, RowDtype::kBF16},
        SboCase{2, 1, RowDtype::kF32, All2AllBackend::kHighThroughput, RowDtype::kFp8},
        // The own experts last (one transfer each way; chunked steps keep their chunks).
        SboCase{2, 1, RowDtype::kF32, All2AllBackend::kLowLatency, std::nullopt, true},
        SboCase{4, 1, RowDtype::kF32, All2AllBackend::kLowLatency, std::nullopt, true},
        SboCase{3, 1, RowDtype::kBF16, All2AllBackend::kLowLatency, std::nullopt, true},
        SboCase{2, 1, RowDtype::kFp8, All2AllBackend::kLowLatency, RowDtype::kBF16, true},
        SboCase{4, 3, RowDtype::kF32, All2AllBackend::kLowLatency, std::nullopt, true},
        SboCase{1, 1, RowDtype::kF32, All2AllBackend::kLowLatency, std::nullopt, true},
        SboCase{2, 1, RowDtype::kF32, All2AllBackend::kHighThroughput, std::nullopt, true},
        SboCase{4, 1, RowDtype::kF32, All2AllBackend::kHighThroughput, std::nullopt, true},
        SboCase{3, 1, RowDtype::kBF16, All2AllBackend::kHighThroughput, std::nullopt, true},
        SboCase{2, 1, RowDtype::kFp8, All2AllBackend::kHighThroughput, RowDtype::kBF16, true},
        // And the counts ahead of the rows.
        SboCase{2, 1, RowDtype::kF32, All2AllBackend::kLowLatency, std::nullopt, true, true},
        SboCase{4, 1, RowDtype::kF32, All2AllBackend::kLowLatency, std::nullopt, true, true},
        SboCase{3, 1, RowDtype::kBF16, All2AllBackend::kLowLatency, std::nullopt, true, true},
        SboCase{2, 1, RowDtype::kFp8, All2AllBackend::kLowLatency, RowDtype::kBF16, true, true},
        SboCase{4, 3, RowDtype::kF32, All2AllBackend::kLowLatency, std::nullopt, true, true},
        SboCase{1, 1, RowDtype::kF32, All2AllBackend::kLowLatency, std::nullopt, true, true}),
    [](const ::testing::TestParamInfo<SboCase>& info) {
      const SboCase& c = info.param;
      return std::string(all2all_backend_name(c.backend)) + "_ep" + std::to_string(c.world) +
             "_chunks" + std::to_string(c.chunks) + "_" + all2all_dtype_name(c.rows) +
             (c.back_rows ? std::string("_back_") + all2all_dtype_name(*c.back_rows) : "") +
             (c.own_last ? "_own_last" : "") + (c.counts_first ? "_counts_first" : "");
    });

// One of 2 ranks with the own experts last (16 experts, rows of 6, top 2, 3 tokens a rank),
// stepped with fresh tokens each step.
struct OwnLastRank {
  static EpDispatcherOptions options(All2AllBackend backend, RowDtype rows, bool counts_first) {
    EpDispatcherOptions opt{backend, 16};
    opt.row_dtype = rows;
    opt.own_experts_last = true;
    opt.own_rows_beside_dispatch = counts_first;
    return opt;
  }
  OwnLastRank(DistContext& ctx, All2AllBackend backend, RowDtype rows, bool counts_first)
      : r(ctx.rank()),
        backend(backend),
        rows(rows),
        p(place_experts(16, 2)),
        ep(ctx.comm(), p, options(backend, rows, counts_first)) {}
  // Dispatches step `step`'s tokens and returns the batch.
  ExpertBatch& dispatch(int step) {
    t = make_tokens(r, step, 16, 3, 6, 2, Shape::kRandom);
    out.assign(static_cast<size_t>(t.n * t.D), 0.5f);
    ep.dispatch_send({t.x.data(), t.ids.data(), t.w.data(), t.n, t.D, t.K, out.data()});
    return ep.dispatch_recv();
  }
  // Runs the experts and the combine; the tokens must come back as one rank gives them.
  void finish(ExpertBatch& b, int step) {
    run_fake_experts(b, expert_fn);
    ep.combine_send();
    ep.combine_recv();
    expect_near(out, rounded_reference(t, p, r, backend, rows, rows),
                "step " + std::to_string(step));
  }
  const int r;
  const All2AllBackend backend;
  const RowDtype rows;
  const ExpertPlacement p;
  EpDispatcher ep;
  Tokens t;
  std::vector<float> out;
};

// With own_experts_last, a step whose transfers go whole (both algorithms) runs its experts in
// two chunks: first every expert with a row from another rank (the row's first value names its
// token's rank), then those whose rows are all this rank's; the combine has left when the first
// chunk is done (its bytes are counted then), and every rank's tokens come back as one rank
// gives them. A step where every expert with rows has remote rows runs in index order,
// unchunked.
TEST(EpDispatcherOwnLast, ExpertsWithRemoteRowsFirstAndTheCombineLeavesAfterThem) {
  for (auto [backend, rows] : {std::pair{All2AllBackend::kLowLatency, RowDtype::kF32},
                               {All2AllBackend::kLowLatency, RowDtype::kBF16},
                               {All2AllBackend::kHighThroughput, RowDtype::kF32},
                               {All2AllBackend::kHighThroughput, RowDtype::kBF16}}) {
    SCOPED_TRACE(std::string(all2all_backend_name(backend)) + " " + all2all_dtype_name(rows));
    run_ranks(2, [&](DistContext& ctx) {
      OwnLastRank rank(ctx, backend, rows, false);
      const int r = rank.r;
      const ExpertPlacement& p = rank.p;
      EpDispatcher& ep = rank.ep;
      int ordered = 0;
      for (int step = 0; step < 6; ++step) {
        ExpertBatch& b = rank.dispatch(step);
        auto remote = [&](int64_t l) {  // rows of expert l from the other rank
          int64_t n = 0;
          for (int64_t i = b.offsets[l]; i < b.offsets[l + 1]; ++i)
            n += static_cast<int>(b.x[i][0]) / 64 != r;
          return n;
        };
        if (!b.chunk_ends.empty()) {
          ++ordered;
          ASSERT_EQ(b.chunk_ends.size(), 2u);
          ASSERT_EQ(b.order.size(), static_cast<size_t>(p.n_local()));
          std::vector<int32_t> sorted = b.order;
          std::sort(sorted.begin(), sorted.end());
          for (int64_t l = 0; l < p.n_local(); ++l) ASSERT_EQ(sorted[l], l);
          for (int64_t i = 0; i < p.n_local(); ++i) {
            const int64_t l = b.order[i];
            if (i < b.chunk_ends[0]) {
              EXPECT_GT(remote(l), 0) << "expert " << l;
            } else {
              EXPECT_EQ(remote(l), 0) << "expert " << l;
            }
          }
          EXPECT_GT(b.offsets[b.order[b.chunk_ends[0]] + 1], b.offsets[b.order[b.chunk_ends[0]]])
              << "the second chunk starts with an expert of own rows";
          b.chunk_done = [&ep, done = b.chunk_done](int c) {  // done: a copy, it outlives here
            done(c);
            if (c == 0) {
              EXPECT_GT(ep.last_combine_bytes(), 0) << "the combine left";
            }
          };
        } else {
          int64_t with_remote = 0, own_only = 0;
          for (int64_t l = 0; l < p.n_local(); ++l) {
            with_remote += remote(l) > 0;
            own_only += remote(l) == 0 && b.offsets[l + 1] > b.offsets[l];
          }
          EXPECT_TRUE(with_remote == 0 || own_only == 0) << with_remote << " " << own_only;
        }
        rank.finish(b, step);
      }
      EXPECT_GT(ordered, 0) << "no step had both kinds of experts";
    });
  }
}

// With own_rows_beside_dispatch too, the counts travel ahead of the rows: chunk 0 is half of the
// experts whose rows are all this rank's, chunk 1 the experts with the other rank's rows (their
// rows waited for at chunk_ready(1); the combine has left when it is done), chunk 2 the rest;
// every chunk gets its chunk_ready, and every rank's tokens come back as one rank gives them (each
// step's rows are fresh, so a row read before it arrived would show).
TEST(EpDispatcherOwnLast, CountsAheadHalfTheOwnExpertsBesideTheDispatch) {
  for (RowDtype rows : {RowDtype::kF32, RowDtype::kBF16}) {
    SCOPED_TRACE(all2all_dtype_name(rows));
    run_ranks(2, [&](DistContext& ctx) {
      OwnLastRank rank(ctx, All2AllBackend::kLowLatency, rows, true);
      const ExpertPlacement& p = rank.p;
      EpDispatcher& ep = rank.ep;
      const int r = rank.r;
      int ordered = 0;
      for (int step = 0; step < 6; ++step) {
        ExpertBatch& b = rank.dispatch(step);
        ASSERT_FALSE(b.chunk_ends.empty()) << "the rows come in a second transfer";
        const bool three = b.chunk_ends.size() == 3;
        if (three) {
          ++ordered;
          int64_t later_own = 0;
          for (int64_t i = 0; i < p.n_local(); ++i) {
            const int64_t l = b.order[i];
            const bool has_rows = b.offsets[l + 1] > b.offsets[l];
            if (i < b.chunk_ends[0]) {
              EXPECT_TRUE(has_rows) << "expert " << l;
            }
            if (i >= b.chunk_ends[1] && has_rows) ++later_own;
          }
          EXPECT_TRUE(b.chunk_ends[0] == later_own || b.chunk_ends[0] == later_own + 1)
              << b.chunk_ends[0] << " now, " << later_own << " later";
        }
        std::vector<int> readies;
        const std::function<void(int)> ready = b.chunk_ready, done = b.chunk_done;
        b.chunk_ready = [&](int c) {
          readies.push_back(c);
          ready(c);
          if (three && c == 1) {  // the rows are in: each expert of chunk 1 has the other's
            for (int64_t i = b.chunk_ends[0]; i < b.chunk_ends[1]; ++i) {
              const int64_t l = b.order[i];
              int64_t remote = 0;
              for (int64_t row = b.offsets[l]; row < b.offsets[l + 1]; ++row)
                remote += static_cast<int>(b.x[row][0]) / 64 != r;
              EXPECT_GT(remote, 0) << "expert " << l;
            }
          }
        };
        b.chunk_done = [&](int c) {
          done(c);
          if (three && c == 1) {
            EXPECT_GT(ep.last_combine_bytes(), 0) << "the combine left";
          }
        };
        rank.finish(b, step);
        EXPECT_EQ(readies.size(), b.chunk_ends.size());
      }
      EXPECT_GT(ordered, 0) << "no step had both kinds of experts";
    });
  }
}

// With min_chunk_bytes, the chunks follow the step's size, alike on every rank: a step planned
// for 16 tokens (16 · K = 32 rows of 24 bytes back, 768 bytes) leaves in 768 / 256 = 3 chunks,
// one planned for 11 (528 bytes) in 2, one planned for 4 (192 bytes) in one transfer; the results
// stay the single-rank ones.
TEST(EpDispatcherSboChunks, FewerChunksForSmallSteps) {
  run_ranks(2, [](DistContext& ctx) {
    const int64_t n_expert = 12, D = 6, K = 2;
    EpDispatcherOptions opt{All2AllBackend::kLowLatency, 16};
    opt.combine_chunks = 6;
    opt.min_chunk_bytes = 256;
    EpDispatcher ep(ctx.comm(), place_experts(n_expert, 2), opt);
    LocalDispatcher local(n_expert);
    for (const auto& [plan, chunks] : {std::pair<int64_t, size_t>{16, 3}, {4, 0}, {11, 2}}) {
      ep.plan_step(plan);
      const Tokens t =
          make_tokens(ctx.rank(), static_cast<int>(plan), n_expert, 3, D, K, Shape::kRandom);
      const std::vector<float> got =
          run_step(ep, t, [&](ExpertBatch& b) { EXPECT_EQ(b.chunk_ends.size(), chunks) << plan; });
      expect_near(got, run_step(local, t), "plan " + std::to_string(plan));
    }
  });
}

// Told a step runs as two micro-batches, a dispatcher with chunk_micro_batches off (SBO's own
// choice) moves it unchunked; forced chunks (the option on) stay.
TEST(EpDispatcherSboChunks, SplitStepsUnchunkedUnlessForced) {
  run_ranks(2, [](DistContext& ctx) {
    const int64_t n_expert = 12, D = 6, K = 2;
    for (bool chunk_split : {false, true}) {
      EpDispatcherOptions opt{All2AllBackend::kLowLatency, 16};
      opt.combine_chunks = 3;
      opt.chunk_micro_batches = chunk_split;
      EpDispatcher ep(ctx.comm(), place_experts(n_expert, 2), opt);
      LocalDispatcher local(n_expert);
      for (bool split : {true, false, true}) {
        ep.plan_step(8, split);
        const Tokens t = make_tokens(ctx.rank(), split, n_expert, 4, D, K, Shape::kRandom);
        const size_t want = split && !chunk_split ? 0 : 3;
        const std::vector<float> got =
            run_step(ep, t, [&](ExpertBatch& b) { EXPECT_EQ(b.chunk_ends.size(), want) << split; });
        expect_near(got, run_step(local, t), "split " + std::to_string(split));
      }
    }
  });
}

// With bf16 rows, the rows the experts read are exactly the bf16 rounding of their tokens' rows,
// wherever the expert lives (the rank's own tokens included), and a chunked combine with bf16
// rows sends half the bytes of f32.
TEST(EpDispatcherBf16, ExpertsReadTheExactRoundingOfEachRow) {
  for (All2AllBackend backend : {All2AllBackend::kHighThroughput, All2AllBackend::kLowLatency}) {
    SCOPED_TRACE(all2all_backend_name(backend));
    run_ranks(3, [&](DistContext& ctx) {
      const int64_t n_expert = 6, D = 8, K = 2;
      EpDispatcherOptions opt{backend, 16};
      opt.row_dtype = RowDtype::kBF16;
      EpDispatcher ep(ctx.comm(), place_experts(n_expert, 3), opt);
      std::vector<Tokens> all;  // every rank's tokens, to look a row up by its first value
      for (int s = 0; s < 3; ++s)
        all.push_back(make_tokens(s, 0, n_expert, 4, D, K, Shape::kRandom));
      int64_t checked = 0;
      run_step(ep, all[static_cast<size_t>(ctx.rank())], [&](ExpertBatch& b) {
        for (int64_t row = 0; row < b.n_rows(); ++row) {
          const int id = static_cast<int>(b.x[row][0]);
          const Tokens& src = all[static_cast<size_t>(id / 64)];
          const float* want = src.x.data() + (id % 64) * D;
          for (int64_t d = 0; d < D; ++d) {
            ASSERT_EQ(b.x[row][d], round_bf16(want[d])) << "row " << row << " value " << d;
            ++checked;
          }
        }
      });
      EXPECT_GT(checked, 0);
      EXPECT_EQ(ep.last_dispatch_bytes() % 2, 0);
    });
  }
}

// With fp8 rows, every row an expert reads is exactly the fp8 rounding (a scale per 128 values)
// of one of the tokens' rows, wherever the expert lives (the rank's own tokens included); and
// what travels per row is its scales and one byte per value: D = 300 takes 3 scale words and 75
// code words instead of 300 f32 words.
TEST(EpDispatcherFp8, ExpertsReadTheExactRoundingOfEachRowAndRowsTakeAQuarter) {
  for (All2AllBackend backend : {All2AllBackend::kHighThroughput, All2AllBackend::kLowLatency}) {
    SCOPED_TRACE(all2all_backend_name(backend));
    run_ranks(3, [&](DistContext& ctx) {
      const int64_t n_expert = 6, D = 300, K = 2;
      const WireRows wire(RowDtype::kFp8, D);
      EXPECT_EQ(wire.words(), 3 + 75);
      std::vector<std::vector<float>> rounded;  // every rank's rows as they should arrive
      for (int s = 0; s < 3; ++s) {
        const Tokens src = make_tokens(s, 0, n_expert, 4, D, K, Shape::kRandom);
        for (int64_t i = 0; i < src.n; ++i) {
          rounded.emplace_back(static_cast<size_t>(D));
          wire.round(src.x.data() + i * D, rounded.back().data());
        }
      }
      const Tokens t = make_tokens(ctx.rank(), 0, n_expert, 4, D, K, Shape::kRandom);
      int64_t bytes[2], rows = 0;
      for (int i = 0; i < 2; ++i) {
        EpDispatcherOptions opt{backend, 16};
        opt.row_dtype = i == 0 ? RowDtype::kF32 : RowDtype::kFp8;
        EpDispatcher ep(ctx.comm(), place_experts(n_expert, 3), opt);
        run_step(ep, t, [&](ExpertBatch& b) {
          if (i == 0) return;
          rows = b.n_rows();
          for (int64_t row = 0; row < b.n_rows(); ++row) {
            bool found = false;
            for (const std::vector<float>& want : rounded)
              found |= std::equal(want.begin(), want.end(), b.x[row]);
            EXPECT_TRUE(found) << "row " << row << " is no token's fp8 rounding";
          }
        });
        bytes[i] = ep.last_dispatch_bytes();
      }
      EXPECT_GT(rows, 0);
      // The rows sent (own rows never enter the transport) account for the whole difference.
      EXPECT_EQ((bytes[0] - bytes[1]) % ((D - wire.words()) * 4), 0);
      EXPECT_GT(bytes[0], 3 * bytes[1]);
    });
  }
}

// bf16 rows halve what travels: the same step's dispatch bytes, f32 against bf16, differ by the
// rows' half (headers and counts stay f32 words).
TEST(EpDispatcherBf16, HalvesTheRowBytes) {
  run_ranks(2, [](DistContext& ctx) {
    const int64_t n_expert = 4, D = 16, K = 2;
    const Tokens t = make_tokens(ctx.rank(), 0, n_expert, 3, D, K, Shape::kRandom);
    for (All2AllBackend backend : {All2AllBackend::kHighThroughput, All2AllBackend::kLowLatency}) {
      int64_t bytes[2];
      int64_t rows = 0;
      for (int i = 0; i < 2; ++i) {
        EpDispatcherOptions opt{backend, 16};
        opt.row_dtype = i == 0 ? RowDtype::kF32 : RowDtype::kBF16;
        EpDispatcher ep(ctx.comm(), place_experts(n_expert, 2), opt);
        run_step(ep, t);
        bytes[i] = ep.last_dispatch_bytes();
        // Rows sent: high_throughput a record per (token, destination), low_latency per pair.
        rows = 0;
        for (int64_t i2 = 0; i2 < t.n; ++i2) {
          if (backend == All2AllBackend::kLowLatency) {
            rows += K;
          } else {
            const int a = t.ids[i2 * K] / 2, b = t.ids[i2 * K + 1] / 2;
            rows += a == b ? 1 : 2;
          }
        }
      }
      EXPECT_EQ(bytes[0] - bytes[1], rows * D * 2) << all2all_backend_name(backend);
    }
  });
}

}  // namespace
}  // namespace duet
