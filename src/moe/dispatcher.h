// The MoE dispatcher: moves routed tokens to the experts that own them and the experts' outputs
// back. Every transfer is split into a send half, which posts the transfer and returns at once,
// and a receive half, which waits for it, so that an executor can run other work (the other
// micro-batch, the shared experts) between the two halves. A dispatcher instance holds the
// buffers of one micro-batch; each micro-batch gets its own.
#pragma once

#include <cstdint>
#include <vector>

namespace duet {

// One micro-batch's routed tokens, as the MoE layer hands them to dispatch_send. The pointers
// must stay valid until combine_recv returns.
struct RoutedTokens {
  const float* x = nullptr;             // [n_tokens, n_embd] f32, the normed hidden states
  const int32_t* topk_ids = nullptr;    // [n_tokens, n_expert_used] global expert ids
  const float* topk_weights = nullptr;  // [n_tokens, n_expert_used] f32
  int64_t n_tokens = 0;
  int64_t n_embd = 0;
  int64_t n_expert_used = 0;
};

// The rows this rank's experts must process, grouped by local expert.
struct ExpertBatch {
  int64_t first_expert = 0;       // global id of local expert 0
  int64_t n_local_expert = 0;
  int64_t n_embd = 0;
  std::vector<int64_t> offsets;   // [n_local_expert + 1]: rows of local expert e are
                                  // [offsets[e], offsets[e + 1])
  std::vector<float> x;           // [n_rows, n_embd] f32 inputs
  std::vector<float> y;           // [n_rows, n_embd] f32 outputs, written by the experts
  int64_t n_rows() const { return offsets.empty() ? 0 : offsets.back(); }
};

class Dispatcher {
 public:
  virtual ~Dispatcher() = default;

  // Send half of dispatch: route each token's rows towards its experts.
  virtual void dispatch_send(const RoutedTokens& tokens) = 0;
  // Receive half: the rows for this rank's experts (valid until the next dispatch_send).
  virtual ExpertBatch& dispatch_recv() = 0;
  // Send half of combine: batch.y is filled; send each row back to its token's owner.
  virtual void combine_send() = 0;
  // Receive half: out[t] += Σ_k topk_weights[t, k] · y(t, k) for every token t of the
  // micro-batch. out: [n_tokens, n_embd] f32.
  virtual void combine_recv(float* out) = 0;
  // Seconds the receive halves have waited for transfers so far (0 where nothing travels).
  virtual double wait_seconds() const { return 0; }
  // The shape of the group's next step, which every rank learns from the step's sync before
  // the forward pass: the most tokens any rank runs. Lets a distributed dispatcher choose its
  // algorithm for the step (all ranks choosing alike). Called between steps only.
  virtual void plan_step(int64_t max_tokens_per_rank) { (void)max_tokens_per_rank; }
};

}  // namespace duet
