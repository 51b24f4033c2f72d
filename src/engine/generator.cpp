#include "engine/generator.h"

#include <chrono>

#include "core/error.h"

namespace duet {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// "" if the request can run, else why not.
std::string problem_of(const GenerateRequest& r, const ModelConfig& c) {
  try {
    validate_request(r, c);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

Generator::Generator(const Model& model, ThreadPool& pool, KvCacheDtype kv_dtype,
                     const StepGroup& group)
    : model_(model),
      kv_(model.config().n_layer, model.kv_k_width(), model.kv_v_width(),
          resolve_kv_dtype(kv_dtype, model)),
      steps_(model, pool, group) {}

void Generator::reserve(const ForwardInput& in) {
  for (const SeqSpan& span : in.spans) kv_.reserve(span.seq_id, span.n_past + span.n_tokens);
}

const std::vector<float>& Generator::forward(const ForwardInput& in) {
  DUET_CHECK(steps_.solo(), "Generator::forward runs one rank's batch alone; use generate()");
  reserve(in);
  return steps_.runner().forward(in, kv_);
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

void Generator::validate_everywhere(const std::vector<GenerateRequest>& requests) {
  std::string problem;
  for (const GenerateRequest& r : requests) {
    if (problem.empty()) problem = problem_of(r, model_.config());
  }
  if (steps_.solo()) {
    if (!problem.empty()) DUET_ERROR(problem);
    return;
  }
  // Shared first, so that a bad request stops every rank, not only its own.
  const std::vector<int64_t> bad = steps_.coord().all_gather({problem.empty() ? 0 : 1});
  if (!problem.empty()) DUET_ERROR(problem);
  for (size_t r = 0; r < bad.size(); ++r) {
    if (bad[r]) DUET_ERROR("rank " << r << " rejected its requests");
  }
}

std::vector<GenerateResult> Generator::generate(const std::vector<GenerateRequest>& requests,
                                                GenerateStats* stats) {
  validate_everywhere(requests);
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
  std::vector<int32_t> last(n_req);
  std::vector<bool> live(n_req, false);
  // Samples request i's next token from its logits row; the request stays live unless it ended.
  const auto emit = [&](size_t i, const float* row_logits) {
    const GenerateRequest& r = requests[i];
    live[i] = false;
    int32_t tok = 0;
    try {
      tok = samplers[i].sample(row_logits, n_vocab);
    } catch (const Error& e) {  // this request only: the others go on
      results[i].finish_reason = "error";
      results[i].error = e.what();
      return;
    }
    results[i].tokens.push_back(tok);
    ++st.generated_tokens;
    last[i] = tok;
    bool stop = false;
    for (int32_t s : r.stop_ids) stop |= s == tok;
    if (stop) {
      results[i].finish_reason = "stop";
    } else if (static_cast<int64_t>(results[i].tokens.size()) >= r.max_tokens) {
      results[i].finish_reason = "length";
    } else {
      live[i] = true;
    }
  };

  // Step 0 prefills every prompt in one batch; each later step decodes one token per live
  // sequence. A rank whose requests have all finished offers an empty batch (the dummy).
  ForwardInput in;
  for (size_t i = 0; i < n_req; ++i) {
    const GenerateRequest& r = requests[i];
    in.add(seq_ids[i], 0, r.prompt.data(), static_cast<int64_t>(r.prompt.size()),
           r.prompt_logits);
    st.prompt_tokens += static_cast<int64_t>(r.prompt.size());
  }
  std::vector<size_t> who;  // decode steps: the request of each logits row
  ModelRunner& runner = steps_.runner();
  // Unset on every way out, so the runner never keeps a pointer to this call's stats.
  struct OpSecondsScope {
    ModelRunner& runner;
    ~OpSecondsScope() { runner.set_op_seconds(nullptr); }
  } op_seconds_scope{runner};
  const uint64_t kv_row_bytes = static_cast<uint64_t>(model_.config().n_layer) *
                                (model_.kv_k_width() + model_.kv_v_width()) *
                                dtype_size(kv_.dtype());
  uint64_t expert_bytes0 = 0;  // read when the first decode step starts
  steps_.idle();  // the time since the last call is not a step gap
  const StepStats steps0 = steps_.stats();
  for (bool prefill = true;; prefill = false) {
    reserve(in);
    const bool decoding = !prefill && in.n_tokens() > 0;
    runner.set_op_seconds(decoding && profile_ops_ ? &st.decode_op_seconds : nullptr);
    const Clock::time_point t0 = Clock::now();
    const double wait0 = runner.dispatch_wait_seconds();
    const double agree0 = steps_.stats().agree_seconds;
    const StepRunner::Launch step = steps_.run(in, kv_, prefill);
    if (!step.plan.runs()) break;
    if (step.logits && prefill) {
      int64_t row = 0;
      for (size_t i = 0; i < n_req; ++i) {
        const GenerateRequest& r = requests[i];
        const int64_t n_rows = r.prompt_logits ? static_cast<int64_t>(r.prompt.size()) : 1;
        const float* rows = step.logits->data() + row * n_vocab;
        if (r.prompt_logits) results[i].prompt_logits.assign(rows, rows + n_rows * n_vocab);
        if (r.max_tokens == 0) {
          results[i].finish_reason = "length";
        } else {
          emit(i, rows + (n_rows - 1) * n_vocab);
        }
        row += n_rows;
      }
    } else if (step.logits) {
      for (size_t r = 0; r < who.size(); ++r) emit(who[r], step.logits->data() + r * n_vocab);
    }
    const double s = seconds_since(t0);
    if (prefill) {
      st.prefill_seconds += s;
      st.prefill_comm_seconds += runner.dispatch_wait_seconds() - wait0;
      if (!steps_.solo()) st.prefill_comm_seconds += steps_.stats().agree_seconds - agree0;
      expert_bytes0 = runner.expert_bytes_read();
    } else if (decoding) {
      st.decode_seconds += s;
      st.decode_comm_seconds += runner.dispatch_wait_seconds() - wait0;
      if (!steps_.solo()) st.decode_comm_seconds += steps_.stats().agree_seconds - agree0;
      ++st.decode_steps;
      if (after_decode_step_) {
        after_decode_step_();
        steps_.idle();  // the measurement is no step gap
      }
    }
    ForwardInput next;
    who.clear();
    for (size_t i = 0; i < n_req; ++i) {
      if (!live[i]) continue;
      const int64_t n_past =
          static_cast<int64_t>(requests[i].prompt.size() + results[i].tokens.size()) - 1;
      next.add(seq_ids[i], n_past, &last[i], 1, false);
      st.decode_kv_bytes += static_cast<uint64_t>(n_past + 1) * kv_row_bytes;
      who.push_back(i);
    }
    in = std::move(next);
  }
  st.decode_expert_bytes = runner.expert_bytes_read() - expert_bytes0;
  st.steps = steps_.stats().steps - steps0.steps;
  st.dummy_steps = steps_.stats().dummy_steps - steps0.dummy_steps;
  st.micro_batch_steps = steps_.stats().micro_batch_steps - steps0.micro_batch_steps;
  if (!steps_.solo()) st.sync_seconds = steps_.stats().agree_seconds - steps0.agree_seconds;
  st.step_gap_seconds = steps_.stats().gap_seconds - steps0.gap_seconds;
  st.step_gaps = steps_.stats().gaps - steps0.gaps;
  st.forward_seconds = steps_.stats().forward_seconds - steps0.forward_seconds;
  if (stats) *stats = st;
  return results;
}

}  // namespace duet
