// `duet bench serve`: an HTTP load generator for an OpenAI-compatible server, like
// `vllm bench serve` with its random dataset. Each request is a prompt of random token ids sent
// to /v1/completions with streaming on; requests start on a Poisson schedule (or all at once)
// and at most --max-concurrency are in flight. Reports requests/s, output tok/s, TTFT and TPOT.
#include <httplib.h>

#include <cstdlib>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/openai_client.h"
#include "core/error.h"

namespace duet {

namespace {

using nlohmann::json;
using BenchClock = std::chrono::steady_clock;

struct BenchServeOptions {
  std::string base_url = "http://127.0.0.1:8000";
  std::string model;  // empty: the first of /v1/models
  int64_t num_prompts = 100;
  double request_rate = 0;  // requests/s; 0 (or "inf"): all at once
  int64_t input_len = 128;
  int64_t output_len = 64;
  int64_t max_concurrency = 0;  // 0: num_prompts
  int32_t token_range = 256;    // prompt ids are drawn from [0, token_range)
  uint64_t seed = 0;
  bool compare_single = false;
  int64_t single_prompts = 4;
  // Servers to alternate with base_url (each started in another mode), --rounds times.
  std::vector<std::string> compare_urls;
  int rounds = 3;
  SamplingParams sampling;  // of every request: --temperature, --top-p, --top-k
};

struct Outcome {
  bool ok = false;
  std::string error;
  double ttft = 0;     // seconds to the first token chunk
  double latency = 0;  // seconds to the end of the stream
  int64_t output_tokens = 0;
};

struct RunResult {
  std::vector<Outcome> outcomes;
  double seconds = 0;
};

double since(BenchClock::time_point t0) {
  return std::chrono::duration<double>(BenchClock::now() - t0).count();
}

// Sends one streamed completion and times it.
Outcome send_one(httplib::Client& cli, const json& body) {
  Outcome o;
  SseSplitter sse;
  bool first = true;
  const auto t0 = BenchClock::now();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.set_header("Content-Type", "application/json");
  req.body = body.dump();
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    sse.feed(data, n, [&](const std::string& payload) {
      if (payload == "[DONE]") return;
      const json j = json::parse(payload, nullptr, false);
      if (j.is_discarded()) return;
      if (j.contains("error")) o.error = j["error"].value("message", "error");
      if (j.contains("choices") && !j["choices"].empty() && first) {
        o.ttft = since(t0);
        first = false;
      }
      if (j.contains("usage") && j["usage"].is_object())
        o.output_tokens = j["usage"].value("completion_tokens", int64_t{0});
    });
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  if (!cli.send(req, res, err)) {
    o.error = "connection failed: " + httplib::to_string(err);
  } else if (res.status != 200) {
    o.error = "HTTP " + std::to_string(res.status) + ": " + sse.rest() + res.body;
  }
  o.latency = since(t0);
  o.ok = o.error.empty() && !first;
  if (o.ok && o.output_tokens == 0) o.error = "no usage in the stream", o.ok = false;
  return o;
}

RunResult run(const BenchServeOptions& o, const std::string& model, int64_t n, int64_t concurrency) {
  std::mt19937_64 rng(o.seed);
  std::vector<json> bodies;
  std::vector<double> start_at;  // seconds after the run starts
  double t = 0;
  std::exponential_distribution<double> gap(o.request_rate > 0 ? o.request_rate : 1.0);
  std::uniform_int_distribution<int32_t> tok(0, o.token_range - 1);
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int32_t> prompt(static_cast<size_t>(o.input_len));
    for (int32_t& id : prompt) id = tok(rng);
    json body = {{"model", model},
                 {"prompt", prompt},
                 {"max_tokens", o.output_len},
                 {"temperature", o.sampling.temperature},
                 {"ignore_eos", true},
                 {"stream", true},
                 {"stream_options", {{"include_usage", true}}}};
    if (o.sampling.temperature > 0) body["seed"] = o.seed * 1000003 + uint64_t(i);
    if (o.sampling.top_p < 1.0f) body["top_p"] = o.sampling.top_p;
    if (o.sampling.top_k > 0) body["top_k"] = o.sampling.top_k;  // vLLM's extension, as duet's
    bodies.push_back(std::move(body));
    start_at.push_back(t);
    if (o.request_rate > 0) t += gap(rng);
  }
  RunResult r;
  r.outcomes.resize(static_cast<size_t>(n));
  std::atomic<int64_t> next{0};
  const auto t0 = BenchClock::now();
  auto worker = [&] {
    httplib::Client cli(o.base_url);
    cli.set_read_timeout(600);
    for (int64_t i; (i = next.fetch_add(1)) < n;) {
      std::this_thread::sleep_until(t0 + std::chrono::duration_cast<BenchClock::duration>(
                                              std::chrono::duration<double>(start_at[i])));
      r.outcomes[i] = send_one(cli, bodies[i]);
    }
  };
  std::vector<std::thread> threads;
  for (int64_t w = 0; w < std::min(n, concurrency); ++w) threads.emplace_back(worker);
  for (auto& th : threads) th.join();
  r.seconds = since(t0);
  return r;
}

struct Stats {
  double mean = 0, p50 = 0, p99 = 0;
};

Stats stats(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  for (double x : v) s.mean += x;
  s.mean /= double(v.size());
  auto pct = [&](double p) {  // linear interpolation, as numpy.percentile
    const double pos = p / 100.0 * double(v.size() - 1);
    const size_t lo = static_cast<size_t>(pos);
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (pos - double(lo));
  };
  s.p50 = pct(50);
  s.p99 = pct(99);
  return s;
}

// Prints the report of one run; returns its output tok/s.
double report(const char* title, const RunResult& r, int64_t concurrency) {
  int64_t ok = 0, out_tokens = 0;
  std::vector<double> ttft, tpot;
  std::string first_error;
  for (const Outcome& o : r.outcomes) {
    if (!o.ok) {
      if (first_error.empty()) first_error = o.error;
      continue;
    }
    ++ok;
    out_tokens += o.output_tokens;
    ttft.push_back(o.ttft * 1e3);
    if (o.output_tokens > 1) tpot.push_back((o.latency - o.ttft) * 1e3 / double(o.output_tokens - 1));
  }
  const Stats t = stats(ttft), p = stats(tpot);
  const double tok_s = double(out_tokens) / r.seconds;
  std::printf("== %s (max concurrency %lld) ==\n", title, static_cast<long long>(concurrency));
  std::printf("successful requests:      %lld of %zu\n", static_cast<long long>(ok), r.outcomes.size());
  if (!first_error.empty()) std::printf("first error:              %s\n", first_error.c_str());
  std::printf("duration (s):             %.2f\n", r.seconds);
  std::printf("request throughput:       %.2f req/s\n", double(ok) / r.seconds);
  std::printf("output token throughput:  %.1f tok/s\n", tok_s);
  std::printf("TTFT (ms):                mean %.1f  p50 %.1f  p99 %.1f\n", t.mean, t.p50, t.p99);
  std::printf("TPOT (ms):                mean %.1f  p50 %.1f  p99 %.1f\n", p.mean, p.p50, p.p99);
  std::fflush(stdout);
  if (ok < static_cast<int64_t>(r.outcomes.size()))
    DUET_ERROR(r.outcomes.size() - ok << " requests failed; first: " << first_error);
  return tok_s;
}

std::string pick_model(const BenchServeOptions& o) {
  return o.model.empty() ? first_served_model(o.base_url) : o.model;
}

// The server's step-gap counters (duet:step_gap_seconds_total and friends in /metrics), or all
// zero if it does not report them (another server).
struct StepGapCounters {
  double gap_s = 0, gaps = 0, forward_s = 0, steps = 0;
};

StepGapCounters scrape_step_gap(const BenchServeOptions& o) {
  StepGapCounters c;
  for (const MetricSample& m : scrape_metrics(o.base_url)) {
    if (m.name == "duet:step_gap_seconds_total") c.gap_s = m.value;
    if (m.name == "duet:step_gaps_total") c.gaps = m.value;
    if (m.name == "duet:forward_seconds_total") c.forward_s = m.value;
    if (m.name == "duet:forward_steps_total") c.steps = m.value;
  }
  return c;
}

// The mean step gap and forward pass (ms) over a run, from the counters before and after it
// (rank 0's, on several ranks); 0 where the run had none.
struct StepGap {
  double gap_ms = 0, forward_ms = 0;
  double share() const {  // % of a step
    return gap_ms + forward_ms > 0 ? 100.0 * gap_ms / (gap_ms + forward_ms) : 0.0;
  }
};

StepGap step_gap(const StepGapCounters& a, const StepGapCounters& b) {
  const double gaps = b.gaps - a.gaps, steps = b.steps - a.steps;
  StepGap g;
  if (gaps > 0) g.gap_ms = (b.gap_s - a.gap_s) / gaps * 1e3;
  if (steps > 0) g.forward_ms = (b.forward_s - a.forward_s) / steps * 1e3;
  return g;
}

// The step gap over a run, from the counters before and after it (rank 0's, on several ranks).
void report_step_gap(const StepGapCounters& a, const StepGapCounters& b) {
  const StepGap g = step_gap(a, b);
  if (g.gap_ms <= 0 || g.forward_ms <= 0) return;
  std::printf("server step gap:          %.3f ms between forward passes (%.1f%% of a step; "
              "forward %.2f ms)\n",
              g.gap_ms, g.share(), g.forward_ms);
}

// One load run against each of base_url and compare_urls in turn, `rounds` times: per server the
// median output tok/s, TTFT and step gap, and the tok/s ratio to the first server.
void run_compare(const BenchServeOptions& o, const std::string& model, int64_t conc) {
  std::vector<std::string> urls = {o.base_url};
  urls.insert(urls.end(), o.compare_urls.begin(), o.compare_urls.end());
  struct Row {
    std::vector<double> tok_s, ttft_p50, gap_ms, gap_share;
  };
  std::vector<Row> rows(urls.size());
  for (int round = 0; round < o.rounds; ++round) {
    for (size_t u = 0; u < urls.size(); ++u) {
      BenchServeOptions one = o;
      one.base_url = urls[u];
      const StepGapCounters g0 = scrape_step_gap(one);
      const RunResult r = run(one, model, o.num_prompts, conc);
      const StepGapCounters g1 = scrape_step_gap(one);
      int64_t out_tokens = 0;
      std::vector<double> ttft;
      for (const Outcome& oc : r.outcomes) {
        if (!oc.ok) DUET_ERROR(urls[u] << ": a request failed: " << oc.error);
        out_tokens += oc.output_tokens;
        ttft.push_back(oc.ttft * 1e3);
      }
      const StepGap g = step_gap(g0, g1);
      rows[u].tok_s.push_back(double(out_tokens) / r.seconds);
      rows[u].ttft_p50.push_back(stats(ttft).p50);
      rows[u].gap_ms.push_back(g.gap_ms);
      rows[u].gap_share.push_back(g.share());
      std::printf("round %d  %-32s %9.1f tok/s  TTFT p50 %7.1f ms  step gap %.3f ms\n", round + 1,
                  urls[u].c_str(), rows[u].tok_s.back(), rows[u].ttft_p50.back(), g.gap_ms);
      std::fflush(stdout);
    }
  }
  std::printf("%-32s %12s %9s %14s %12s %9s\n", "server (medians)", "output tok/s", "vs first",
              "TTFT p50 ms", "step gap ms", "gap/step");
  const double first = median(rows[0].tok_s);
  for (size_t u = 0; u < urls.size(); ++u) {
    const double t = median(rows[u].tok_s);
    std::printf("%-32s %12.1f %9.2f %14.1f %12.3f %8.1f%%\n", urls[u].c_str(), t,
                first > 0 ? t / first : 0.0, median(rows[u].ttft_p50), median(rows[u].gap_ms),
                median(rows[u].gap_share));
  }
}

void run_bench_serve(const BenchServeOptions& o) {
  if (o.num_prompts < 1 || o.input_len < 1 || o.output_len < 1 || o.token_range < 1)
    DUET_ERROR("--num-prompts, --input-len, --output-len and --token-range must be >= 1");
  const std::string model = pick_model(o);
  const int64_t conc = o.max_concurrency > 0 ? std::min(o.max_concurrency, o.num_prompts)
                                             : std::min<int64_t>(o.num_prompts, 1024);
  std::printf("model %s, %lld prompts of %lld tokens -> %lld tokens, request rate %s\n",
              model.c_str(), static_cast<long long>(o.num_prompts),
              static_cast<long long>(o.input_len), static_cast<long long>(o.output_len),
              o.request_rate > 0 ? std::to_string(o.request_rate).c_str() : "inf");
  if (!o.compare_urls.empty()) {
    run_compare(o, model, conc);
    return;
  }
  double single = 0;
  if (o.compare_single) {
    BenchServeOptions s = o;
    s.request_rate = 0;
    const StepGapCounters g0 = scrape_step_gap(o);
    single = report("single request", run(s, model, o.single_prompts, 1), 1);
    report_step_gap(g0, scrape_step_gap(o));
  }
  const StepGapCounters g0 = scrape_step_gap(o);
  const double many = report("load", run(o, model, o.num_prompts, conc), conc);
  report_step_gap(g0, scrape_step_gap(o));
  if (o.compare_single)
    std::printf("output tok/s at concurrency %lld vs a single request: %.2fx\n",
                static_cast<long long>(conc), many / single);
}

}  // namespace

void add_bench_serve(CLI::App& bench) {
  auto o = std::make_shared<BenchServeOptions>();
  auto rate = std::make_shared<std::string>("inf");
  CLI::App* cmd = bench.add_subcommand("serve", "Load-test an OpenAI-compatible server");
  cmd->add_option("--base-url", o->base_url, "Server URL (default http://127.0.0.1:8000)");
  cmd->add_option("--model", o->model, "Model name (default: the first of /v1/models)");
  cmd->add_option("--num-prompts", o->num_prompts, "Requests to send (default 100)");
  cmd->add_option("--request-rate", *rate, "Requests per second, Poisson arrivals, or inf");
  cmd->add_option("--input-len", o->input_len, "Prompt tokens (default 128)");
  cmd->add_option("--output-len", o->output_len, "Tokens to generate per request (default 64)");
  cmd->add_option("--max-concurrency", o->max_concurrency, "Requests in flight at most");
  cmd->add_option("--token-range", o->token_range, "Prompt ids are drawn from [0, N) (default 256)");
  cmd->add_option("--seed", o->seed, "Seed of the prompts and arrival times");
  add_bench_sampling_options(cmd, o->sampling);
  cmd->add_flag("--compare-single", o->compare_single,
                "First run --single-prompts requests one at a time; print the throughput ratio");
  cmd->add_option("--single-prompts", o->single_prompts, "Requests of the single run (default 4)");
  cmd->add_option("--compare-url", o->compare_urls,
                  "Another server (e.g. the same model in another mode) to alternate with "
                  "--base-url, run after run; repeatable");
  cmd->add_option("--rounds", o->rounds, "Rounds over the servers with --compare-url (default 3)")
      ->check(CLI::PositiveNumber);
  cmd->callback([o, rate] {
    if (*rate == "inf") {
      o->request_rate = 0;
    } else {
      try {
        o->request_rate = std::stod(*rate);
      } catch (const std::exception&) {
        DUET_ERROR("--request-rate: '" << *rate << "' is not a number or inf");
      }
      if (!(o->request_rate > 0)) DUET_ERROR("--request-rate must be > 0 or inf");
    }
    run_bench_serve(*o);
  });
}

}  // namespace duet
