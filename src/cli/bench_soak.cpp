// `duet bench soak`: holds many concurrent streaming clients against an OpenAI-compatible server
// for a while and checks that nothing is lost or mixed. Each client loops: a new connection per
// request, a prompt from a fixed pool and a random output length, greedy; some clients hang up
// mid-stream, some read slowly. Every request that runs to its end must stream exactly the text
// its prompt and length give when sent alone (measured first, one request at a time) and end
// with a finish reason; every other outcome is an error the client can act on, counted by kind.
// duet's products are not batch-invariant (a row sums in another order in a larger batch), so a
// greedy request under load may take another token at a near-tie: such a request, its own text
// up to a point and then another, is counted apart ("diverged", with where), while a text closer
// to another prompt's than to its own is "mixed" and fails the soak.
// Every --report-every seconds it prints the server's resident memory and open descriptors
// (with --server-pid, same host), and at the end it compares its counts with /metrics.
#include <dirent.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/openai_client.h"
#include "core/error.h"

namespace duet {

namespace {

using nlohmann::json;
using SoakClock = std::chrono::steady_clock;

struct SoakOptions {
  std::string base_url = "http://127.0.0.1:8000";
  std::string model;  // empty: the first of /v1/models
  std::string api_key;
  int clients = 256;
  double duration_s = 600;
  int n_prompts = 32;                     // distinct prompts, random lengths in [min, max]
  int64_t min_input = 4, max_input = 96;  // prompt tokens
  std::vector<int64_t> output_lens = {8, 32, 128};
  double disconnect_share = 0.1;  // requests whose client hangs up mid-stream
  double slow_share = 0.1;        // requests whose client reads slowly
  int slow_ms = 20;               // a slow reader's pause after each chunk
  int32_t token_range = 256;
  uint64_t seed = 0;
  int server_pid = 0;  // 0: no memory / descriptor report
  double report_every_s = 30;
  bool exact = false;  // --exact: a diverged request fails the soak (a --batch-invariant server)
};

// What one streamed request gave.
struct Streamed {
  std::string text;
  std::string finish;    // the last finish_reason seen
  std::string error;     // an error event's message, or the HTTP / connection failure
  bool done = false;     // saw data: [DONE]
  bool hung_up = false;  // this client left on purpose
};

std::string bearer(const SoakOptions& o) {
  return o.api_key.empty() ? "" : "Bearer " + o.api_key;
}

// Sends one streamed completion on a new connection. Leaves after `leave_after` chunks (0:
// never); sleeps `pause_ms` after each chunk.
Streamed stream_one(const SoakOptions& o, const json& body, int leave_after, int pause_ms) {
  Streamed s;
  httplib::Client cli(o.base_url);
  cli.set_keep_alive(false);
  cli.set_read_timeout(120);
  SseSplitter sse;
  int chunks = 0;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.set_header("Content-Type", "application/json");
  if (!o.api_key.empty()) req.set_header("Authorization", bearer(o));
  req.body = body.dump();
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    sse.feed(data, n, [&](const std::string& payload) {
      if (payload == "[DONE]") {
        s.done = true;
        return;
      }
      const json j = json::parse(payload, nullptr, false);
      if (j.is_discarded()) {
        s.error = "unparsable event: " + payload.substr(0, 80);
        return;
      }
      if (j.contains("error")) s.error = j["error"].value("message", "error event");
      if (!j.contains("choices")) return;
      for (const json& c : j["choices"]) {
        s.text += c.value("text", "");
        if (c.contains("finish_reason") && c["finish_reason"].is_string())
          s.finish = c["finish_reason"].get<std::string>();
      }
      ++chunks;
    });
    if (pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    if (leave_after > 0 && chunks >= leave_after && !s.done) {
      s.hung_up = true;
      return false;
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  if (!cli.send(req, res, err)) {
    if (!s.hung_up) s.error = "connection failed: " + httplib::to_string(err);
  } else if (res.status != 200) {
    s.error = "HTTP " + std::to_string(res.status) + ": " + sse.rest() + res.body;
  }
  return s;
}

json request_body(const std::string& model, const std::vector<int32_t>& prompt, int64_t n) {
  return {{"model", model},   {"prompt", prompt},   {"max_tokens", n},
          {"temperature", 0}, {"ignore_eos", true}, {"stream", true}};
}

// The server's resident memory (MiB) and open descriptors, or -1 each.
std::pair<double, int> server_usage(int pid) {
  if (pid <= 0) return {-1, -1};
  double rss = -1;
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) rss = std::stod(line.substr(6)) / 1024.0;
  }
  int fds = -1;
  if (DIR* d = ::opendir(("/proc/" + std::to_string(pid) + "/fd").c_str())) {
    fds = 0;
    while (const dirent* e = ::readdir(d)) fds += e->d_name[0] != '.';
    ::closedir(d);
  }
  return {rss, fds};
}

// duet:request_success_total by finish reason, from /metrics (empty if absent).
std::map<std::string, double> finished_counts(const SoakOptions& o) {
  std::map<std::string, double> out;
  const std::string label = "finished_reason=\"";
  for (const MetricSample& m : scrape_metrics(o.base_url)) {
    const size_t at = m.labels.find(label);
    if (m.name != "duet:request_success_total" || at == std::string::npos) continue;
    const size_t from = at + label.size();
    out[m.labels.substr(from, m.labels.find('"', from) - from)] = m.value;
  }
  return out;
}

std::string pick_model(const SoakOptions& o) {
  return o.model.empty() ? first_served_model(o.base_url, o.api_key) : o.model;
}

size_t common_prefix(const std::string& a, const std::string& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

struct Counts {
  int64_t sent = 0, completed = 0, hung_up = 0, slow = 0, mixed = 0, errors = 0;
  int64_t diverged = 0, diverged_hung_up = 0;  // requests that ran to the end / were left
  // Requests that gave their own text up to a byte and then another: (prompt, byte) -> count.
  std::map<std::pair<size_t, size_t>, int64_t> divergences;
  std::map<std::string, int64_t> error_kinds;  // first 60 bytes of each error message
  std::string first_mixed;
};

void run_soak(const SoakOptions& o) {
  if (o.clients < 1 || o.duration_s <= 0 || o.n_prompts < 1 || o.min_input < 1 ||
      o.max_input < o.min_input || o.output_lens.empty() || o.token_range < 1)
    DUET_ERROR(
        "bench soak: --clients, --duration, --prompts, --input-len range and --output-lens "
        "must be positive");
  const std::string model = pick_model(o);
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int64_t> len(o.min_input, o.max_input);
  std::uniform_int_distribution<int32_t> tok(0, o.token_range - 1);
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(o.n_prompts));
  for (auto& p : prompts) {
    p.resize(static_cast<size_t>(len(rng)));
    for (int32_t& id : p) id = tok(rng);
  }
  // What each (prompt, output length) streams alone.
  std::vector<std::vector<std::string>> want(prompts.size());
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (int64_t n : o.output_lens) {
      const Streamed s = stream_one(o, request_body(model, prompts[p], n), 0, 0);
      if (!s.error.empty() || s.finish != "length" || !s.done)
        DUET_ERROR("bench soak: the reference request for prompt " << p << " failed: " << s.error);
      want[p].push_back(s.text);
    }
  }
  std::printf("bench soak: %s, %d clients for %.0f s, %d prompts of %lld-%lld tokens, outputs of",
              model.c_str(), o.clients, o.duration_s, o.n_prompts,
              static_cast<long long>(o.min_input), static_cast<long long>(o.max_input));
  for (int64_t n : o.output_lens) std::printf(" %lld", static_cast<long long>(n));
  std::printf(" tokens; %.0f%% hang up mid-stream, %.0f%% read slowly (%d ms per chunk)\n",
              100 * o.disconnect_share, 100 * o.slow_share, o.slow_ms);
  const std::map<std::string, double> before = finished_counts(o);

  std::mutex mu;
  Counts total;  // GUARDED_BY(mu)
  const SoakClock::time_point t0 = SoakClock::now();
  const SoakClock::time_point end = t0 + std::chrono::duration_cast<SoakClock::duration>(
                                             std::chrono::duration<double>(o.duration_s));
  // A text that is not its request's own: "diverged" if it is its own up to a point and closer
  // to it than to any other prompt's, else "mixed". REQUIRES: mu held.
  const auto tally_mismatch = [&](const std::string& text, size_t p, int64_t n, bool hung_up,
                                  Counts& t) {
    size_t own_best = 0;
    for (const std::string& w : want[p]) own_best = std::max(own_best, common_prefix(text, w));
    size_t other = 0;
    for (size_t q = 0; q < want.size(); ++q) {
      if (q == p) continue;
      for (const std::string& w : want[q]) other = std::max(other, common_prefix(text, w));
    }
    if (own_best > other && own_best > 0) {
      ++(hung_up ? t.diverged_hung_up : t.diverged);
      ++t.divergences[{p, own_best}];
    } else {
      ++t.mixed;
      if (t.first_mixed.empty())
        t.first_mixed = "prompt " + std::to_string(p) + ", " + std::to_string(n) + " tokens";
    }
  };
  auto client = [&](int c) {
    std::mt19937_64 r(o.seed * 7919 + static_cast<uint64_t>(c) + 1);
    std::uniform_real_distribution<double> u(0, 1);
    std::uniform_int_distribution<size_t> which(0, prompts.size() - 1);
    std::uniform_int_distribution<size_t> out_len(0, o.output_lens.size() - 1);
    while (SoakClock::now() < end) {
      const size_t p = which(r), k = out_len(r);
      const int64_t n = o.output_lens[k];
      const double roll = u(r);
      const bool leave = roll < o.disconnect_share;
      const bool slow = !leave && roll < o.disconnect_share + o.slow_share;
      const int leave_after =
          leave ? 1 + static_cast<int>(u(r) * double(std::max<int64_t>(1, n / 2))) : 0;
      const Streamed s =
          stream_one(o, request_body(model, prompts[p], n), leave_after, slow ? o.slow_ms : 0);
      std::lock_guard<std::mutex> lock(mu);
      ++total.sent;
      total.slow += slow;
      if (s.hung_up) {
        ++total.hung_up;
        // What came before the hang-up must be the start of this request's own text (the
        // server holds back an incomplete UTF-8 sequence, so a stream's text is always a prefix).
        if (want[p][k].compare(0, s.text.size(), s.text) != 0)
          tally_mismatch(s.text, p, n, true, total);
      } else if (!s.error.empty() || !s.done || s.finish.empty()) {
        ++total.errors;
        const std::string why =
            s.error.empty() ? (s.done ? "no finish reason" : "no [DONE]") : s.error;
        ++total.error_kinds[why.substr(0, 60)];
      } else if (s.text != want[p][k] || s.finish != "length") {
        tally_mismatch(s.text, p, n, false, total);
      } else {
        ++total.completed;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int c = 0; c < o.clients; ++c) threads.emplace_back(client, c);
  std::printf("%8s %10s %10s %9s %8s %8s %8s %10s %8s\n", "time s", "requests", "completed",
              "diverged", "hung up", "errors", "mixed", "RSS MiB", "fds");
  auto print_row = [&] {
    const auto [rss, fds] = server_usage(o.server_pid);
    std::lock_guard<std::mutex> lock(mu);
    std::printf("%8.0f %10lld %10lld %9lld %8lld %8lld %8lld %10.1f %8d\n",
                std::chrono::duration<double>(SoakClock::now() - t0).count(),
                static_cast<long long>(total.sent), static_cast<long long>(total.completed),
                static_cast<long long>(total.diverged), static_cast<long long>(total.hung_up),
                static_cast<long long>(total.errors), static_cast<long long>(total.mixed), rss,
                fds);
    std::fflush(stdout);
  };
  for (auto next = t0; SoakClock::now() < end;) {
    next += std::chrono::duration_cast<SoakClock::duration>(
        std::chrono::duration<double>(o.report_every_s));
    std::this_thread::sleep_until(std::min(next, end));
    print_row();
  }
  for (auto& th : threads) th.join();
  print_row();
  // Let the server finish noticing the last hang-ups before its counters are read.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const std::map<std::string, double> after = finished_counts(o);
  const auto delta = [&](const char* k) {
    const auto a = after.find(k), b = before.find(k);
    return (a == after.end() ? 0.0 : a->second) - (b == before.end() ? 0.0 : b->second);
  };
  const double length = delta("length"), abort = delta("abort"), stop = delta("stop");
  std::printf(
      "requests %lld: completed %lld (diverged %lld), hung up %lld (slow readers %lld), errors "
      "%lld, "
      "mixed %lld\n",
      static_cast<long long>(total.sent), static_cast<long long>(total.completed + total.diverged),
      static_cast<long long>(total.diverged), static_cast<long long>(total.hung_up),
      static_cast<long long>(total.slow), static_cast<long long>(total.errors),
      static_cast<long long>(total.mixed));
  if (total.diverged > 0) {
    std::printf(
        "diverged %lld (and %lld that hung up after diverging): their own text up to a point, "
        "then another (greedy argmax flips at near-ties, since a row's products sum in another "
        "order in a larger batch); at:\n",
        static_cast<long long>(total.diverged), static_cast<long long>(total.diverged_hung_up));
    for (const auto& [at, n] : total.divergences)
      std::printf("  prompt %zu, byte %zu: x%lld\n", at.first, at.second,
                  static_cast<long long>(n));
  }
  for (const auto& [why, n] : total.error_kinds)
    std::printf("  error x%lld: %s\n", static_cast<long long>(n), why.c_str());
  if (!after.empty()) {
    std::printf("/metrics over the soak: length %.0f, abort %.0f, stop %.0f (sum %.0f)\n", length,
                abort, stop, length + abort + stop);
  }
  // A client that hangs up just as its request ends may see it finish ("length"); every request
  // ends exactly once either way.
  const bool metrics_agree =
      after.empty() || (length + abort + stop == double(total.sent) &&
                        length >= double(total.completed) && abort <= double(total.hung_up));
  const int64_t inexact = o.exact ? total.diverged + total.diverged_hung_up : 0;
  if (total.errors > 0 || total.mixed > 0 || inexact > 0 || !metrics_agree) {
    DUET_ERROR("bench soak failed: "
               << total.errors << " errors, " << total.mixed << " mixed"
               << (inexact > 0 ? ", " + std::to_string(inexact) + " diverged (--exact)" : "")
               << (total.first_mixed.empty() ? "" : " (first: " + total.first_mixed + ")")
               << (metrics_agree ? "" : ", /metrics disagrees with the client"));
  }
  std::printf("bench soak: passed\n");
}

}  // namespace

void add_bench_soak(CLI::App& bench) {
  auto o = std::make_shared<SoakOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "soak",
      "Hold many streaming clients against a server for a while; check nothing is lost or mixed");
  cmd->add_option("--base-url", o->base_url, "Server URL (default http://127.0.0.1:8000)");
  cmd->add_option("--model", o->model, "Model name (default: the first of /v1/models)");
  cmd->add_option("--api-key", o->api_key, "Sent as 'Authorization: Bearer KEY'")
      ->envname("DUET_API_KEY");
  cmd->add_option("--clients", o->clients, "Concurrent clients (default 256)");
  cmd->add_option("--duration", o->duration_s, "Seconds (default 600)");
  cmd->add_option("--prompts", o->n_prompts, "Distinct prompts (default 32)");
  cmd->add_option("--min-input-len", o->min_input, "Shortest prompt (default 4)");
  cmd->add_option("--max-input-len", o->max_input, "Longest prompt (default 96)");
  cmd->add_option("--output-lens", o->output_lens, "Output lengths to draw from (default 8 32 128)")
      ->delimiter(',');
  cmd->add_option("--disconnect-share", o->disconnect_share,
                  "Share of requests whose client hangs up mid-stream (default 0.1)");
  cmd->add_option("--slow-share", o->slow_share, "Share of requests read slowly (default 0.1)");
  cmd->add_option("--slow-ms", o->slow_ms, "A slow reader's pause after each chunk (default 20)");
  cmd->add_option("--token-range", o->token_range,
                  "Prompt ids are drawn from [0, N) (default 256)");
  cmd->add_option("--seed", o->seed, "Seed of the prompts and the clients' choices");
  cmd->add_option("--server-pid", o->server_pid,
                  "The server's pid (same host): report its memory and descriptors");
  cmd->add_option("--report-every", o->report_every_s, "Seconds between report rows (default 30)");
  cmd->add_flag("--exact", o->exact,
                "Fail on any request whose text diverged from its text alone (for a server run "
                "with --batch-invariant, where none may)");
  cmd->callback([o] { run_soak(*o); });
}

}  // namespace duet
