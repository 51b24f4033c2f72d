// The serving engine as a data-parallel group on in-process ranks, experts split over them:
// requests submitted to rank 0 spread over the ranks and each gets its single-rank greedy
// tokens; an abort reaches the rank that holds the request and frees its blocks there; a rank
// that stops answering fails rank 0's engine within the watchdog, ends in-flight requests with
// an error and makes submit refuse new ones.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <random>
#include <thread>

#include "dist/inproc_backend.h"
#include "engine/generator.h"
#include "engine/executor.h"
#include "engine/llm_engine.h"
#include "engine/tiny_models.h"
#include "moe/borrowed_dispatcher.h"
#include "moe/ep_dispatcher.h"

namespace duet {
namespace {

EngineConfig small_config(bool overlap = true, int64_t steps = 1) {
  EngineConfig c;
  c.overlap_schedule = overlap;
  c.num_scheduler_steps = steps;
  c.scheduler = {8, 64};
  c.block_size = 4;
  c.kv_cache_gib = 1.0 / 1024;  // 1 MiB: plenty for these requests
  return c;
}

EngineRequest greedy(std::vector<int32_t> prompt, int64_t max_tokens) {
  EngineRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

std::vector<int32_t> drain(RequestStream& s, std::string* reason, std::string* error = nullptr) {
  std::vector<int32_t> toks;
  for (int i = 0; i < 2000; ++i) {
    StreamDelta d = s.wait(std::chrono::milliseconds(50));
    toks.insert(toks.end(), d.tokens.begin(), d.tokens.end());
    if (d.finished) {
      *reason = d.finish_reason;
      if (error) *error = d.error;
      return toks;
    }
  }
  ADD_FAILURE() << "stream never finished";
  return toks;
}

// Each request's greedy tokens from the single-rank Generator, alone.
std::vector<std::vector<int32_t>> single_rank_tokens(const std::string& dir,
                                                     const std::vector<EngineRequest>& reqs) {
  std::unique_ptr<Model> m = Model::load(dir);
  ThreadPool pool(1);
  Generator g(*m, pool);
  std::vector<std::vector<int32_t>> out;
  for (const EngineRequest& r : reqs) {
    GenerateRequest gr;
    gr.prompt = r.prompt;
    gr.max_tokens = r.max_tokens;
    out.push_back(g.generate({gr})[0].tokens);
  }
  return out;
}

struct RankParts {
  std::unique_ptr<Model> model;
  std::unique_ptr<EpDispatcher> dispatcher;
};

RankParts load_rank(const std::string& dir, DistContext& ctx,
                    All2AllBackend backend = All2AllBackend::kHighThroughput) {
  const ExpertPlacement place = place_experts(8, ctx.world_size());
  RankParts p;
  p.model = Model::load(dir, LoadOptions{place.begin(ctx.rank()), place.end(ctx.rank())});
  // low_latency with room for 8 tokens per rank: decode steps use it, the longer prefills
  // must switch to high_throughput (every rank alike) instead of failing.
  p.dispatcher = std::make_unique<EpDispatcher>(ctx.comm(), place, EpDispatcherOptions{backend, 8});
  return p;
}

struct DpCase {
  int world;
  All2AllBackend backend;
  bool overlap = true;  // the overlapped scheduler
  int64_t steps = 1;    // --num-scheduler-steps
};

class LlmEngineDpTest : public ::testing::TestWithParam<DpCase> {};

TEST_P(LlmEngineDpTest, RequestsSpreadOverRanksGetSingleRankTokens) {
  const std::string dir = test::tiny_model_dir("qwen3_moe");
  std::mt19937 rng(5);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 10; ++i) {
    std::vector<int32_t> prompt;
    for (int j = 0; j < 3 + 3 * i; ++j) prompt.push_back(1 + static_cast<int32_t>(rng() % 500));
    reqs.push_back(greedy(prompt, 4 + i % 4));
  }
  const std::vector<std::vector<int32_t>> want = single_rank_tokens(dir, reqs);

  std::mutex mu;
  const DpCase dc = GetParam();
  std::vector<uint64_t> finished_per_rank(static_cast<size_t>(dc.world));
  run_ranks(dc.world, [&](DistContext& ctx) {
    RankParts p = load_rank(dir, ctx, dc.backend);
    ThreadPool pool(1);
    LlmEngine engine(*p.model, pool, nullptr, small_config(dc.overlap, dc.steps),
                     test::borrowing_group(ctx.coord(), *p.dispatcher));
    if (ctx.rank() == 0) {
      std::vector<std::shared_ptr<RequestStream>> streams;
      for (const EngineRequest& r : reqs) streams.push_back(engine.submit(r));
      for (size_t i = 0; i < streams.size(); ++i) {
        ASSERT_TRUE(streams[i]);
        std::string reason;
        EXPECT_EQ(drain(*streams[i], &reason), want[i]) << "request " << i;
        EXPECT_EQ(reason, "length");
      }
      // The counters are added at the end of the step that produced the last token.
      uint64_t n_tokens = 0;
      for (const auto& w : want) n_tokens += w.size();
      EngineMetricsSnapshot m;
      for (int i = 0; i < 400; ++i) {
        m = engine.metrics().snapshot();
        if (m.generation_tokens == n_tokens) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      EXPECT_EQ(m.generation_tokens, n_tokens);
      EXPECT_EQ(m.finished.at("length"), reqs.size());
    } else {
      EXPECT_EQ(engine.wait_stopped(), "");
    }
    // Every rank's own engine counts the requests it ran itself.
    const EngineMetricsSnapshot own = engine.metrics().snapshot();
    std::lock_guard<std::mutex> lock(mu);
    auto it = own.finished.find("length");
    finished_per_rank[ctx.rank()] = it == own.finished.end() ? 0 : it->second;
  });
  // Rank 0 reports every request; each other rank ran some of them (least loaded first).
  for (int r = 1; r < dc.world; ++r) EXPECT_GT(finished_per_rank[r], 0u) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Ranks, LlmEngineDpTest,
                         ::testing::Values(DpCase{2, All2AllBackend::kHighThroughput},
                                           DpCase{4, All2AllBackend::kHighThroughput},
                                           DpCase{2, All2AllBackend::kLowLatency},
                                           DpCase{4, All2AllBackend::kLowLatency},
                                           // Scheduler modes: plain, multi-step with and
                                           // without the overlapped scheduler.
                                           DpCase{2, All2AllBackend::kHighThroughput, false, 1},
                                           DpCase{2, All2AllBackend::kLowLatency, true, 4},
                                           DpCase{4, All2AllBackend::kHighThroughput, false, 3},
                                           DpCase{4, All2AllBackend::kLowLatency, true, 3}));

TEST(LlmEngineDp, AbortReachesTheRankHoldingTheRequest) {
  const std::string dir = test::tiny_model_dir("qwen3_moe");
  run_ranks(2, [&](DistContext& ctx) {
    RankParts p = load_rank(dir, ctx);
    ThreadPool pool(1);
    LlmEngine engine(*p.model, pool, nullptr, small_config(),
                     test::borrowing_group(ctx.coord(), *p.dispatcher));
    if (ctx.rank() != 0) {
      EXPECT_EQ(engine.wait_stopped(), "");
      EXPECT_EQ(engine.metrics().snapshot().finished.at("abort"), 1u);
      return;
    }
    // The first request goes to rank 0 and the second, long one to rank 1.
    std::shared_ptr<RequestStream> a = engine.submit(greedy({1, 2, 3}, 60));
    std::shared_ptr<RequestStream> b = engine.submit(greedy({4, 5, 6}, 400));
    std::string reason;
    const StreamDelta first = b->wait(std::chrono::milliseconds(5000));
    EXPECT_FALSE(first.tokens.empty());
    b->abort();
    drain(*b, &reason);
    EXPECT_EQ(reason, "abort");
    drain(*a, &reason);
    EXPECT_EQ(reason, "length");
    bool freed = false;
    for (int i = 0; i < 400 && !freed; ++i) {
      const EngineMetricsSnapshot m = engine.metrics().snapshot();
      freed = m.kv_blocks_used == 0 && m.n_running == 0;
      if (!freed) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_TRUE(freed) << "the aborted request's blocks were not freed on rank 1";
  });
}

// With a step in flight on the worker (the overlapped scheduler, alone or with multi-step) or
// not (plain), a rank that stops answering fails the engine within the watchdog.
class LlmEngineDpFailure : public ::testing::TestWithParam<DpCase> {};

TEST_P(LlmEngineDpFailure, SilentRankFailsTheEngineWithinTheWatchdog) {
  const std::string dir = test::tiny_model_dir("qwen3_moe");
  const DpCase dc = GetParam();
  const std::vector<std::string> errors = run_ranks_collect(
      2,
      [&](DistContext& ctx) {
        RankParts p = load_rank(dir, ctx);
        ThreadPool pool(1);
        if (ctx.rank() == 1) {
          // Rank 1 stops answering (its engine is never built, its thread just waits), as a
          // hung process would.
          stop_answering(ctx);
          std::this_thread::sleep_for(std::chrono::milliseconds(3000));
          return;
        }
        LlmEngine engine(*p.model, pool, nullptr, small_config(dc.overlap, dc.steps),
                         test::borrowing_group(ctx.coord(), *p.dispatcher));
        std::shared_ptr<RequestStream> s = engine.submit(greedy({1, 2, 3}, 400));
        ASSERT_TRUE(s);
        const auto t0 = std::chrono::steady_clock::now();
        std::string reason, error;
        drain(*s, &reason, &error);
        const double waited =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        EXPECT_EQ(reason, "abort");
        EXPECT_NE(error.find("engine error"), std::string::npos) << error;
        EXPECT_LT(waited, 8.0);  // the watchdog is 1 s: an error, never a hang
        EXPECT_FALSE(engine.alive());
        EXPECT_EQ(engine.submit(greedy({1, 2}, 2)), nullptr);
        EXPECT_NE(engine.wait_stopped(), "");
      },
      std::chrono::milliseconds(1000));
  EXPECT_EQ(errors[1], "");
}

INSTANTIATE_TEST_SUITE_P(Modes, LlmEngineDpFailure,
                         ::testing::Values(DpCase{2, All2AllBackend::kHighThroughput, false, 1},
                                           DpCase{2, All2AllBackend::kHighThroughput, true, 1},
                                           DpCase{2, All2AllBackend::kLowLatency, true, 4}));

// The scheduler's modes compose with micro-batch overlap (TBO, DBO) and SBO's chunked combine
// with the shared experts beside it: requests spread over two ranks of deepseek_v2 (shared
// experts) get the single-rank Generator's tokens with the overlapped scheduler and multi-step
// on together, and with both off.
struct ComposeCase {
  OverlapMode overlap;
  bool sbo;
  bool overlap_schedule;
  int64_t steps;
};

class LlmEngineDpCompose : public ::testing::TestWithParam<ComposeCase> {};

TEST_P(LlmEngineDpCompose, MicroBatchAndSingleBatchOverlapGetSingleRankTokens) {
  const std::string dir = test::tiny_model_dir("deepseek_v2");
  const ComposeCase cc = GetParam();
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> prompt;
    for (int j = 0; j < 4 + 2 * i; ++j) prompt.push_back(1 + (29 * j + 13 * i) % 400);
    reqs.push_back(greedy(prompt, 5 + i % 3));
  }
  const std::vector<std::vector<int32_t>> want = single_rank_tokens(dir, reqs);
  run_ranks(2, [&](DistContext& ctx) {
    const int r = ctx.rank();
    const ExpertPlacement place = place_experts(8, 2);
    std::unique_ptr<Model> m = Model::load(dir, LoadOptions{place.begin(r), place.end(r)});
    ThreadPool pool(1);
    StepGroup g;
    g.coord = &ctx.coord();
    g.overlap = cc.overlap;
    g.micro_batch.decode_token_threshold = 2;  // every batch that can split does
    g.micro_batch.prefill_token_threshold = 2;
    EpDispatcherOptions opt{cc.sbo ? All2AllBackend::kLowLatency : All2AllBackend::kHighThroughput,
                            64};
    if (cc.sbo) {
      opt.combine_chunks = 2;
      g.shared_experts_at = SharedExpertsAt::kCombine;
    }
    Communicator* comm = &ctx.comm();
    g.dispatchers = [comm, place, opt](int) {
      return std::make_unique<EpDispatcher>(*comm, place, opt);
    };
    LlmEngine engine(*m, pool, nullptr, small_config(cc.overlap_schedule, cc.steps), g);
    if (r != 0) {
      EXPECT_EQ(engine.wait_stopped(), "");
      return;
    }
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const EngineRequest& q : reqs) streams.push_back(engine.submit(q));
    for (size_t i = 0; i < streams.size(); ++i) {
      std::string reason;
      EXPECT_EQ(drain(*streams[i], &reason), want[i]) << "request " << i;
      EXPECT_EQ(reason, "length");
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Modes, LlmEngineDpCompose,
                         ::testing::Values(ComposeCase{OverlapMode::kTbo, false, true, 3},
                                           ComposeCase{OverlapMode::kDbo, false, true, 3},
                                           ComposeCase{OverlapMode::kTbo, true, true, 4},
                                           ComposeCase{OverlapMode::kDbo, true, false, 3},
                                           ComposeCase{OverlapMode::kNone, true, true, 1},
                                           ComposeCase{OverlapMode::kDbo, false, false, 1}));

}  // namespace
}  // namespace duet
