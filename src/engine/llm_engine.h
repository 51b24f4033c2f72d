// The serving engine: one thread that loops over steps, on one rank or on every rank of a
// data-parallel group alike (a single rank is a group of one). A step is five phases:
//   1. control plane (llm_engine_dp.cpp): rank 0 takes the new requests in and hands each to the
//      least loaded rank (running + waiting), with the ids whose clients left, or says stop;
//   2. schedule: the Scheduler picks this rank's batch and reserves its KV rows;
//   3. launch: the one step path (StepRunner) agrees on the step with every rank, and the step
//      worker runs this rank's batch (or the dummy batch if it has none while another rank has
//      work) and samples it;
//   4. process outputs: detokenize, stop checks, stage on each request's stream, which reaches
//      the HTTP thread (and wakes it) once the next step is launched or before the engine
//      thread waits for the worker;
//   5. output return (llm_engine_dp.cpp): the other ranks send their requests' output to rank 0,
//      which feeds the HTTP streams and the metrics.
// With the overlapped scheduler (on by default) the step worker is a thread of its own: phase 3
// queues step N+1 and phases 4, 5 and the next 1, 2 work on step N's outputs while N+1 computes.
// Tokens step N has not sampled yet enter N+1's input as FutureMap placeholders. A request that
// stops in step N has one more token computed in N+1, which is discarded. With
// --num-scheduler-steps N a decode-only batch runs N steps per launch (multi-step), its
// outputs processed as each step ends.
// HTTP threads hand requests in with submit() (on rank 0) and read their output from the
// returned RequestStream. A failed or silent rank fails every engine (the collectives'
// watchdog): their requests end with an error and alive() turns false.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/thread_pool.h"
#include "dist/coordinator.h"
#include "engine/block_pool.h"
#include "engine/engine_metrics.h"
#include "engine/future_map.h"
#include "engine/kv_dtype.h"
#include "engine/output_text.h"
#include "engine/paged_kv_cache.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "engine/step_runner.h"
#include "engine/step_worker.h"
#include "engine/stream_waker.h"
#include "model/model.h"
#include "moe/dispatcher.h"
#include "text/tokenizer.h"

namespace duet {

struct EngineConfig {
  SchedulerConfig scheduler;
  int64_t block_size = 16;    // positions per KV block
  double kv_cache_gib = 2.0;  // KV pool size; pages are touched only when used
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;  // of the KV rows; auto: the weights'
  // The overlapped scheduler: steps run on a worker thread while the engine thread processes the
  // previous step's outputs and schedules the next (--disable-overlap-schedule: false).
  bool overlap_schedule = true;
  // Overlapped on one rank with a pool of 2 threads or more: the engine thread computes the
  // step's pool jobs while it waits for the step, in place of one of the pool's workers (parked
  // meanwhile). Off: the engine thread sleeps in the wait (kept for measuring the difference).
  bool engine_thread_computes = true;
  // Multi-step (--num-scheduler-steps): decode steps a decode-only batch runs per launch, >= 1.
  int64_t num_scheduler_steps = 1;
  // --stream-interval (SGLang's): a request's tokens reach its stream in batches of this many
  // (the first token and the finish at once), >= 1. Fewer hand-overs and HTTP writes per token.
  int64_t stream_interval = 1;
  // Tests only: called on the step worker before each launched job (StepWorker::BeforeJob).
  StepWorker::BeforeJob before_step;
  // Tests only: called on the engine thread right after each launch, with the job's number.
  std::function<void(uint64_t job)> after_launch;
};

class LlmEngine {
 public:
  // model, pool, tokenizer (may be null: no text, no stop strings) and the group's coordinator
  // (StepGroup; none: a single rank) must outlive the engine. Every rank of a group uses the same
  // EngineConfig. Throws duet::Error on a bad config or a pool too small for one block. Starts the
  // loop thread.
  LlmEngine(const Model& model, ThreadPool& pool, const Tokenizer* tokenizer,
            const EngineConfig& config, const StepGroup& group = {});
  // Stops the loop (in a group: rank 0's stops every rank's); unfinished requests finish with
  // reason "abort".
  ~LlmEngine();
  LlmEngine(const LlmEngine&) = delete;
  LlmEngine& operator=(const LlmEngine&) = delete;

  // Validates and queues a request; thread-safe. Throws duet::Error (a client error) for an
  // empty prompt, an id outside the vocabulary, max_tokens < 1, prompt + max_tokens beyond the
  // model's context or the whole KV pool, bad sampling parameters or an empty stop string.
  // Returns nullptr when the engine loop has died. In a group, only rank 0 takes requests.
  std::shared_ptr<RequestStream> submit(EngineRequest req);

  // Blocks until the loop has ended (a group's other ranks: until rank 0 stops or the group
  // fails). Returns the error that ended it, empty after a clean stop.
  std::string wait_stopped();

  bool alive() const { return alive_.load(); }
  int64_t max_model_len() const { return max_model_len_; }
  // Positions one request may use: the model's context, or less if the KV pool is smaller.
  int64_t max_request_len() const {
    return std::min(max_model_len_, blocks_.n_blocks() * blocks_.shape().block_size);
  }
  const EngineMetrics& metrics() const { return metrics_; }
  // The element type of the KV blocks (EngineConfig::kv_cache_dtype resolved for the model).
  DType kv_dtype() const { return blocks_.shape().dtype; }

 private:
  // Engine-thread state of one request.
  struct Live {
    std::unique_ptr<Sequence> seq;
    std::shared_ptr<RequestStream> stream;
    EngineRequest req;  // stop_ids include eos unless ignore_eos
    Sampler sampler;
    std::unique_ptr<IncrementalDecoder> decoder;  // null without a tokenizer
    OutputText text;                              // decoded text, stop strings applied
    Clock::time_point arrival;
    Clock::time_point last_token;
  };

  // A new request's engine state; stop_ids must already include eos where it applies.
  std::unique_ptr<Live> make_live(EngineRequest req, uint64_t id);
  // The loop thread's body: steps until rank 0 says stop, then marks the engine stopped.
  void run();
  // One step of the group (the five phases above); false once rank 0 said stop. `load` is every
  // rank's running + waiting requests as of the last step (rank 0 hands out requests by it).
  bool step(std::vector<int64_t>& load);
  // Schedule phase's input: this rank's batch for `plan`; counts the prompt tokens computed for
  // the first time and whether any chunk processes prompt tokens.
  ForwardInput build_input(const SchedulerStep& plan, uint64_t* prompt_tokens, bool* has_prefill);
  // Launch phase: appends a placeholder per sampled row and step to its sequence, and queues the
  // step (with a snapshot of its KV tables) on the worker.
  void launch(const SchedulerStep& plan, const StepPlan& step_plan, ForwardInput in);
  // Process-outputs phase for one step's output (of the oldest launched job): puts the sampled
  // tokens in place of their placeholders and emits them; returns how many were emitted.
  uint64_t process_outputs(const StepOutput& out);

  // Data-parallel group (llm_engine_dp.cpp).
  struct Remote {  // rank 0: a request running on another rank
    std::shared_ptr<RequestStream> stream;
    Clock::time_point arrival;
    Clock::time_point last_token;
    int64_t n_generated = 0;
    int rank = 0;
  };
  // Control plane, every rank: rank 0 waits for work, makes the step's control message and
  // shares it; everyone acts on it. False if it says stop.
  bool exchange_control(const std::vector<int64_t>& load);
  // Rank 0: the step's control message (stop, new requests and their ranks, aborts).
  std::string make_control(const std::vector<int64_t>& load, bool stop);
  // Everyone: acts on rank 0's message (the others add their new requests and drop the
  // aborted ones); false if it says stop.
  bool apply_control(const std::string& msg);
  // Output return, every rank: the other ranks' output of their requests reaches rank 0, which
  // updates the metrics; every rank learns every rank's load.
  void exchange_outputs(std::vector<int64_t>& load, uint64_t prompt_tokens, uint64_t generated,
                        uint64_t preempted);
  // Other ranks: the output of their requests since the last step; rank 0 applies it.
  std::string take_outbox();
  void apply_outbox(const std::string& msg);
  // Emits `live`'s generated token number n_gen (from 1), already in seq.tokens; true when the
  // request finished.
  bool emit(Live& live, int32_t tok, int64_t n_gen);
  // Stages a token and its text on `live`'s stream, to reach the client at the next
  // flush_streams().
  void stage(Live& live, const std::string& text, int32_t tok);
  // Hands the staged output (tokens and finishes) to the HTTP threads; waker_ wakes them.
  void flush_streams();
  // Frees the retired requests no step in flight can refer to any more.
  void free_retired();
  // Ends a request: its stream finishes, its KV blocks return to the pool, and its state moves to
  // retired_ until no step in flight can refer to its Sequence.
  // `error`, if any, reaches the client as the request's error (HTTP 503 body or stream event).
  void finish(uint64_t id, const std::string& reason, const std::string& tail = "",
              const std::string& error = "");
  void reap_aborted();
  void fail_all(const std::string& error);
  void publish_state();

  const Model& model_;
  ThreadPool& pool_;
  // EngineConfig::engine_thread_computes, where it applies: the engine thread takes the place of
  // one of the pool's workers (parked) whenever it waits for the step in flight, so the step's
  // compute threads and the engine thread together never outnumber the pool's threads. (With
  // several ranks the engine thread also waits on the control plane, which would leave the
  // parked worker's core idle: there the worker stays.)
  const bool helps_pool_;
  const Tokenizer* tokenizer_;
  const int64_t max_model_len_;
  BlockPool blocks_;
  PagedKvCache kv_;                                 // engine thread only
  Scheduler scheduler_;                             // engine thread only
  StepRunner steps_;         // agree_step: engine thread; execute: the worker (StepWorker)
  FutureMap future_;         // alloc: engine thread; store, resolve: the worker
  StepWorker worker_;        // launch, wait: engine thread
  EngineMetrics metrics_;                           // internally locked
  std::map<uint64_t, std::unique_ptr<Live>> live_;  // engine thread only
  // Streams with output staged since the last flush_streams(). Engine thread only.
  std::vector<std::shared_ptr<RequestStream>> unflushed_;
  std::vector<std::shared_ptr<RequestStream>> to_wake_;  // flush_streams()' scratch
  StreamWaker waker_;  // wakes the HTTP threads of flushed streams
  // Finished requests' state, kept until every job launched before they finished has been
  // processed (a job in flight samples with their Sampler), with the count of jobs launched then.
  // Engine thread only.
  std::vector<std::pair<uint64_t, std::unique_ptr<Live>>> retired_;
  // The launched jobs whose outputs are not all processed, oldest first: each sampled row's
  // request and the index in its tokens of its first placeholder. Engine thread only.
  struct RowRef {
    uint64_t id = 0;
    size_t index = 0;
  };
  struct Launched {
    std::vector<RowRef> rows;
  };
  std::deque<Launched> launched_;
  uint64_t n_launched_ = 0;   // jobs launched; engine thread only
  uint64_t n_processed_ = 0;  // jobs whose every output was processed; engine thread only
  const int64_t num_scheduler_steps_;
  const std::function<void(uint64_t job)> after_launch_;          // EngineConfig::after_launch
  const int64_t stream_interval_;                                 // EngineConfig::stream_interval
  std::map<uint64_t, Remote> remote_;                             // rank 0, engine thread only
  std::map<uint64_t, std::shared_ptr<RequestStream>> forwarded_;  // other ranks: output to send
  std::string stop_error_;                                        // GUARDED_BY(inbox_mu_)
  bool stopped_ = false;  // GUARDED_BY(inbox_mu_): the loop has ended
  std::condition_variable stopped_cv_;

  std::atomic<uint64_t> next_id_{1};
  std::atomic<bool> alive_{true};
  std::mutex inbox_mu_;
  std::condition_variable inbox_cv_;
  std::vector<std::unique_ptr<Live>> inbox_;  // GUARDED_BY(inbox_mu_)
  bool stop_ = false;                         // GUARDED_BY(inbox_mu_)
  std::thread thread_;                        // last: starts after everything above exists
};

}  // namespace duet
