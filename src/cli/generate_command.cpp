#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "cli/commands.h"
#include "cli/dist_options.h"
#include "cli/kv_cache_option.h"
#include "cli/scheduler_options.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/generator.h"
#include "engine/kv_dtype.h"
#include "engine/llm_engine.h"
#include "model/model.h"
#include "text/tokenizer.h"

namespace duet {

namespace {

struct GenerateOptions {
  std::string model_dir;
  std::string prompt;
  std::string prompt_ids;
  int64_t max_tokens = 16;
  float temperature = 0.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;
  int64_t seed = -1;
  std::string dump_logits;
  int threads = 0;
  bool ignore_eos = false;
  std::string kv_cache_dtype = "auto";
  KvCacheDtype kv_dtype = KvCacheDtype::kAuto;  // parsed from kv_cache_dtype
  EngineConfig engine;  // --disable-overlap-schedule, --num-scheduler-steps, --kv-cache-memory
  DistOptions dist;
};

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      long v = std::stol(item, &used);
      if (used != item.size()) throw std::invalid_argument(item);
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::exception&) {
      throw Error("--prompt-ids: '" + item + "' is not an integer (expected e.g. 1,2,3)");
    }
  }
  return ids;
}

void write_logits(const std::string& path, const std::vector<int32_t>& prompt,
                  const GenerateResult& r, int64_t n_vocab) {
  std::ofstream out(path);
  if (!out) throw Error(path + ": cannot write");
  char buf[32];
  out << "{\"tokens\": " << nlohmann::json(prompt).dump() << ", \"logits\": [";
  for (size_t p = 0; p < prompt.size(); ++p) {
    out << (p ? ",\n[" : "\n[");
    for (int64_t v = 0; v < n_vocab; ++v) {
      std::snprintf(buf, sizeof buf, "%s%.9g", v ? ", " : "", r.prompt_logits[p * n_vocab + v]);
      out << buf;
    }
    out << "]";
  }
  out << "], \"generated\": " << nlohmann::json(r.tokens).dump() << "}\n";
  if (!out) throw Error(path + ": write failed");
}

// What a generate run prints besides the completion.
struct GenerateSummary {
  int64_t prompt_tokens = 0;
  int64_t generated = 0;
  double prefill_seconds = 0;  // to the first generated token
  double decode_seconds = 0;   // from the first generated token to the last
  int64_t decoded = 0;         // the tokens generated in decode_seconds
};

// --dump-logits and --max-tokens 0: the Generator, which keeps every prompt position's logits
// (one step at a time: neither the overlapped scheduler nor multi-step). Returns rank 0's
// result (empty elsewhere).
std::optional<GenerateResult> generate_reference(const GenerateOptions& o, const Model& model,
                                                 ThreadPool& pool, const RankModel& rm,
                                                 DistContext* ctx, const GenerateRequest& req,
                                                 GenerateSummary& sum) {
  Generator gen(model, pool, o.kv_dtype, rm.group);
  std::vector<GenerateRequest> mine;
  if (!ctx || ctx->rank() == 0) mine.push_back(req);
  GenerateStats st;
  std::vector<GenerateResult> out = gen.generate(mine, &st);
  if (out.empty()) return std::nullopt;
  sum.prompt_tokens = st.prompt_tokens;
  sum.generated = st.generated_tokens;
  sum.prefill_seconds = st.prefill_seconds;
  sum.decode_seconds = st.decode_seconds;
  sum.decoded = std::max<int64_t>(0, st.generated_tokens - 1);
  return out[0];
}

// Everything else: the serving engine, as `serve` runs it (the overlapped scheduler unless
// --disable-overlap-schedule, --num-scheduler-steps). Rank 0 submits the request and reads its
// stream; the other ranks' engines take part in every step until rank 0's engine stops.
// Returns rank 0's result (empty elsewhere).
std::optional<GenerateResult> generate_served(const GenerateOptions& o, const Model& model,
                                              ThreadPool& pool, const RankModel& rm,
                                              DistContext* ctx, const GenerateRequest& req,
                                              GenerateSummary& sum) {
  EngineConfig c = o.engine;
  c.kv_cache_dtype = o.kv_dtype;
  // The whole prompt in one step, as the Generator prefills it.
  c.scheduler.max_num_batched_tokens = std::max<int64_t>(c.scheduler.max_num_batched_tokens,
                                                         static_cast<int64_t>(req.prompt.size()));
  LlmEngine engine(model, pool, nullptr, c, rm.group);
  if (ctx && ctx->rank() != 0) {
    const std::string error = engine.wait_stopped();
    if (!error.empty()) DUET_ERROR(error);
    return std::nullopt;
  }
  EngineRequest er;
  er.prompt = req.prompt;
  er.max_tokens = req.max_tokens;
  er.sampling = req.sampling;
  er.ignore_eos = o.ignore_eos;
  std::shared_ptr<RequestStream> stream = engine.submit(er);
  if (!stream) DUET_ERROR("the engine stopped: " << engine.wait_stopped());
  GenerateResult r;
  for (;;) {
    const StreamDelta d = stream->wait(std::chrono::milliseconds(1000));
    r.tokens.insert(r.tokens.end(), d.tokens.begin(), d.tokens.end());
    if (!d.finished) continue;
    if (!d.error.empty()) DUET_ERROR(d.error);
    r.finish_reason = d.finish_reason;
    break;
  }
  // Timed by the engine as it emits each token (time to the first token, then the gaps between
  // tokens), not as this thread reads them: a delta carries every token made since the last
  // read, all of them when the model is fast and this thread wakes late.
  const EngineMetricsSnapshot m = engine.metrics().snapshot();
  sum.prompt_tokens = static_cast<int64_t>(req.prompt.size());
  sum.generated = static_cast<int64_t>(r.tokens.size());
  sum.prefill_seconds = m.ttft.sum;
  sum.decode_seconds = m.itl.sum;
  sum.decoded = static_cast<int64_t>(m.itl.count);
  return r;
}

// One rank's part of `duet generate`: on several ranks (expert parallelism) rank 0 generates
// the prompt and the others take part in every step with dummy batches.
void run_generate_rank(const GenerateOptions& o, DistContext* ctx) {
  ThreadPool pool(rank_threads(o.threads, o.dist, ctx));
  split_rank_cores(o.dist, ctx, pool);
  RankModel rm = load_rank_model(o.model_dir, o.dist, ctx);
  const std::unique_ptr<Model>& model = rm.model;
  const ModelConfig& c = model->config();
  std::unique_ptr<Tokenizer> tok;
  GenerateRequest req;
  if (!o.prompt_ids.empty()) {
    req.prompt = parse_ids(o.prompt_ids);
  } else {
    tok = Tokenizer::load(o.model_dir);
    if (tok->add_bos_token() && c.bos_token_id >= 0) req.prompt.push_back(c.bos_token_id);
    std::vector<int32_t> ids = tok->encode(o.prompt);
    req.prompt.insert(req.prompt.end(), ids.begin(), ids.end());
  }
  req.max_tokens = o.max_tokens;
  req.sampling.temperature = o.temperature;
  req.sampling.top_p = o.top_p;
  req.sampling.top_k = o.top_k;
  if (o.seed >= 0) req.sampling.seed = static_cast<uint64_t>(o.seed);
  req.prompt_logits = !o.dump_logits.empty();
  if (!o.ignore_eos) req.stop_ids = c.eos_token_ids;

  // The request is rank 0's; on several ranks the others take part in every step with dummy
  // batches, and its logits (--dump-logits) are rank 0's own.
  const bool reference = req.prompt_logits || req.max_tokens == 0;
  GenerateSummary sum;
  const std::optional<GenerateResult> out =
      reference ? generate_reference(o, *model, pool, rm, ctx, req, sum)
                : generate_served(o, *model, pool, rm, ctx, req, sum);
  finish_trace(rm, o.dist, ctx);
  if (!out) return;
  const GenerateResult& r = *out;
  if (r.finish_reason == "error") DUET_ERROR(r.error);

  if (!tok && Tokenizer::exists(o.model_dir)) tok = Tokenizer::load(o.model_dir);
  if (tok) {
    std::printf("%s\n", utf8_lossy(tok->decode(r.tokens, /*skip_special=*/true)).c_str());
  } else {
    std::printf("%s\n", nlohmann::json(r.tokens).dump().c_str());
  }
  std::fflush(stdout);
  std::fprintf(
      stderr,
      "prompt: %lld tokens, %.1f tok/s | generation: %lld tokens, %.1f tok/s | "
      "finish: %s | %d threads | KV cache %s | %s\n",
      static_cast<long long>(sum.prompt_tokens),
      sum.prefill_seconds > 0 ? sum.prompt_tokens / sum.prefill_seconds : 0.0,
      static_cast<long long>(sum.generated),
      sum.decode_seconds > 0 ? sum.decoded / sum.decode_seconds : 0.0, r.finish_reason.c_str(),
      pool.n_threads(), kv_dtype_name(resolve_kv_dtype(o.kv_dtype, *model)),
      reference ? "one step at a time (all prompt logits)" : describe_scheduler(o.engine).c_str());
  if (!o.dump_logits.empty()) write_logits(o.dump_logits, req.prompt, r, c.n_vocab);
}

void run_generate(const GenerateOptions& o) {
  launch_ranks(o.dist, o.model_dir, [&](DistContext* ctx) { run_generate_rank(o, ctx); });
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate a completion for one prompt");
  cmd->add_option("model_dir", o->model_dir, "Hugging Face model directory")->required();
  auto* text = cmd->add_option("--prompt", o->prompt, "Prompt text");
  auto* ids = cmd->add_option("--prompt-ids", o->prompt_ids, "Prompt token ids, e.g. 1,2,3");
  text->excludes(ids);
  cmd->add_option("--max-tokens", o->max_tokens, "Tokens to generate (default 16; 0: prefill only)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--temperature", o->temperature, "0 = greedy (default)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", o->top_p, "Nucleus sampling mass in (0, 1]");
  cmd->add_option("--top-k", o->top_k, "Keep the k most likely tokens (0 = all)");
  cmd->add_option("--seed", o->seed, "Sampling seed (default: random)");
  cmd->add_option("--dump-logits", o->dump_logits,
                  "Write {tokens, logits per prompt position, generated} as JSON (runs one step at "
                  "a time, without the overlapped scheduler or multi-step)");
  cmd->add_option("--threads", o->threads, "Compute threads (default: available cores)");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Do not stop at the end-of-sequence token");
  add_kv_cache_dtype_option(cmd, o->kv_cache_dtype);
  cmd->add_option("--kv-cache-memory", o->engine.kv_cache_gib,
                  "KV cache size in GiB (default 2; pages are touched only when used)")
      ->check(CLI::PositiveNumber);
  add_scheduler_options(cmd, o->engine);
  add_dist_options(cmd, o->dist);
  cmd->callback([o, text, ids] {
    if (text->count() == 0 && ids->count() == 0)
      throw Error("generate needs --prompt TEXT or --prompt-ids IDS");
    o->kv_dtype = parse_kv_cache_dtype(o->kv_cache_dtype);
    run_generate(*o);
  });
}

}  // namespace duet
