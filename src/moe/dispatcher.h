// The MoE dispatcher: moves routed tokens to the experts that own them and the experts' outputs
// back. Every transfer is split into a send half, which posts the transfer and returns at once,
// and a receive half, which waits for it, so that an executor can run other work (the other
// micro-batch, the shared experts) between the two halves. A dispatcher instance holds the
// buffers of one micro-batch; each micro-batch gets its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
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
  // [n_tokens, n_embd] f32 (the residual stream): by the time combine_recv returns, out[t] has
  // grown by Σ_k topk_weights[t, k] · expert_k(x[t]). Experts on this rank may add into it
  // directly while they run, so nothing else may touch it until combine_recv returns.
  float* out = nullptr;
};

// The rows this rank's experts must process, grouped by local expert, and where their outputs
// go. No row is copied to group it: each row's input is read where it already is (the caller's
// hidden states, the dispatcher's receive buffer). The experts reduce their outputs themselves:
// an output row grows by Σ weight · expert(input) over the rows naming it, so a token whose
// experts share a rank comes back as one weighted row, and a token of this rank's own gets its
// local experts' sum added straight into the caller's output.
struct ExpertBatch {
  int64_t first_expert = 0;       // global id of local expert 0
  int64_t n_local_expert = 0;
  int64_t n_embd = 0;
  std::vector<int64_t> offsets;   // [n_local_expert + 1]: rows of local expert e are
                                  // [offsets[e], offsets[e + 1])
  std::vector<const float*> x;    // [n_rows] each row's input, n_embd f32
  std::vector<float*> out;        // [n_rows] each row's output row, n_embd f32, added to
  std::vector<float*> clear;      // output rows whose contents are stale: zeroed before adding
  std::vector<float> weight;      // [n_rows] each row's weight in its output row's sum
  // Chunked combine (single-batch overlap): when chunk_ends is not empty, the local experts fall
  // in chunks, chunk c being experts [chunk_ends[c - 1], chunk_ends[c]) (from 0, to
  // n_local_expert), and `clear` lists row i's output row at i (or is empty: the dispatcher
  // zeroed what needed it). An expert runner that honours
  // chunks finishes the rows of one chunk after another (zeroing their clear rows first) and
  // calls chunk_done(c) as soon as chunk c's output rows are final, in order, so the dispatcher
  // sends them while the next chunk computes. One that does not leaves them all to combine_send.
  // When chunk_ready is set too, the inputs also arrive in these chunks: the runner calls
  // chunk_ready(c), in order, before it reads any input row of chunk c (it returns once they are
  // there), so the first chunks compute while the later ones travel. A runner must honour it.
  // The order in which the runner takes the local experts: empty for 0, 1, ..., n_local_expert
  // − 1; else a permutation of them, and chunk c is then the experts order[chunk_ends[c − 1]],
  // ..., order[chunk_ends[c] − 1] (a dispatcher runs the experts whose rows leave the rank
  // first, so that the combine leaves while the others compute).
  std::vector<int32_t> order;
  std::vector<int64_t> chunk_ends;
  std::function<void(int c)> chunk_done;
  std::function<void(int c)> chunk_ready;
  int64_t n_rows() const { return offsets.empty() ? 0 : offsets.back(); }
  // The local expert at position p of the run order.
  int64_t expert_at(int64_t p) const { return order.empty() ? p : order[p]; }
  // Sizes x, out and weight for the rows `offsets` counts.
  void resize_rows() {
    const size_t n = static_cast<size_t>(n_rows());
    x.resize(n), out.resize(n), weight.resize(n);
  }
};

class Dispatcher {
 public:
  virtual ~Dispatcher() = default;

  // Send half of dispatch: route each token's rows towards its experts.
  virtual void dispatch_send(const RoutedTokens& tokens) = 0;
  // Receive half: the rows for this rank's experts (valid until the next dispatch_send).
  virtual ExpertBatch& dispatch_recv() = 0;
  // Send half of combine: the batch's output rows are filled; send them back to their tokens'
  // owners.
  virtual void combine_send() = 0;
  // Receive half: completes tokens.out (see RoutedTokens::out).
  virtual void combine_recv() = 0;
  // Seconds the receive halves have waited for transfers so far (0 where nothing travels).
  virtual double wait_seconds() const { return 0; }
  // The shape of the group's next step, which every rank learns from the step's sync before
  // the forward pass: the most tokens any rank runs. Lets a distributed dispatcher choose its
  // algorithm for the step (all ranks choosing alike), and whether the step runs as two
  // micro-batches (each with its own dispatcher). Called between steps only.
  virtual void plan_step(int64_t max_tokens_per_rank, bool micro_batch = false) {
    (void)max_tokens_per_rank, (void)micro_batch;
  }
};

}  // namespace duet
