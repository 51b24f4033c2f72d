// The serving engine: one thread that loops scheduler step → forward pass → sampling → stop
// checks → output to each request's stream, over a paged KV cache. HTTP threads hand requests
// in with submit() and read their output from the returned RequestStream.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/thread_pool.h"
#include "engine/block_pool.h"
#include "engine/engine_metrics.h"
#include "engine/model_runner.h"
#include "engine/output_text.h"
#include "engine/paged_kv_cache.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "model/model.h"
#include "model/tokenizer.h"

namespace duet {

struct EngineConfig {
  SchedulerConfig scheduler;
  int64_t block_size = 16;        // positions per KV block
  double kv_cache_gib = 2.0;      // KV pool size; pages are touched only when used
};

class LlmEngine {
 public:
  // model, pool and tokenizer (may be null: no text, no stop strings) must outlive the engine.
  // Throws duet::Error on a bad config or a pool too small for one block. Starts the loop thread.
  LlmEngine(const Model& model, ThreadPool& pool, const Tokenizer* tokenizer,
            const EngineConfig& config);
  // Stops the loop; unfinished requests finish with reason "abort".
  ~LlmEngine();
  LlmEngine(const LlmEngine&) = delete;
  LlmEngine& operator=(const LlmEngine&) = delete;

  // Validates and queues a request; thread-safe. Throws duet::Error (a client error) for an
  // empty prompt, an id outside the vocabulary, max_tokens < 1, prompt + max_tokens beyond the
  // model's context or the whole KV pool, bad sampling parameters or an empty stop string.
  // Returns nullptr when the engine loop has died.
  std::shared_ptr<RequestStream> submit(EngineRequest req);

  bool alive() const { return alive_.load(); }
  int64_t max_model_len() const { return max_model_len_; }
  // Positions one request may use: the model's context, or less if the KV pool is smaller.
  int64_t max_request_len() const {
    return std::min(max_model_len_, blocks_.n_blocks() * blocks_.shape().block_size);
  }
  const EngineMetrics& metrics() const { return metrics_; }

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

  void loop();
  // One scheduler step and forward pass; false when there was nothing to run.
  bool step();
  // Samples the next token of `live` from `logits` [n_vocab]; true when the request finished.
  bool emit(Live& live, const float* logits);
  void finish(uint64_t id, const std::string& reason, const std::string& tail = "");
  void reap_aborted();
  void fail_all(const std::string& error);
  void publish_state();

  const Model& model_;
  const Tokenizer* tokenizer_;
  const int64_t max_model_len_;
  BlockPool blocks_;
  PagedKvCache kv_;       // engine thread only
  Scheduler scheduler_;   // engine thread only
  ModelRunner runner_;    // engine thread only
  EngineMetrics metrics_; // internally locked
  std::map<uint64_t, std::unique_ptr<Live>> live_;  // engine thread only

  std::atomic<uint64_t> next_id_{1};
  std::atomic<bool> alive_{true};
  std::mutex inbox_mu_;
  std::condition_variable inbox_cv_;
  std::vector<std::unique_ptr<Live>> inbox_;  // GUARDED_BY(inbox_mu_)
  bool stop_ = false;                         // GUARDED_BY(inbox_mu_)
  std::thread thread_;                        // last: starts after everything above exists
};

}  // namespace duet
