// One serving request as the engine sees it: its tokens and progress (Sequence, owned by the
// engine thread) and the channel its output travels to the HTTP thread on (RequestStream,
// shared by both).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/sampler.h"

namespace duet {

using Clock = std::chrono::steady_clock;

// What a client asks for, already tokenised.
struct EngineRequest {
  std::vector<int32_t> prompt;         // token ids, not empty
  int64_t max_tokens = 16;             // >= 1
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;       // extra stop token ids (eos is added unless ignore_eos)
  std::vector<std::string> stop;       // stop strings, excluded from the output text
  bool ignore_eos = false;
};

// Output gathered since the HTTP thread last took it.
struct StreamDelta {
  std::string text;              // valid UTF-8, never a broken character
  std::vector<int32_t> tokens;   // generated ids (including a final stop token)
  bool finished = false;
  std::string finish_reason;     // "stop", "length" or "abort" once finished
  std::string error;             // set when the engine failed this request
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;  // total so far
};

// The channel from the engine thread (writer) to one HTTP thread (reader).
class RequestStream {
 public:
  RequestStream(uint64_t id, int64_t prompt_tokens) : id_(id) {
    pending_.prompt_tokens = prompt_tokens;
  }
  uint64_t id() const { return id_; }

  // Engine side: appends one generated token and the text it completes (maybe empty); wakes
  // the reader.
  void push(const std::string& text, int32_t token);
  // Engine side: the last text (held back until now) and why the request ended. Only the first
  // call counts.
  void finish(const std::string& reason, const std::string& text = "",
              const std::string& error = "");

  // Engine side, in two halves: stage() and stage_finish() gather output that the reader does
  // not see yet, without a lock or a wake-up; flush() hands all of it over at once, and the
  // reader is woken once for it (by flush() itself, or by a StreamWaker). Waking a thread costs
  // a system call and often the waker's core, so the engine thread stages while it processes a
  // step's outputs and flushes once the next step is launched. Only the engine thread stages
  // and flushes; a finish then comes after every staged token. stage() and stage_finish()
  // return true when the stream had nothing staged (the caller then lists it to flush).
  bool stage(const std::string& text, int32_t token);
  bool stage_finish(const std::string& reason, const std::string& text = "",
                    const std::string& error = "");
  // Hands the staged output to the reader and, if `wake`, wakes it (else wake() must follow);
  // false if nothing was staged.
  bool flush(bool wake = true);
  // Whether the staged output should reach the reader now under a stream interval of `interval`
  // tokens (SGLang's --stream-interval): at least that many tokens, the first token of the
  // request (its time to first token), or the finish. Engine thread only.
  bool due(int64_t interval) const {
    return staged_.finished || static_cast<int64_t>(staged_.tokens.size()) >= interval ||
           (!staged_.tokens.empty() && n_flushed_tokens_ == 0);
  }
  // Wakes the reader (after flush(false); any thread).
  void wake() { cv_.notify_all(); }
  // For a waker thread (StreamWaker): marks a wake-up as queued; false if one already was (its
  // wake-up will hand over this output too). The waker clears it (wake_taken()) just before
  // it wakes the reader.
  bool queue_wake() { return !wake_queued_.exchange(true, std::memory_order_acq_rel); }
  void wake_taken() { wake_queued_.store(false, std::memory_order_release); }

  // Reader side: waits until there is output or the stream finished, at most `timeout`.
  // Returns what arrived since the last call (empty and unfinished on timeout).
  StreamDelta wait(std::chrono::milliseconds timeout);

  // Reader side: asks the engine to drop the request (client gone). The engine frees its blocks
  // at its next step.
  void abort() { aborted_.store(true, std::memory_order_relaxed); }
  bool aborted() const { return aborted_.load(std::memory_order_relaxed); }

 private:
  const uint64_t id_;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> wake_queued_{false};  // queue_wake(), wake_taken()
  std::mutex mu_;
  std::condition_variable cv_;
  StreamDelta pending_;  // GUARDED_BY(mu_)
  bool taken_final_ = false;  // GUARDED_BY(mu_): the finished delta was handed out
  // Output staged and not flushed yet: engine thread only.
  struct Staged {
    std::string text;
    std::vector<int32_t> tokens;
    bool finished = false;
    std::string reason, final_text, error;
    bool empty() const { return tokens.empty() && text.empty() && !finished; }
  };
  Staged staged_;
  int64_t n_flushed_tokens_ = 0;  // engine thread only: tokens handed over so far
};

enum class SeqStatus { kWaiting, kRunning, kFinished };

// A request inside the engine. Owned and touched only by the engine thread (and by tests).
struct Sequence {
  uint64_t id = 0;              // arrival order: smaller is older
  std::vector<int32_t> tokens;  // prompt, then generated ids
  int64_t n_prompt = 0;
  int64_t n_computed = 0;       // positions whose KV rows are written (0 after preemption)
  int64_t max_tokens = 0;
  int32_t kv_seq = -1;          // PagedKvCache sequence while it holds blocks, else -1
  SeqStatus status = SeqStatus::kWaiting;
  int64_t n_preempted = 0;
  int64_t n_prompt_counted = 0;  // prompt positions counted in the metrics (never recounted)

  int64_t n_generated() const { return static_cast<int64_t>(tokens.size()) - n_prompt; }
  // Tokens whose KV rows are still to be computed; the last of them yields the next token.
  int64_t n_uncomputed() const { return static_cast<int64_t>(tokens.size()) - n_computed; }
  bool in_prefill() const { return n_uncomputed() > 1; }
};

}  // namespace duet
