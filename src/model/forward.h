// What a forward pass reads and writes: the batch description (ForwardInput), the KV store it
// attends over, and the per-micro-batch state that the operations pass along (ForwardState).
// A forward pass is a list of Operations (a kind and a layer index each) with yield markers that
// end numbered stages; an executor (engine/) runs the list plainly or interleaves two
// micro-batches' lists at the yields. The model builds one list per forward mode
// (Model::operations), and check_operations() proves at build time that no operation overwrites
// a buffer a later one still reads (the contract of each kind is in forward.cpp).
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
#include "core/trace.h"
#include "kernels/rope.h"
#include "moe/dispatcher.h"
#include "moe/experts.h"

namespace duet {

// The kind of step a forward pass takes for the whole group of ranks: prefill as soon as any rank
// processes prompt tokens (prefill or mixed batches), decode when every token is a sequence's
// next one. Each mode has its own operation list (later: where its yields go).
enum class ForwardMode { kIdle, kDecode, kPrefill };
inline constexpr ForwardMode kForwardModes[] = {ForwardMode::kDecode, ForwardMode::kPrefill};

const char* forward_mode_name(ForwardMode mode);

// The tokens [first, first + n_tokens) of a batch belong to sequence seq_id and sit at positions
// n_past, n_past + 1, ...
struct SeqSpan {
  int32_t seq_id = 0;
  int64_t n_past = 0;
  int64_t first = 0;
  int64_t n_tokens = 0;
};

struct ForwardInput {
  // Which operation list runs: the group's agreed mode (prefill for any batch with prompt tokens).
  ForwardMode mode = ForwardMode::kPrefill;
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

  // Elements [offset, offset + n) of the k / v row of (seq_id, il, pos) = src[0, n) (f32),
  // converted to dtype(): bf16 rounds to nearest even (f32_to_bf16), f32 is copied. A KV head's
  // slice of a GQA row is offset head · head_dim.
  void store_k(int32_t seq_id, int64_t il, int64_t pos, const float* src, int64_t n,
               int64_t offset = 0);
  void store_v(int32_t seq_id, int64_t il, int64_t pos, const float* src, int64_t n,
               int64_t offset = 0);

 private:
  int64_t elem_bytes() const { return static_cast<int64_t>(dtype_size(dtype())); }
};

// Wall seconds spent in each kind of operation, summed over layers and calls: the key is the
// operation's name without its layer prefix ("L3.attn" counts as "attn"), or the name of a part
// an operation times itself ("attn.qkv", SubOpTimer).
using OpSeconds = std::map<std::string, double>;

// State of one micro-batch while its operations run. Buffers are reused across steps.
// Lifetimes: "across" buffers carry data from one operation to a later one, and the contract of
// each operation kind (forward.cpp) says which it reads and writes, so check_operations can prove
// a list safe; "within" buffers are temporaries of one operation, garbage once it returns.
struct ForwardState {
  const ForwardInput* in = nullptr;
  KvStore* kv = nullptr;
  Dispatcher* dispatcher = nullptr;
  ThreadPool* pool = nullptr;

  // Across: the residual stream, from embed to output. [n_tokens, n_embd]
  std::vector<float> x;
  // Across: the normed input of a MoE sublayer, from moe_route until combine_recv (the
  // dispatcher sends it, and the local one lets the experts read it in place). Within: the normed
  // input of attention, a dense MLP and the output head. [n_tokens, n_embd]
  std::vector<float> h;
  std::vector<float> attn_out;      // within attn: [n_tokens, n_head * v_dim] before o_proj
  std::vector<float> q;             // within attn: [n_tokens, n_head * qk_dim]
  std::vector<float> kv_new;        // within attn: [n_tokens, ...] new K/V rows or MLA latents
  std::vector<float> scratch;       // within one operation: architecture-specific temporaries
  std::vector<float> scratch2;      // within one operation
  std::vector<float> router_logits; // within moe_route: [n_tokens, n_expert]
  // Across, moe_route until combine_recv (the dispatcher reads them when it sends and combines):
  std::vector<int32_t> topk_ids;    // [n_tokens, n_expert_used]
  std::vector<float> topk_weights;  // [n_tokens, n_expert_used]
  // Across, shared_experts until combine_recv: the shared experts' output. [n_tokens, n_embd]
  std::vector<float> shared_out;
  ExpertBatch* expert_batch = nullptr;  // across, dispatch_recv until combine_send
  MlpScratch mlp;
  std::vector<MatmulGroup> proj;    // projections that run as one pool job (attention's q/k/v)
  RopeAngles rope_angles;           // across the step's layers: its tokens' rope angles
  std::vector<float> logits;        // across, output until the step's end: [out_rows, n_vocab]
  uint64_t expert_bytes_read = 0;   // weights of the routed experts run so far (benchmarks)
  OpSeconds* op_seconds = nullptr;  // set while a profiled step runs: parts of operations
  Trace* trace = nullptr;           // set with --trace-file: each operation becomes a span
  TraceTrack trace_track = TraceTrack::kMicroBatchA;  // this micro-batch's track

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


// What an operation does; its name (op_kind_name) is what profiles and traces print.
enum class OpKind {
  kEmbed,          // x = embedding rows of the tokens
  kAttn,           // x += attention(norm(x)); writes KV rows
  kMlp,            // x += dense MLP(norm(x))
  kMoeRoute,       // h = norm(x); top-k experts of each token
  kDispatchSend,   // posts h's rows to their experts' ranks (the send half)
  kSharedExperts,  // shared_out = shared experts(h)
  kDispatchRecv,   // waits for the rows this rank's experts process
  kExperts,        // runs the local experts on them
  kCombineSend,    // posts the experts' outputs back to their tokens' ranks
  kCombineRecv,    // waits for them; x += weighted outputs (+ shared_out)
  kOutput,         // logits of the requested rows
  kYield,          // a marker: the end of a stage, where an executor may switch micro-batches
};

const char* op_kind_name(OpKind kind);

// Where a MoE layer's shared experts run in its list (DeepSeek's; the other architectures have
// none, and their lists are the same under both).
enum class SharedExpertsAt {
  kDispatch,  // between dispatch_send and dispatch_recv: computed while the dispatch travels
  kCombine,   // between combine_send and combine_recv: while the combine travels (seed 000's
              // DBO schedule: "C₁ send, S₁, MLP₀, C₁ recv")
  kSerial,    // before dispatch_send: nothing computes while either transfer travels (the
              // baseline that every overlap is measured against)
  kExperts,   // inside the experts operation, one more expert of every token in its pool jobs
              // (one rank: no transfer to hide, and two fewer pool synchronisations a layer)
};
inline constexpr SharedExpertsAt kSharedExpertsAts[] = {
    SharedExpertsAt::kDispatch, SharedExpertsAt::kCombine, SharedExpertsAt::kSerial,
    SharedExpertsAt::kExperts};

struct Operation {
  OpKind kind = OpKind::kYield;
  int32_t il = -1;     // layer index; -1 for embed and output
  int32_t stage = -1;  // yields only: the stage this marker ends, 0, 1, ... in list order
  std::function<void(ForwardState&)> run;  // empty for a yield

  bool is_yield() const { return kind == OpKind::kYield; }
  std::string name() const;  // "L3.attn", "embed", "L3.yield1" (stage 1), for logs and traces
};

// Numbers the yields of `ops` in order (Operation::stage) and checks the list: every buffer an
// operation reads was written by the operation that kind expects (the same layer's), and no
// operation writes a buffer that an earlier one holds for a later one (the dispatcher reads h and
// writes into x asynchronously from dispatch_send until combine_recv). Throws duet::Error naming
// both operations and the buffer otherwise.
void check_operations(std::vector<Operation>& ops);

}  // namespace duet
