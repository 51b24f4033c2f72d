#include "engine/generator.h"

#include <chrono>

#include "core/error.h"

namespace duet {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

Generator::Generator(const Model& model, ThreadPool& pool, KvCacheDtype kv_dtype)
    : model_(model),
      kv_(model.config().n_layer, model.kv_k_width(), model.kv_v_width(),
          resolve_kv_dtype(kv_dtype, model)),
      runner_(model, pool) {}

const std::vector<float>& Generator::forward(const ForwardInput& in) {
  for (const SeqSpan& span : in.spans) kv_.reserve(span.seq_id, span.n_past + span.n_tokens);
  return runner_.forward(in, kv_);
}

void validate_request(const GenerateRequest& r, const ModelConfig& c) {
  if (r.prompt.empty()) DUET_ERROR("the prompt is empty");
  for (int32_t id : r.prompt) {
    if (id < 0 || id >= c.n_vocab)
      DUET_ERROR("prompt token id " << id << " is outside the vocabulary [0, " << c.n_vocab << ")");
  }
  if (r.max_tokens < 0) DUET_ERROR("max_tokens must be >= 0, got " << r.max_tokens);
  const int64_t need = static_cast<int64_t>(r.prompt.size()) + r.max_tokens;
  if (need > c.max_position_embeddings) {
    DUET_ERROR("prompt (" << r.prompt.size() << " tokens) + max_tokens (" << r.max_tokens
                          << ") exceeds the model's context of " << c.max_position_embeddings
                          << " tokens");
  }
}

std::vector<GenerateResult> Generator::generate(const std::vector<GenerateRequest>& requests,
                                                GenerateStats* stats) {
  for (const GenerateRequest& r : requests) validate_request(r, model_.config());
  const int64_t n_vocab = model_.config().n_vocab;
  const size_t n_req = requests.size();
  std::vector<GenerateResult> results(n_req);
  std::vector<Sampler> samplers;
  ScopedSequences seq_ids(kv_);  // freed however generate() ends
  for (const GenerateRequest& r : requests) {
    samplers.emplace_back(r.sampling);
    seq_ids.add();
  }
  GenerateStats st;

  // Prefill: all prompts in one batch.
  auto t0 = std::chrono::steady_clock::now();
  ForwardInput in;
  for (size_t i = 0; i < n_req; ++i) {
    const GenerateRequest& r = requests[i];
    in.add(seq_ids[i], 0, r.prompt.data(), static_cast<int64_t>(r.prompt.size()),
           r.prompt_logits);
    st.prompt_tokens += static_cast<int64_t>(r.prompt.size());
  }
  const std::vector<float>* logits = &forward(in);
  std::vector<int32_t> last(n_req);
  std::vector<bool> live(n_req, false);
  int64_t row = 0;
  auto emit = [&](size_t i, const float* row_logits) {
    const GenerateRequest& r = requests[i];
    const int32_t tok = samplers[i].sample(row_logits, n_vocab);
    results[i].tokens.push_back(tok);
    ++st.generated_tokens;
    last[i] = tok;
    bool stop = false;
    for (int32_t s : r.stop_ids) stop |= s == tok;
    if (stop) {
      results[i].finish_reason = "stop";
      live[i] = false;
    } else if (static_cast<int64_t>(results[i].tokens.size()) >= r.max_tokens) {
      results[i].finish_reason = "length";
      live[i] = false;
    } else {
      live[i] = true;
    }
  };
  for (size_t i = 0; i < n_req; ++i) {
    const GenerateRequest& r = requests[i];
    const int64_t n_rows = r.prompt_logits ? static_cast<int64_t>(r.prompt.size()) : 1;
    if (r.prompt_logits) {
      results[i].prompt_logits.assign(logits->begin() + row * n_vocab,
                                      logits->begin() + (row + n_rows) * n_vocab);
    }
    const float* last_row = logits->data() + (row + n_rows - 1) * n_vocab;
    if (r.max_tokens == 0) {
      results[i].finish_reason = "length";
    } else {
      emit(i, last_row);
    }
    row += n_rows;
  }
  st.prefill_seconds = seconds_since(t0);

  // Decode: one token per live sequence per step.
  t0 = std::chrono::steady_clock::now();
  const uint64_t expert_bytes0 = runner_.expert_bytes_read();
  // Unset on every way out, so the runner never keeps a pointer to this call's stats.
  struct OpSecondsScope {
    ModelRunner& runner;
    ~OpSecondsScope() { runner.set_op_seconds(nullptr); }
  } op_seconds_scope{runner_};
  if (profile_ops_) runner_.set_op_seconds(&st.decode_op_seconds);
  const uint64_t kv_row_bytes = static_cast<uint64_t>(model_.config().n_layer) *
                                (model_.kv_k_width() + model_.kv_v_width()) *
                                dtype_size(kv_.dtype());
  for (;;) {
    ForwardInput step;
    std::vector<size_t> who;
    for (size_t i = 0; i < n_req; ++i) {
      if (!live[i]) continue;
      const int64_t n_past = static_cast<int64_t>(requests[i].prompt.size() +
                                                  results[i].tokens.size()) - 1;
      step.add(seq_ids[i], n_past, &last[i], 1, false);
      st.decode_kv_bytes += static_cast<uint64_t>(n_past + 1) * kv_row_bytes;
      who.push_back(i);
    }
    if (who.empty()) break;
    logits = &forward(step);
    ++st.decode_steps;
    for (size_t r = 0; r < who.size(); ++r) emit(who[r], logits->data() + r * n_vocab);
  }
  st.decode_seconds = seconds_since(t0);
  st.decode_expert_bytes = runner_.expert_bytes_read() - expert_bytes0;
  if (stats) *stats = st;
  return results;
}

}  // namespace duet
