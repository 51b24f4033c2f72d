// What a forward pass reads and writes: the batch description (ForwardInput), the KV store it
// attends over, and the per-micro-batch state that the operations pass along (ForwardState).
// A forward pass is a list of named Operations with yield markers; an executor (engine/) runs
// the list plainly or interleaves two micro-batches' lists at the yields.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "moe/dispatcher.h"
#include "moe/experts.h"

namespace duet {

// The tokens [first, first + n_tokens) of a batch belong to sequence seq_id and sit at positions
// n_past, n_past + 1, ...
struct SeqSpan {
  int32_t seq_id = 0;
  int64_t n_past = 0;
  int64_t first = 0;
  int64_t n_tokens = 0;
};

struct ForwardInput {
  std::vector<int32_t> tokens;    // [n_tokens]
  std::vector<int64_t> pos;       // [n_tokens]
  std::vector<int32_t> span_of;   // [n_tokens] index into spans
  std::vector<SeqSpan> spans;
  std::vector<int64_t> out_rows;  // token indices whose logits are computed, in output order

  int64_t n_tokens() const { return static_cast<int64_t>(tokens.size()); }
  // Appends n tokens of seq_id continuing after n_past cached positions. Logits are produced for
  // every one of them if all_logits, else for the last one only.
  void add(int32_t seq_id, int64_t n_past, const int32_t* toks, int64_t n, bool all_logits);
};

// The k and v rows of consecutive positions [pos, pos + n) of one sequence and layer, which the
// store keeps at fixed strides (in elements of the store's dtype): row i at k + i * k_stride.
struct KvRows {
  const void* k = nullptr;
  const void* v = nullptr;  // nullptr when v_width is 0 (MLA)
  int64_t k_stride = 0;
  int64_t v_stride = 0;
  int64_t n = 0;
};

// Per-layer KV rows of each sequence, kept in one element type: f32, or bf16 (half the bytes to
// hold and to read; attention widens them as it loads). Rows for every position in a batch must
// exist (the engine reserves them) before the forward pass starts; the model writes the new
// positions' rows through store_k / store_v.
class KvStore {
 public:
  virtual ~KvStore() = default;
  // The rows' element type: DType::kF32 or DType::kBF16.
  virtual DType dtype() const = 0;
  // [k_width] row of (seq_id, layer il, pos) in dtype(): GQA keys of all KV heads, or MLA's
  // latent.
  virtual void* k(int32_t seq_id, int64_t il, int64_t pos) = 0;
  // [v_width] row in dtype(); unused (width 0) for MLA.
  virtual void* v(int32_t seq_id, int64_t il, int64_t pos) = 0;
  // The rows of positions [pos, pos + n) for the largest n <= n_max (n >= 1, n_max >= 1) that
  // the store keeps at one stride: attention walks the cache a run at a time, not a call per
  // position. This default hands out one position per call.
  virtual KvRows rows(int32_t seq_id, int64_t il, int64_t pos, int64_t n_max) {
    (void)n_max;
    return KvRows{k(seq_id, il, pos), v(seq_id, il, pos), 0, 0, 1};
  }

  // The first n elements of the k / v row of (seq_id, il, pos) = src[0, n) (f32), converted to
  // dtype(): bf16 rounds to nearest even (f32_to_bf16), f32 is copied.
  void store_k(int32_t seq_id, int64_t il, int64_t pos, const float* src, int64_t n);
  void store_v(int32_t seq_id, int64_t il, int64_t pos, const float* src, int64_t n);
};

// Wall seconds spent in each kind of operation, summed over layers and calls: the key is the
// operation's name without its layer prefix ("L3.attn" counts as "attn"), or the name of a part
// an operation times itself ("attn.qkv", SubOpTimer).
using OpSeconds = std::map<std::string, double>;

// State of one micro-batch while its operations run. Buffers are reused across steps.
struct ForwardState {
  const ForwardInput* in = nullptr;
  KvStore* kv = nullptr;
  Dispatcher* dispatcher = nullptr;
  ThreadPool* pool = nullptr;

  std::vector<float> x;             // [n_tokens, n_embd] residual stream
  std::vector<float> h;             // [n_tokens, n_embd] normed input of the current sublayer
  std::vector<float> attn_out;      // [n_tokens, n_head * v_dim] attention output before o_proj
  std::vector<float> q;             // [n_tokens, n_head * qk_dim]
  std::vector<float> kv_new;        // [n_tokens, ...] new K/V rows or MLA latents
  std::vector<float> scratch;       // architecture-specific temporaries
  std::vector<float> scratch2;
  std::vector<float> router_logits; // [n_tokens, n_expert]
  std::vector<int32_t> topk_ids;    // [n_tokens, n_expert_used]
  std::vector<float> topk_weights;  // [n_tokens, n_expert_used]
  std::vector<float> shared_out;    // [n_tokens, n_embd] shared experts' output
  ExpertBatch* expert_batch = nullptr;  // between dispatch_recv and combine_send
  MlpScratch mlp;
  std::vector<MatmulGroup> proj;    // projections that run as one pool job (attention's q/k/v)
  std::vector<float> logits;        // [out_rows, n_vocab]
  uint64_t expert_bytes_read = 0;   // weights of the routed experts run so far (benchmarks)
  OpSeconds* op_seconds = nullptr;  // set while a profiled step runs: parts of operations

  int64_t n_tokens() const { return in->n_tokens(); }
};

// Adds the wall time from here to the end of its scope (or to stop()) to
// (*state.op_seconds)[name] when the step is profiled; does nothing otherwise. For the parts of
// an operation: `bench latency --profile-ops` prints them under the operation's own line.
class SubOpTimer {
  using Clock = std::chrono::steady_clock;

 public:
  SubOpTimer(ForwardState& s, const char* name)
      : seconds_(s.op_seconds), name_(name), t0_(seconds_ ? Clock::now() : Clock::time_point{}) {}
  ~SubOpTimer() { stop(); }
  SubOpTimer(const SubOpTimer&) = delete;
  SubOpTimer& operator=(const SubOpTimer&) = delete;

  void stop() {
    if (!seconds_) return;
    (*seconds_)[name_] += std::chrono::duration<double>(Clock::now() - t0_).count();
    seconds_ = nullptr;
  }

 private:
  OpSeconds* seconds_;
  const char* name_;
  Clock::time_point t0_;
};

struct Operation {
  std::string name;                        // "L3.attn", "L3.dispatch_send", ...
  std::function<void(ForwardState&)> run;  // empty for a yield marker
  bool is_yield() const { return !run; }
};

}  // namespace duet
