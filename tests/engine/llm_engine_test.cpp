// The serving engine end to end on a tiny model: its greedy tokens equal the Generator's, many
// requests at once (with chunked prefill and preemption by recompute in a tiny KV pool) get
// the same tokens as alone, stop ids end a request, an aborted request frees its blocks,
// impossible requests are refused at submit, and a bf16 KV cache gets twice the blocks of the
// same memory and the bf16 Generator's tokens.
#include "engine/llm_engine.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "core/error.h"
#include "engine/generator.h"
#include "engine/poisoned_model.h"
#include "engine/tiny_models.h"

namespace duet {
namespace {

class LlmEngineTest : public ::testing::Test {
 protected:
  void SetUp() override { model_ = Model::load(test::tiny_model_dir("qwen3_moe")); }

  std::unique_ptr<LlmEngine> engine(double kv_gib, int64_t max_seqs, int64_t budget,
                                    KvCacheDtype kv = KvCacheDtype::kAuto) {
    EngineConfig c;
    c.scheduler = {max_seqs, budget};
    c.block_size = 4;
    c.kv_cache_gib = kv_gib;
    c.kv_cache_dtype = kv;
    return std::make_unique<LlmEngine>(*model_, pool_, nullptr, c);
  }

  static EngineRequest greedy(std::vector<int32_t> prompt, int64_t max_tokens) {
    EngineRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    return r;
  }

  // Drains a stream; returns its tokens and sets *reason.
  static std::vector<int32_t> drain(RequestStream& s, std::string* reason = nullptr) {
    std::vector<int32_t> toks;
    for (int i = 0; i < 10000; ++i) {
      StreamDelta d = s.wait(std::chrono::milliseconds(1000));
      toks.insert(toks.end(), d.tokens.begin(), d.tokens.end());
      if (d.finished) {
        if (reason) *reason = d.finish_reason;
        EXPECT_EQ(d.completion_tokens, static_cast<int64_t>(toks.size()));
        return toks;
      }
    }
    ADD_FAILURE() << "stream never finished";
    return toks;
  }

  // The engine publishes its state after each step: wait (bounded) for it to show no block used.
  static bool blocks_freed(const LlmEngine& e) {
    for (int i = 0; i < 200; ++i) {
      if (e.metrics().snapshot().kv_blocks_used == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }

  std::vector<int32_t> prompt(int n, int salt) const {
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back((37 * i + 11 * salt + 5) % 500);
    return p;
  }

  // KV memory of n blocks of 4 positions for the tiny model.
  double blocks_gib(int64_t n) const {
    const BlockPoolShape s{model_->config().n_layer, model_->kv_k_width(), model_->kv_v_width(), 4};
    return double(n * BlockPool::bytes_per_block(s)) / double(1ull << 30);
  }

  ThreadPool pool_{2};
  std::unique_ptr<Model> model_;
};

TEST_F(LlmEngineTest, GreedyTokensEqualTheGenerators) {
  Generator gen(*model_, pool_);
  GenerateRequest g;
  g.prompt = prompt(9, 1);
  g.max_tokens = 12;
  const std::vector<int32_t> want = gen.generate({g})[0].tokens;
  auto e = engine(0.01, 8, 64);
  std::string reason;
  EXPECT_EQ(drain(*e->submit(greedy(g.prompt, 12)), &reason), want);
  EXPECT_EQ(reason, "length");
}

// --stream-interval 4: a request's tokens reach its stream in batches of at least 4 but for its
// first token (its time to first token) and its end, and they are the tokens it gets streamed
// one by one; in every scheduler mode. (Without the interval a reader that waits for each
// delta sees one token at a time.)
TEST_F(LlmEngineTest, StreamIntervalHandsTokensOverInBatches) {
  std::vector<std::vector<int32_t>> want;
  {
    auto e = engine(0.01, 8, 64);
    for (int i = 0; i < 2; ++i)
      want.push_back(drain(*e->submit(greedy(prompt(6 + i, i), 11 + 2 * i))));
  }
  for (bool overlap : {true, false}) {
    for (int64_t steps : {1, 3}) {
      SCOPED_TRACE(std::string(overlap ? "overlapped" : "plain") + ", " + std::to_string(steps) +
                   " steps");
      EngineConfig c;
      c.scheduler = {8, 64};
      c.block_size = 4;
      c.kv_cache_gib = 0.01;
      c.overlap_schedule = overlap;
      c.num_scheduler_steps = steps;
      c.stream_interval = 4;
      LlmEngine e(*model_, pool_, nullptr, c);
      std::vector<std::shared_ptr<RequestStream>> streams;
      for (int i = 0; i < 2; ++i) streams.push_back(e.submit(greedy(prompt(6 + i, i), 11 + 2 * i)));
      // Each stream read by a thread of its own, as the HTTP threads do: the sizes of the
      // deltas it sees (a slower reader would see several hand-overs merged, never smaller).
      std::vector<std::vector<int32_t>> got(2);
      std::vector<std::vector<size_t>> sizes(2);
      std::vector<std::thread> readers;
      for (size_t i = 0; i < 2; ++i) {
        readers.emplace_back([&, i] {
          for (int k = 0; k < 1000; ++k) {
            const StreamDelta d = streams[i]->wait(std::chrono::milliseconds(1000));
            if (!d.tokens.empty() || d.finished) sizes[i].push_back(d.tokens.size());
            got[i].insert(got[i].end(), d.tokens.begin(), d.tokens.end());
            if (d.finished) break;
          }
        });
      }
      for (std::thread& t : readers) t.join();
      for (size_t i = 0; i < 2; ++i) {
        EXPECT_EQ(got[i], want[i]) << "request " << i;
        for (size_t k = 1; k + 1 < sizes[i].size(); ++k)
          EXPECT_GE(sizes[i][k], 4u) << "delta " << k << " of request " << i;
      }
    }
  }
  EngineConfig bad;
  bad.stream_interval = 0;
  EXPECT_THROW(LlmEngine(*model_, pool_, nullptr, bad), Error);
}

// 12 requests at once through a pool of 24 blocks (96 positions) with a budget of 16 tokens:
// prompts are chunked and sequences are preempted and recomputed, yet every request gets the
// tokens it gets alone.
TEST_F(LlmEngineTest, ConcurrentRequestsWithPreemptionMatchAlone) {
  std::vector<std::vector<int32_t>> alone;
  {
    auto e = engine(0.01, 8, 64);
    for (int i = 0; i < 12; ++i) alone.push_back(drain(*e->submit(greedy(prompt(5 + i, i), 10))));
  }
  auto e = engine(blocks_gib(24), 8, 16);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 12; ++i) streams.push_back(e->submit(greedy(prompt(5 + i, i), 10)));
  for (int i = 0; i < 12; ++i) EXPECT_EQ(drain(*streams[i]), alone[i]) << "request " << i;
  EXPECT_GT(e->metrics().snapshot().preemptions, 0u) << "the pool was meant to be too small";
  EXPECT_TRUE(blocks_freed(*e));
  // Every prompt position is counted once, recomputations after preemption not again.
  uint64_t prompt_total = 0;
  for (int i = 0; i < 12; ++i) prompt_total += 5 + i;
  EXPECT_EQ(e->metrics().snapshot().prompt_tokens, prompt_total);
}

TEST_F(LlmEngineTest, StopTokenIdEndsTheRequest) {
  auto e = engine(0.01, 8, 64);
  const std::vector<int32_t> free_run = drain(*e->submit(greedy(prompt(6, 3), 8)));
  EngineRequest r = greedy(prompt(6, 3), 8);
  r.stop_ids = {free_run[3]};
  std::string reason;
  const std::vector<int32_t> got = drain(*e->submit(r), &reason);
  EXPECT_EQ(reason, "stop");
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got.back(), free_run[3]);
  EXPECT_LE(got.size(), 4u);
}

TEST_F(LlmEngineTest, AbortFreesTheBlocks) {
  auto e = engine(0.01, 8, 64);
  auto s = e->submit(greedy(prompt(8, 1), 1500));
  EXPECT_FALSE(s->wait(std::chrono::milliseconds(1000)).tokens.empty());
  s->abort();
  StreamDelta d;
  for (int i = 0; i < 100 && !d.finished; ++i) d = s->wait(std::chrono::milliseconds(100));
  EXPECT_EQ(d.finish_reason, "abort");
  EXPECT_LT(d.completion_tokens, 1500);
  EXPECT_TRUE(blocks_freed(*e));
}

TEST_F(LlmEngineTest, Bf16KvCacheHoldsTwiceTheBlocksAndMatchesTheGenerator) {
  auto f32 = engine(blocks_gib(8), 8, 64);  // the tiny model is f32: auto is f32
  auto bf16 = engine(blocks_gib(8), 8, 64, KvCacheDtype::kBf16);
  EXPECT_EQ(f32->kv_dtype(), DType::kF32);
  EXPECT_EQ(bf16->kv_dtype(), DType::kBF16);
  EXPECT_EQ(f32->metrics().snapshot().kv_blocks_total, 8);
  EXPECT_EQ(bf16->metrics().snapshot().kv_blocks_total, 16);
  EXPECT_EQ(bf16->max_request_len(), 64);
  Generator gen(*model_, pool_, KvCacheDtype::kBf16);
  GenerateRequest g;
  g.prompt = prompt(9, 2);
  g.max_tokens = 12;
  EXPECT_EQ(drain(*bf16->submit(greedy(g.prompt, 12))), gen.generate({g})[0].tokens);
}

// The engine's threads carry names (perf, top -H and gdb show them): its loop, the overlapped
// scheduler's step thread and the thread that wakes the streams.
TEST_F(LlmEngineTest, ThreadsAreNamed) {
  const auto names = [] {
    std::multiset<std::string> n;
    for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
      std::ifstream comm(task.path() / "comm");
      std::string name;
      std::getline(comm, name);
      n.insert(name);
    }
    return n;
  };
  const std::multiset<std::string> kEngine = {"duet-engine", "duet-step", "duet-waker"};
  const auto engine_threads = [&] {
    std::multiset<std::string> n;
    for (const std::string& name : names())
      if (kEngine.count(name)) n.insert(name);
    return n;
  };
  ASSERT_TRUE(engine_threads().empty());  // the earlier tests' engines have stopped
  EngineConfig c;
  c.overlap_schedule = true;
  c.kv_cache_gib = 1.0 / 1024;
  LlmEngine e(*model_, pool_, nullptr, c);
  // A thread names itself once it runs: wait (bounded) for all three.
  std::multiset<std::string> seen;
  for (int i = 0; i < 2000 && seen != kEngine; ++i) {
    if (i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    seen = engine_threads();
  }
  EXPECT_EQ(seen, kEngine);
}

// Overlapped on one rank the engine thread computes with the step while it waits for it: one of
// the pool's workers is parked for the engine's life (the compute threads never outnumber the
// pool's), the tokens stay the Generator's, and the worker is back once the engine stops.
TEST_F(LlmEngineTest, TheOverlappedEngineThreadTakesAPoolWorkersPlace) {
  EXPECT_EQ(pool_.active_workers(), 1);
  std::vector<int32_t> want;
  {
    Generator gen(*model_, pool_);
    GenerateRequest r;
    r.prompt = {3, 8, 9, 11, 4};
    r.max_tokens = 24;
    want = gen.generate({r})[0].tokens;
  }
  for (bool computes : {true, false}) {
    for (bool overlap : {true, false}) {
      EngineConfig c;
      c.overlap_schedule = overlap;
      c.engine_thread_computes = computes;
      c.kv_cache_gib = 1.0 / 1024;
      c.block_size = 4;
      {
        LlmEngine e(*model_, pool_, nullptr, c);
        EXPECT_EQ(pool_.active_workers(), overlap && computes ? 0 : 1) << overlap << computes;
        EXPECT_EQ(drain(*e.submit(greedy({3, 8, 9, 11, 4}, 24))), want) << overlap << computes;
      }
      EXPECT_EQ(pool_.active_workers(), 1);
    }
  }
}

TEST_F(LlmEngineTest, RefusesRequestsThatCanNeverRun) {
  auto e = engine(blocks_gib(8), 8, 64);  // 32 positions in all
  EXPECT_THROW(e->submit(greedy({}, 4)), Error);
  EXPECT_THROW(e->submit(greedy({1, 2}, 0)), Error);
  EXPECT_THROW(e->submit(greedy({1, 100000}, 4)), Error);
  EXPECT_THROW(e->submit(greedy(prompt(30, 1), 10)), Error);  // 40 positions > the pool
  EXPECT_THROW(e->submit(greedy({1}, model_->config().max_position_embeddings)), Error);
  EngineRequest bad = greedy({1, 2}, 4);
  bad.sampling.top_p = 0;
  EXPECT_THROW(e->submit(bad), Error);
  EXPECT_EQ(drain(*e->submit(greedy(prompt(20, 1), 12))).size(), 12u);  // 32 positions: fits
}

}  // namespace
}  // namespace duet

namespace duet {
namespace {

// Serving: the request whose logits are NaN ends with an error on its stream; the one beside it
// in the same steps completes, and the engine keeps serving.
TEST(LlmEngineNonFiniteTest, NanLogitsEndOnlyThatRequest) {
  std::unique_ptr<Model> model = Model::load(test::poisoned_model_dir(7));
  ThreadPool pool(2);
  EngineConfig c;
  c.scheduler = {8, 64};
  c.block_size = 4;
  c.kv_cache_gib = 1.0 / 1024;
  LlmEngine engine(*model, pool, nullptr, c);
  const auto request = [](std::vector<int32_t> prompt) {
    EngineRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = 5;
    r.ignore_eos = true;
    return r;
  };
  std::shared_ptr<RequestStream> bad = engine.submit(request({3, 7, 9}));
  std::shared_ptr<RequestStream> good = engine.submit(request({3, 8, 9, 11}));
  const auto finish = [](RequestStream& s, std::vector<int32_t>* toks) {
    for (int i = 0; i < 1000; ++i) {
      StreamDelta d = s.wait(std::chrono::milliseconds(100));
      toks->insert(toks->end(), d.tokens.begin(), d.tokens.end());
      if (d.finished) return d;
    }
    ADD_FAILURE() << "stream never finished";
    return StreamDelta{};
  };
  std::vector<int32_t> bad_toks, good_toks;
  const StreamDelta b = finish(*bad, &bad_toks);
  EXPECT_NE(b.error.find("not finite"), std::string::npos) << b.error;
  EXPECT_TRUE(bad_toks.empty());
  const StreamDelta g = finish(*good, &good_toks);
  EXPECT_EQ(g.finish_reason, "length");
  EXPECT_TRUE(g.error.empty()) << g.error;
  EXPECT_EQ(good_toks.size(), 5u);
  EXPECT_TRUE(engine.alive());
  std::vector<int32_t> again;
  EXPECT_EQ(finish(*engine.submit(request({3, 8, 9, 11})), &again).finish_reason, "length");
  EXPECT_EQ(again, good_toks);
}

}  // namespace
}  // namespace duet
