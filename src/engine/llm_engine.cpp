#include "engine/llm_engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/affinity.h"
#include "core/error.h"

namespace duet {

namespace {

BlockPoolShape pool_shape(const Model& model, const EngineConfig& c) {
  BlockPoolShape s;
  s.n_layer = model.config().n_layer;
  s.k_width = model.kv_k_width();
  s.v_width = model.kv_v_width();
  s.block_size = c.block_size;
  s.dtype = resolve_kv_dtype(c.kv_cache_dtype, model);
  return s;
}

int64_t pool_blocks(const Model& model, const EngineConfig& c) {
  if (c.block_size < 1 || c.block_size > 1024)
    DUET_ERROR("--block-size must be in [1, 1024], got " << c.block_size);
  if (!(c.kv_cache_gib > 0) || !std::isfinite(c.kv_cache_gib))
    DUET_ERROR("--kv-cache-memory must be > 0 GiB, got " << c.kv_cache_gib);
  const BlockPoolShape shape = pool_shape(model, c);
  const int64_t n =
      BlockPool::blocks_in(shape, static_cast<uint64_t>(c.kv_cache_gib * (1ull << 30)));
  if (n < 1) {
    DUET_ERROR("--kv-cache-memory " << c.kv_cache_gib << " GiB holds no KV block of "
                                    << BlockPool::bytes_per_block(shape) << " bytes");
  }
  return std::min<int64_t>(n, (int64_t{1} << 31) - 1);
}

// Placeholders outstanding at once: the sampled rows of at most two jobs not yet processed (the
// one in flight and the one being scheduled), each up to max_num_seqs rows per step; twice that
// for slack.
int64_t future_slots(const EngineConfig& c) {
  return 4 * std::max<int64_t>(1, c.scheduler.max_num_seqs) *
             std::max<int64_t>(1, c.num_scheduler_steps) +
         16;
}

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

LlmEngine::LlmEngine(const Model& model, ThreadPool& pool, const Tokenizer* tokenizer,
                     const EngineConfig& config, const StepGroup& group)
    : model_(model),
      pool_(pool),
      helps_pool_(config.overlap_schedule && config.engine_thread_computes &&
                  pool.n_threads() >= 2 &&
                  (group.coord == nullptr || group.coord->world_size() == 1)),
      tokenizer_(tokenizer),
      max_model_len_(model.config().max_position_embeddings),
      blocks_(pool_shape(model, config), pool_blocks(model, config)),
      kv_(blocks_),
      scheduler_(config.scheduler, kv_),
      steps_(model, pool, group),
      future_(future_slots(config)),
      worker_(steps_, future_, pool, model.config().n_vocab, config.overlap_schedule,
              config.before_step),
      num_scheduler_steps_(config.num_scheduler_steps),
      after_launch_(config.after_launch),
      stream_interval_(config.stream_interval) {
  if (config.stream_interval < 1)
    DUET_ERROR("--stream-interval must be at least 1, got " << config.stream_interval);
  if (config.num_scheduler_steps < 1 || config.num_scheduler_steps > 64)
    DUET_ERROR("--num-scheduler-steps must be in [1, 64], got " << config.num_scheduler_steps);
  publish_state();
  if (helps_pool_) pool_.set_active_workers(pool_.n_threads() - 2);
  thread_ = std::thread([this] {
    name_this_thread("duet-engine");
    run();
  });
}

LlmEngine::~LlmEngine() {
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    stop_ = true;
  }
  inbox_cv_.notify_all();
  thread_.join();
  fail_all("");
  if (helps_pool_) pool_.set_active_workers(pool_.n_threads() - 1);
}

std::shared_ptr<RequestStream> LlmEngine::submit(EngineRequest req) {
  const ModelConfig& c = model_.config();
  if (req.prompt.empty()) DUET_ERROR("the prompt is empty");
  for (int32_t id : req.prompt) {
    if (id < 0 || id >= c.n_vocab)
      DUET_ERROR("prompt token id " << id << " is outside the vocabulary [0, " << c.n_vocab << ")");
  }
  if (req.max_tokens < 1) DUET_ERROR("max_tokens must be at least 1, got " << req.max_tokens);
  const int64_t n_prompt = static_cast<int64_t>(req.prompt.size());
  if (req.max_tokens > max_model_len_ || n_prompt + req.max_tokens > max_model_len_) {
    DUET_ERROR("This model's maximum context length is "
               << max_model_len_ << " tokens. However, you requested " << n_prompt + req.max_tokens
               << " tokens (" << n_prompt << " in the prompt, " << req.max_tokens
               << " in the completion). Please reduce the length of the prompt or completion.");
  }
  if (!scheduler_.can_fit(n_prompt + req.max_tokens)) {
    DUET_ERROR("the request needs " << kv_.blocks_for(n_prompt + req.max_tokens)
                                    << " KV blocks but the whole cache has " << blocks_.n_blocks()
                                    << " (raise --kv-cache-memory)");
  }
  for (const std::string& s : req.stop)
    if (s.empty()) DUET_ERROR("stop strings must not be empty");
  if (!req.stop.empty() && !tokenizer_) DUET_ERROR("stop strings need the model's tokenizer");
  if (!req.ignore_eos)
    req.stop_ids.insert(req.stop_ids.end(), c.eos_token_ids.begin(), c.eos_token_ids.end());

  DUET_CHECK(steps_.coord().is_master(), "submit() on rank " << steps_.coord().rank());
  std::unique_ptr<Live> live = make_live(std::move(req), next_id_.fetch_add(1));
  std::shared_ptr<RequestStream> stream = live->stream;
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    if (!alive_.load()) return nullptr;
    inbox_.push_back(std::move(live));
  }
  inbox_cv_.notify_one();
  return stream;
}

std::unique_ptr<LlmEngine::Live> LlmEngine::make_live(EngineRequest req, uint64_t id) {
  Sampler sampler(req.sampling);  // throws on bad parameters
  OutputText text(req.stop);
  auto live = std::unique_ptr<Live>(new Live{nullptr, nullptr, std::move(req), std::move(sampler),
                                             nullptr, std::move(text), Clock::now(), Clock::now()});
  if (tokenizer_)
    live->decoder = std::make_unique<IncrementalDecoder>(*tokenizer_, /*skip_special=*/true);
  live->seq = std::make_unique<Sequence>();
  live->seq->id = id;
  live->seq->tokens = live->req.prompt;
  live->seq->n_prompt = static_cast<int64_t>(live->req.prompt.size());
  live->seq->max_tokens = live->req.max_tokens;
  live->stream = std::make_shared<RequestStream>(id, live->seq->n_prompt);
  return live;
}

std::string LlmEngine::wait_stopped() {
  std::unique_lock<std::mutex> lock(inbox_mu_);
  stopped_cv_.wait(lock, [&] { return stopped_; });
  return stop_error_;
}

void LlmEngine::run() {
  std::string error;
  try {
    std::vector<int64_t> load(static_cast<size_t>(steps_.coord().world_size()), 0);
    while (step(load)) {
    }
    flush_streams();
    // Stopping: the steps in flight end (every rank launched the same ones); their output is
    // dropped, as the requests they belong to end with "abort".
    while (worker_.pending() > 0) worker_.wait();
  } catch (const std::exception& e) {
    error = e.what();
    std::fprintf(stderr, "error: engine loop stopped: %s\n", e.what());
    // A step in flight samples with the requests' samplers: let it end (or fail) first.
    try {
      while (worker_.pending() > 0) worker_.wait();
    } catch (const std::exception&) {
    }
    fail_all(std::string("engine error: ") + e.what());
  }
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    stopped_ = true;
    stop_error_ = error;
  }
  stopped_cv_.notify_all();
}

bool LlmEngine::step(std::vector<int64_t>& load) {
  free_retired();
  // With no request running, the control plane may wait for new ones: nothing may stay staged.
  if (live_.empty()) flush_streams();
  if (!exchange_control(load)) return false;
  reap_aborted();

  const SchedulerStep plan = scheduler_.schedule();
  uint64_t prompt_tokens = 0, generated = 0;
  bool has_prefill = false;
  ForwardInput in = build_input(plan, &prompt_tokens, &has_prefill);
  const int64_t n_steps =
      num_scheduler_steps_ > 1 && !has_prefill
          ? scheduler_.reserve_lookahead(plan, num_scheduler_steps_, max_model_len_)
          : 1;
  const StepPlan step_plan = steps_.agree_step(in, has_prefill, n_steps);
  if (step_plan.runs()) launch(plan, step_plan, std::move(in));
  // The clients get the output processed last time now that the worker has its next step.
  flush_streams();

  // Process outputs: overlapped, those of every job but the one just launched (it computes
  // meanwhile); else all of them. The output staged meanwhile reaches the clients before the
  // engine thread waits for the worker (it would idle anyway), else at the next launch: a
  // multi-step run streams each step's tokens as it ends unless the next step's are ready too.
  const int64_t keep = worker_.overlapped() && step_plan.runs() ? step_plan.n_steps : 0;
  while (worker_.pending() > keep) {
    if (!worker_.ready()) flush_streams();
    // Until the step in flight posts its output, compute with it.
    if (helps_pool_) pool_.help_until([&] { return worker_.ready(); });
    generated += process_outputs(worker_.wait());
  }
  // Nothing computes meanwhile (or the other ranks' output travels to rank 0 now): no reason to
  // hold the output back.
  if (worker_.pending() == 0 || !steps_.solo()) flush_streams();
  exchange_outputs(load, prompt_tokens, generated, plan.preempted.size());
  if (steps_.solo() && !step_plan.runs() && worker_.pending() == 0 && !live_.empty()) {
    // Nothing could run (should not happen: every admitted request fits the pool alone).
    std::unique_lock<std::mutex> lock(inbox_mu_);
    inbox_cv_.wait_for(lock, std::chrono::milliseconds(10));
  }
  return true;
}

ForwardInput LlmEngine::build_input(const SchedulerStep& plan, uint64_t* prompt_tokens,
                                    bool* has_prefill) {
  ForwardInput in;
  for (const ScheduledChunk& c : plan.chunks) {
    Sequence& s = *c.seq;
    in.add(s.kv_seq, c.n_past, s.tokens.data() + c.n_past, c.n_tokens, /*all_logits=*/false);
    if (!c.sample) in.out_rows.pop_back();  // a middle chunk of a prefill: no logits needed
    // A chunk of prompt tokens, or of a preempted sequence recomputing its tokens.
    *has_prefill |= c.n_tokens > 1 || c.n_past < s.n_prompt;
    // Prompt positions computed for the first time (a recomputation after preemption only
    // counts the part of the prompt it had not reached before).
    const int64_t first_new = std::max(c.n_past, s.n_prompt_counted);
    const int64_t end = std::min(c.n_past + c.n_tokens, s.n_prompt);
    if (end > first_new) {
      *prompt_tokens += static_cast<uint64_t>(end - first_new);
      s.n_prompt_counted = end;
    }
  }
  return in;
}

void LlmEngine::launch(const SchedulerStep& plan, const StepPlan& step_plan, ForwardInput in) {
  if (step_plan.n_steps > 1) Scheduler::advance(plan, step_plan.n_steps);
  StepJob job;
  job.plan = step_plan;
  job.n_steps = step_plan.n_steps;
  job.kv = std::make_unique<PagedKvView>(kv_.snapshot(in));
  Launched rec;
  std::vector<Sequence*> seqs;
  for (const ScheduledChunk& c : plan.chunks) {
    if (!c.sample) continue;
    Live& live = *live_.at(c.seq->id);
    job.samplers.push_back(&live.sampler);
    rec.rows.push_back({c.seq->id, c.seq->tokens.size()});
    seqs.push_back(c.seq);
  }
  // Every sampled row's token of every step is a placeholder until its output is processed.
  for (int64_t k = 0; k < job.n_steps; ++k) {
    for (Sequence* seq : seqs) {
      const int32_t ph = future_.alloc();
      job.placeholders.push_back(ph);
      seq->tokens.push_back(ph);
    }
  }
  job.in = std::move(in);
  launched_.push_back(std::move(rec));
  ++n_launched_;
  const uint64_t id = worker_.launch(std::move(job));
  if (after_launch_) after_launch_(id);
}

uint64_t LlmEngine::process_outputs(const StepOutput& out) {
  DUET_CHECK(!launched_.empty(), "a step output with no job launched");
  const Launched& rec = launched_.front();
  DUET_CHECK(out.tokens.size() == rec.rows.size(),
             "step output of " << out.tokens.size() << " rows for a job of " << rec.rows.size());
  uint64_t generated = 0;
  for (size_t r = 0; r < rec.rows.size(); ++r) {
    auto it = live_.find(rec.rows[r].id);
    if (it == live_.end()) continue;  // finished (stopped, aborted) earlier: a discarded token
    Live& live = *it->second;
    Sequence& seq = *live.seq;
    const size_t at = rec.rows[r].index + static_cast<size_t>(out.step);
    DUET_CHECK(at < seq.tokens.size() && FutureMap::is_placeholder(seq.tokens[at]),
               "request " << seq.id << ": no placeholder at token " << at);
    if (!out.errors[r].empty()) {  // this request ends with the error; the others go on
      finish(seq.id, "abort", "", out.errors[r]);
      continue;
    }
    seq.tokens[at] = out.tokens[r];
    ++generated;
    emit(live, out.tokens[r], static_cast<int64_t>(at) + 1 - seq.n_prompt);
  }
  const StepStats& ss = out.stats;
  metrics_.set_steps(ss.gap_seconds, ss.gaps, ss.forward_seconds, ss.steps);
  if (out.last) {
    launched_.pop_front();
    ++n_processed_;
  }
  return generated;
}

bool LlmEngine::emit(Live& live, int32_t tok, int64_t n_gen) {
  Sequence& seq = *live.seq;
  const Clock::time_point now = Clock::now();
  if (n_gen == 1) {
    metrics_.observe_ttft(seconds(now - live.arrival));
  } else {
    metrics_.observe_itl(seconds(now - live.last_token));
  }
  live.last_token = now;

  std::string reason;
  const auto& stop_ids = live.req.stop_ids;
  if (std::find(stop_ids.begin(), stop_ids.end(), tok) != stop_ids.end()) {
    reason = "stop";
  } else if (live.decoder && live.text.append(live.decoder->step(tok))) {
    reason = "stop";
  } else if (n_gen >= seq.max_tokens) {
    reason = "length";
  }
  if (reason.empty()) {
    stage(live, live.decoder ? live.text.take_ready() : std::string(), tok);
    return false;
  }
  stage(live, "", tok);
  std::string tail;
  if (live.decoder) {
    // What the decoder still held (an incomplete character) may itself complete a stop string.
    if (!live.text.stopped() && live.text.append(live.decoder->finish())) reason = "stop";
    tail = live.text.take_rest();
  }
  finish(seq.id, reason, tail);
  return true;
}

void LlmEngine::stage(Live& live, const std::string& text, int32_t tok) {
  if (live.stream->stage(text, tok)) unflushed_.push_back(live.stream);
}

void LlmEngine::flush_streams() {
  if (stream_interval_ == 1) {
    for (const std::shared_ptr<RequestStream>& s : unflushed_) s->flush(/*wake=*/false);
    waker_.wake(unflushed_);
    return;
  }
  // The streams not due yet stay listed, their output staged.
  to_wake_.clear();
  std::erase_if(unflushed_, [&](const std::shared_ptr<RequestStream>& s) {
    if (!s->due(stream_interval_)) return false;
    s->flush(/*wake=*/false);
    to_wake_.push_back(s);
    return true;
  });
  waker_.wake(to_wake_);
}

void LlmEngine::free_retired() {
  std::erase_if(retired_, [&](const auto& r) { return r.first <= n_processed_; });
}

void LlmEngine::finish(uint64_t id, const std::string& reason, const std::string& tail,
                       const std::string& error) {
  auto it = live_.find(id);
  Live& live = *it->second;
  scheduler_.remove(live.seq.get());
  metrics_.finished(reason, seconds(Clock::now() - live.arrival));  // before the reader wakes
  if (live.stream->stage_finish(reason, tail, error)) unflushed_.push_back(live.stream);
  retired_.emplace_back(n_launched_, std::move(it->second));
  live_.erase(it);
}

void LlmEngine::reap_aborted() {
  std::vector<uint64_t> gone;
  for (const auto& [id, live] : live_)
    if (live->stream->aborted()) gone.push_back(id);
  for (uint64_t id : gone) finish(id, "abort");
}

void LlmEngine::fail_all(const std::string& error) {
  flush_streams();  // what was generated before the failure comes first
  std::vector<std::unique_ptr<Live>> queued;
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    alive_.store(false);
    queued.swap(inbox_);
  }
  for (auto& l : queued) l->stream->finish("abort", "", error);
  for (auto& [id, live] : live_) live->stream->finish("abort", "", error);
  live_.clear();
  for (auto& [id, remote] : remote_) remote.stream->finish("abort", "", error);
  remote_.clear();
}

void LlmEngine::publish_state() {
  metrics_.set_state(scheduler_.n_running(), scheduler_.n_waiting(), blocks_.n_used(),
                     blocks_.n_blocks());
}

}  // namespace duet
