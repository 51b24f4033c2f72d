// `duet serve MODEL_DIR`: the OpenAI-compatible server. The engine loop and the HTTP threads
// run until SIGINT or SIGTERM, which a dedicated thread waits for (sigwait) and turns into a
// clean stop. With --data-parallel-size N --enable-expert-parallel every rank runs an engine
// and rank 0 alone serves HTTP (engine/llm_engine.h describes the group).
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/commands.h"
#include "cli/dist_options.h"
#include "cli/kv_cache_option.h"
#include "cli/scheduler_options.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/llm_engine.h"
#include "model/model.h"
#include "server/api_server.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace duet {

namespace {

struct ServeOptions {
  std::string model_dir;
  std::string host = "127.0.0.1";
  int port = 8000;
  EngineConfig engine;
  std::string served_model_name;
  std::string api_key;  // --api-key, else $DUET_API_KEY
  int threads = 0;
  int http_threads = 0;
  double header_timeout = 30;  // --header-timeout
  DistOptions dist;
};

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

// One rank of `duet serve`; ctx is null on a single rank.
void run_serve_rank(const ServeOptions& o, DistContext* ctx) {
  RankModel rm = load_rank_model(o.model_dir, o.dist, ctx);
  const std::unique_ptr<Model>& model = rm.model;
  std::unique_ptr<Tokenizer> tokenizer;
  if (Tokenizer::exists(o.model_dir)) tokenizer = Tokenizer::load(o.model_dir);
  std::unique_ptr<ChatTemplate> chat_template;
  try {
    chat_template = ChatTemplate::load(o.model_dir);
  } catch (const Error& e) {
    std::fprintf(stderr, "note: /v1/chat/completions is disabled: %s\n", e.what());
  }
  ThreadPool pool(rank_threads(o.threads, o.dist, ctx));
  split_rank_cores(o.dist, ctx, pool);
  LlmEngine engine(*model, pool, tokenizer.get(), o.engine, rm.group);
  if (ctx && ctx->rank() != 0) {
    // Runs until rank 0 stops the group; a failed group is an error of this rank too.
    const std::string error = engine.wait_stopped();
    finish_trace(rm, o.dist, ctx);
    if (!error.empty()) DUET_ERROR(error);
    return;
  }

  ApiServerOptions so;
  so.model_name = o.served_model_name.empty() ? o.model_dir : o.served_model_name;
  so.http_threads =
      o.http_threads > 0
          ? o.http_threads
          : static_cast<int>(std::max<int64_t>(128, 4 * o.engine.scheduler.max_num_seqs));
  so.add_bos = tokenizer && tokenizer->add_bos_token();
  so.bos_id = model->config().bos_token_id;
  so.api_key = o.api_key;
  so.header_timeout_seconds = o.header_timeout;
  if (so.api_key.empty()) {
    const char* env = std::getenv("DUET_API_KEY");
    if (env) so.api_key = env;
  }
  ApiServer server(engine, tokenizer.get(), chat_template.get(), so);
  const int port = server.bind(o.host, o.port);

  const sigset_t signals = stop_signals();
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    std::fprintf(stderr, "duet serve: signal %d, stopping\n", sig);
    server.stop();
  });
  const std::string interval =
      o.engine.stream_interval > 1
          ? ", streams every " + std::to_string(o.engine.stream_interval) + " tokens"
          : "";
  std::printf(
      "duet serve: %s on http://%s:%d (%d ranks, %d compute threads each, %lld %s KV "
      "blocks of %lld, %s%s%s%s)\n",
      so.model_name.c_str(), o.host.c_str(), port, ctx ? ctx->world_size() : 1, pool.n_threads(),
      static_cast<long long>(engine.metrics().snapshot().kv_blocks_total),
      kv_dtype_name(engine.kv_dtype()), static_cast<long long>(o.engine.block_size),
      describe_scheduler(o.engine).c_str(), interval.c_str(),
      so.api_key.empty() ? "" : ", API key required",
      o.dist.batch_invariant ? ", batch-invariant" : "");
  std::fflush(stdout);
  server.listen();
  // listen() also returns when the socket fails; wake the waiter so it can be joined.
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  finish_trace(rm, o.dist, ctx);
}

void run_serve(const ServeOptions& o) {
  signal(SIGPIPE, SIG_IGN);  // a client that left must not kill the server
  // Every thread created from here on inherits the mask; only rank 0's waiter takes the stop
  // signals. The other MPI ranks keep the default action: mpirun's SIGTERM ends them.
  const sigset_t signals = stop_signals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  DistOptions dist = o.dist;
  dist.keep_serving_when_a_rank_dies = true;
  launch_ranks(dist, o.model_dir, [&](DistContext* ctx) {
    if (ctx && ctx->rank() != 0 && o.dist.backend == "mpi")
      pthread_sigmask(SIG_UNBLOCK, &signals, nullptr);
    run_serve_rank(o, ctx);
  });
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  auto kv_gib = std::make_shared<double>(2.0);
  auto kv_dtype = std::make_shared<std::string>("auto");
  CLI::App* cmd = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  cmd->add_option("model_dir", o->model_dir, "Hugging Face model directory")->required();
  cmd->add_option("--host", o->host, "Address to listen on (default 127.0.0.1)");
  cmd->add_option("--port", o->port, "Port (default 8000; 0 picks a free one)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--max-num-seqs", o->engine.scheduler.max_num_seqs,
                  "Requests in the running batch at once (default 64)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-num-batched-tokens", o->engine.scheduler.max_num_batched_tokens,
                  "Tokens per forward pass; longer prompts are prefilled in chunks (default 512)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--kv-cache-memory", *kv_gib, "KV cache size in GiB (default 2)");
  cmd->add_option("--block-size", o->engine.block_size, "Positions per KV block (default 16)")
      ->check(CLI::Range(1, 1024));
  add_kv_cache_dtype_option(cmd, *kv_dtype);
  add_scheduler_options(cmd, o->engine);
  cmd->add_option("--stream-interval", o->engine.stream_interval,
                  "Stream a request's tokens in batches of this many (its first token and its "
                  "end at once; default 1: each token as it comes)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--api-key", o->api_key,
                  "Require 'Authorization: Bearer KEY' on every /v1 route (401 otherwise); "
                  "default: $DUET_API_KEY, else none. /health and /metrics stay open");
  cmd->add_option("--served-model-name", o->served_model_name,
                  "Model name in the API (default: MODEL_DIR as given)");
  cmd->add_option("--threads", o->threads, "Compute threads (default: available cores)");
  cmd->add_option("--http-threads", o->http_threads,
                  "Connections served at once (default max(128, 4 x max-num-seqs))");
  cmd->add_option("--header-timeout", o->header_timeout,
                  "Seconds a connection has to send a whole request, headers and body (else HTTP "
                  "408 and closed); 0: no limit but httplib's 5 s per read; at least 5 (an idle "
                  "keep-alive connection is closed quietly after 5 s); default 30")
      ->check(CLI::Range(0.0, 86400.0));
  add_dist_options(cmd, o->dist);
  cmd->callback([o, kv_gib, kv_dtype] {
    o->engine.kv_cache_gib = *kv_gib;
    o->engine.kv_cache_dtype = parse_kv_cache_dtype(*kv_dtype);
    if (o->header_timeout > 0 && o->header_timeout < 5) {
      char got[32];
      std::snprintf(got, sizeof got, "%g", o->header_timeout);
      throw std::invalid_argument(std::string("--header-timeout ") + got +
                                  " is neither 0 nor at least 5 seconds (an idle keep-alive "
                                  "connection is closed after 5 s)");
    }
    run_serve(*o);
  });
}

}  // namespace duet
