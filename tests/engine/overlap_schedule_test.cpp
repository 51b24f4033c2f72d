// The overlapped scheduler and multi-step decoding against the plain engine (neither): in every
// combination the same greedy tokens and text, seeded sampling reproduced, stop ids, stop strings,
// max_tokens ending a request at exactly the same token with nothing extra reaching the client,
// aborts mid-run, preemption in a tiny KV pool, a request arriving during a multi-step run; and,
// with a step held on the worker, proof that the engine thread processes step N-1's outputs and
// schedules step N+1 while step N runs.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "core/error.h"
#include "engine/llm_engine.h"
#include "engine/tiny_models.h"
#include "text/tokenizer.h"

namespace duet {
namespace {

// 8 sequences, a 64-token budget, blocks of 4 in 0.01 GiB, the overlapped scheduler.
EngineConfig small_overlapped_config() {
  EngineConfig c;
  c.scheduler = {8, 64};
  c.block_size = 4;
  c.kv_cache_gib = 0.01;
  c.overlap_schedule = true;
  return c;
}

struct SchedMode {
  bool overlap;
  int64_t steps;  // --num-scheduler-steps
  std::string name() const {
    return std::string(overlap ? "overlap" : "plain") + "_steps" + std::to_string(steps);
  }
};

struct Output {
  std::vector<int32_t> tokens;
  std::string text;
  std::string reason;
};

// Reads a stream to its end; `already` tokens were taken from it before.
Output drain(RequestStream& s, size_t already = 0) {
  Output o;
  for (int i = 0; i < 10000; ++i) {
    StreamDelta d = s.wait(std::chrono::milliseconds(1000));
    o.tokens.insert(o.tokens.end(), d.tokens.begin(), d.tokens.end());
    o.text += d.text;
    if (d.finished) {
      o.reason = d.finish_reason;
      EXPECT_EQ(d.completion_tokens, static_cast<int64_t>(already + o.tokens.size()));
      return o;
    }
  }
  ADD_FAILURE() << "stream never finished";
  return o;
}

EngineRequest request(std::vector<int32_t> prompt, int64_t max_tokens) {
  EngineRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

std::vector<int32_t> prompt(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((37 * i + 11 * salt + 5) % 500);
  return p;
}

class OverlapScheduleTest : public ::testing::TestWithParam<SchedMode> {
 protected:
  void SetUp() override {
    dir_ = test::tiny_model_dir("qwen3_moe");
    model_ = Model::load(dir_);
    tokenizer_ = Tokenizer::load(dir_);
  }

  std::unique_ptr<LlmEngine> engine(const SchedMode& m, double kv_gib = 0.01,
                                    int64_t budget = 64) {
    EngineConfig c;
    c.scheduler = {8, budget};
    c.block_size = 4;
    c.kv_cache_gib = kv_gib;
    c.overlap_schedule = m.overlap;
    c.num_scheduler_steps = m.steps;
    return std::make_unique<LlmEngine>(*model_, pool_, tokenizer_.get(), c);
  }

  // The request run alone through the plain engine.
  Output neither(const EngineRequest& r) {
    auto e = engine(SchedMode{false, 1});
    return drain(*e->submit(r));
  }

  double blocks_gib(int64_t n) const {
    const BlockPoolShape s{model_->config().n_layer, model_->kv_k_width(), model_->kv_v_width(), 4};
    return double(n * BlockPool::bytes_per_block(s)) / double(1ull << 30);
  }

  static bool blocks_freed(const LlmEngine& e) {
    for (int i = 0; i < 400; ++i) {
      if (e.metrics().snapshot().kv_blocks_used == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }

  std::string dir_;
  ThreadPool pool_{2};
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

// 12 requests through 24 blocks with a 16-token budget: chunked prefill, preemption by
// recompute (of sequences with placeholders in flight) and, with multi-step, lookahead rows;
// every request gets its plain tokens and text, and the metrics count no discarded token.
TEST_P(OverlapScheduleTest, ConcurrentRequestsWithPreemptionGetThePlainTokens) {
  std::vector<Output> want;
  for (int i = 0; i < 12; ++i) want.push_back(neither(request(prompt(5 + i, i), 10 + i % 3)));
  auto e = engine(GetParam(), blocks_gib(24), 16);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 12; ++i) streams.push_back(e->submit(request(prompt(5 + i, i), 10 + i % 3)));
  uint64_t total = 0;
  for (int i = 0; i < 12; ++i) {
    const Output got = drain(*streams[i]);
    EXPECT_EQ(got.tokens, want[i].tokens) << "request " << i;
    EXPECT_EQ(got.text, want[i].text) << "request " << i;
    EXPECT_EQ(got.reason, "length");
    total += got.tokens.size();
  }
  EXPECT_GT(e->metrics().snapshot().preemptions, 0u) << "the pool was meant to be too small";
  EXPECT_TRUE(blocks_freed(*e));
  EngineMetricsSnapshot m;
  for (int i = 0; i < 400 && (m = e->metrics().snapshot()).generation_tokens != total; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(m.generation_tokens, total) << "a discarded token was counted";
}

// Each way a request ends does so at the plain engine's token: nothing computed past it reaches
// the client.
TEST_P(OverlapScheduleTest, StopsEndAtThePlainEnginesToken) {
  const Output free_run = neither(request(prompt(7, 2), 12));
  ASSERT_EQ(free_run.tokens.size(), 12u);
  std::vector<EngineRequest> reqs;
  for (int64_t n = 1; n <= 6; ++n) reqs.push_back(request(prompt(7, 2), n));  // max_tokens
  EngineRequest by_id = request(prompt(7, 2), 12);
  by_id.stop_ids = {free_run.tokens[4]};
  reqs.push_back(by_id);
  // A stop string: a piece of the text the sixth token completes.
  const std::string upto6 = tokenizer_->decode(
      std::vector<int32_t>(free_run.tokens.begin(), free_run.tokens.begin() + 6), true);
  const std::string upto5 = tokenizer_->decode(
      std::vector<int32_t>(free_run.tokens.begin(), free_run.tokens.begin() + 5), true);
  if (upto6.size() > upto5.size()) {
    EngineRequest by_text = request(prompt(7, 2), 12);
    by_text.stop = {upto6.substr(upto5.size())};
    reqs.push_back(by_text);
  }
  // (The plain engine runs first: two engines may not share the compute pool at once.)
  std::vector<Output> wants;
  for (const EngineRequest& r : reqs) wants.push_back(neither(r));
  auto e = engine(GetParam());
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Output& want = wants[i];
    const Output got = drain(*e->submit(reqs[i]));
    EXPECT_EQ(got.tokens, want.tokens) << "request " << i;
    EXPECT_EQ(got.text, want.text) << "request " << i;
    EXPECT_EQ(got.reason, want.reason) << "request " << i;
    if (i < 6) {
      EXPECT_EQ(got.tokens.size(), i + 1);
    } else {
      EXPECT_EQ(want.reason, "stop") << "request " << i << " was meant to stop";
    }
  }
  // All at once too: each ends where it ends alone.
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const EngineRequest& r : reqs) streams.push_back(e->submit(r));
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Output got = drain(*streams[i]);
    EXPECT_EQ(got.tokens, wants[i].tokens) << "request " << i << " " << got.reason;
  }
}

TEST_P(OverlapScheduleTest, SeededSamplingReproduces) {
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    EngineRequest r = request(prompt(6 + i, 7 + i), 9);
    r.sampling.temperature = 0.9f;
    r.sampling.top_k = 40;
    r.sampling.seed = 100 + i;
    reqs.push_back(r);
  }
  std::vector<Output> wants;
  for (const EngineRequest& r : reqs) wants.push_back(neither(r));
  auto e = engine(GetParam());
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const EngineRequest& r : reqs) streams.push_back(e->submit(r));
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(drain(*streams[i]).tokens, wants[i].tokens) << "request " << i;
}

// A client leaves mid-run (mid multi-step run): its request ends with "abort", its blocks come
// back, and the others get their plain tokens; a request that arrives while a multi-step run is
// under way joins at the next scheduler call.
TEST_P(OverlapScheduleTest, AbortAndArrivalMidRun) {
  const EngineRequest long_req = request(prompt(5, 1), 1500);
  const EngineRequest other = request(prompt(8, 3), 20);
  const EngineRequest late = request(prompt(6, 9), 15);
  const Output other_alone = neither(other), late_alone = neither(late);
  auto e = engine(GetParam());
  auto s_long = e->submit(long_req);
  auto s_other = e->submit(other);
  size_t seen = 0;
  for (int i = 0; i < 1000 && seen < 3; ++i) seen += s_long->wait(std::chrono::milliseconds(50)).tokens.size();
  ASSERT_GE(seen, 3u);
  auto s_late = e->submit(late);
  s_long->abort();
  Output rest = drain(*s_long, seen);
  EXPECT_EQ(rest.reason, "abort");
  EXPECT_LT(seen + rest.tokens.size(), 1500u);
  EXPECT_EQ(drain(*s_other).tokens, other_alone.tokens);
  EXPECT_EQ(drain(*s_late).tokens, late_alone.tokens);
  EXPECT_TRUE(blocks_freed(*e));
}

INSTANTIATE_TEST_SUITE_P(Modes, OverlapScheduleTest,
                         ::testing::Values(SchedMode{true, 1}, SchedMode{false, 4},
                                           SchedMode{true, 4}, SchedMode{true, 3}),
                         [](const auto& info) { return info.param.name(); });

// The engine stepped with its worker held before each step (a stand-in for a long forward
// pass): while step N is held, the engine thread has already processed step N-1's output (the
// client has its token) and launched step N+1 (scheduled it). Without the overlapped scheduler
// the engine thread waits for each step instead, and this fails.
TEST(OverlapScheduleEvidence, StepNMinusOneProcessedAndStepNPlusOneScheduledWhileStepNRuns) {
  const std::string dir = test::tiny_model_dir("qwen3_moe");
  std::unique_ptr<Model> model = Model::load(dir);
  ThreadPool pool(2);
  std::mutex mu;
  std::condition_variable cv;
  std::shared_ptr<RequestStream> stream;
  size_t received = 0;  // GUARDED_BY(mu): tokens the client has taken
  std::vector<std::string> failures;
  EngineConfig c = small_overlapped_config();
  // Job 1 is the prefill (token 1), job k decodes token k. Before running job k >= 3, wait
  // (bounded) until the client holds token k-1 and job k+1 has been launched.
  c.before_step = [&](uint64_t job, const StepWorker& worker) {
    if (job < 3 || job > 6) return;
    std::unique_lock<std::mutex> lock(mu);
    const bool processed =
        cv.wait_for(lock, std::chrono::seconds(5), [&] { return received >= job - 1; });
    if (!processed) {
      failures.push_back("job " + std::to_string(job) + ": token " + std::to_string(job - 1) +
                         " not processed while it waited");
    }
    const bool scheduled = cv.wait_for(lock, std::chrono::seconds(5),
                                       [&] { return worker.launched() >= job + 1; });
    if (!scheduled)
      failures.push_back("job " + std::to_string(job + 1) + " not launched while job " +
                         std::to_string(job) + " waited");
  };
  LlmEngine engine(*model, pool, nullptr, c);
  EngineRequest r = request(prompt(6, 4), 8);
  stream = engine.submit(r);
  bool finished = false;
  for (int i = 0; i < 2000 && !finished; ++i) {
    StreamDelta d = stream->wait(std::chrono::milliseconds(20));
    {
      std::lock_guard<std::mutex> lock(mu);
      received += d.tokens.size();
    }
    cv.notify_all();
    finished = d.finished;
  }
  EXPECT_TRUE(finished);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_TRUE(failures.empty()) << failures.front();
}

// The clients get their tokens off the launch's critical path: when the engine thread launches
// step k, token k-3 has reached the client and token k-2 (processed meanwhile) has not: it is
// handed over right after the launch, so the worker has its next step queued before the engine
// thread spends time on the HTTP threads. Before, token k-2 was in the client's stream by then.
TEST(OverlapScheduleEvidence, TokenKMinus2ReachesTheClientAfterStepKIsLaunched) {
  const std::string dir = test::tiny_model_dir("qwen3_moe");
  std::unique_ptr<Model> model = Model::load(dir);
  ThreadPool pool(2);
  std::mutex mu;
  std::shared_ptr<RequestStream> stream;  // GUARDED_BY(mu)
  int64_t received = 0;                   // engine thread only (the hook is the only reader)
  uint64_t checked = 0;
  std::vector<std::string> failures;
  EngineConfig c = small_overlapped_config();
  // The first job waits for the test to hold the stream, so that every later launch is checked.
  std::condition_variable cv;
  c.before_step = [&](uint64_t job, const StepWorker&) {
    if (job != 1) return;
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return stream != nullptr; });
  };
  // Job 1 is the prefill (token 1), job k computes token k.
  c.after_launch = [&](uint64_t job) {
    std::shared_ptr<RequestStream> s;
    {
      std::lock_guard<std::mutex> lock(mu);
      s = stream;
    }
    if (!s) return;  // submit() has not returned yet: job 1 or 2, nothing to check
    received += static_cast<int64_t>(s->wait(std::chrono::milliseconds(0)).tokens.size());
    if (job < 3) return;
    ++checked;
    if (received != static_cast<int64_t>(job) - 3) {
      failures.push_back("step " + std::to_string(job) + " launched with " +
                         std::to_string(received) + " tokens at the client");
    }
  };
  const int64_t max_tokens = 16;
  {
    LlmEngine engine(*model, pool, nullptr, c);
    std::shared_ptr<RequestStream> s = engine.submit(request(prompt(6, 4), max_tokens));
    {
      std::lock_guard<std::mutex> lock(mu);
      stream = s;
    }
    cv.notify_all();
    // The hook reads the stream; wait for the end through the metrics.
    for (int i = 0; i < 2000 && engine.metrics().snapshot().finished["length"] == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(checked, static_cast<uint64_t>(max_tokens) - 2);  // jobs 3 .. max_tokens
  EXPECT_TRUE(failures.empty()) << failures.size() << " early, first: " << failures.front();
}

}  // namespace
}  // namespace duet
