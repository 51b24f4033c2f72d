#include "engine/dp_generator.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "core/error.h"
#include "engine/sampler.h"

namespace duet {

namespace {

// "" if the request can run here, else why not.
std::string check_request(const GenerateRequest& r, const ModelConfig& c) {
  if (r.prompt_logits) return "prompt_logits is not supported with data parallelism";
  try {
    validate_request(r, c);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

DpGenerator::DpGenerator(const Model& model, ThreadPool& pool, Dispatcher& dispatcher,
                         Coordinator& coord, KvCacheDtype kv_dtype)
    : model_(model),
      dispatcher_(dispatcher),
      coord_(coord),
      kv_(model.config().n_layer, model.kv_k_width(), model.kv_v_width(),
          resolve_kv_dtype(kv_dtype, model)),
      runner_(model, pool, &dispatcher),
      dummy_seq_(kv_.add_sequence()) {
  const int32_t tok = 0;
  dummy_in_.add(dummy_seq_, 0, &tok, 1, false);
  dummy_in_.out_rows.clear();  // nobody reads its logits
}

std::vector<DpStepInfo> DpGenerator::sync(const DpStepInfo& mine) {
  const std::vector<int64_t> all = coord_.all_gather({mine.n_tokens, mine.has_prefill ? 1 : 0});
  std::vector<DpStepInfo> out(all.size() / 2);
  for (size_t r = 0; r < out.size(); ++r) out[r] = {all[2 * r], all[2 * r + 1] != 0};
  return out;
}

const std::vector<float>& DpGenerator::forward(const ForwardInput& in) {
  for (const SeqSpan& span : in.spans) kv_.reserve(span.seq_id, span.n_past + span.n_tokens);
  return runner_.forward(in, kv_);
}

void DpGenerator::run_dummy() {
  forward(dummy_in_);
}

std::vector<GenerateResult> DpGenerator::generate(const std::vector<GenerateRequest>& requests,
                                                  DpStats* stats) {
  // Validation is shared first, so that a bad request stops every rank, not only its own.
  std::string problem;
  for (const GenerateRequest& r : requests) {
    if (problem.empty()) problem = check_request(r, model_.config());
  }
  const std::vector<int64_t> bad = coord_.all_gather({problem.empty() ? 0 : 1});
  if (!problem.empty()) DUET_ERROR(problem);
  for (size_t r = 0; r < bad.size(); ++r) {
    if (bad[r]) DUET_ERROR("rank " << r << " rejected its requests");
  }

  const int64_t n_vocab = model_.config().n_vocab;
  const size_t n_req = requests.size();
  std::vector<GenerateResult> results(n_req);
  std::vector<Sampler> samplers;
  ScopedSequences seq_ids(kv_);  // freed however generate() ends
  for (const GenerateRequest& r : requests) {
    samplers.emplace_back(r.sampling);
    seq_ids.add();
  }

  // Step 0 prefills every prompt; later steps decode one token per live sequence.
  ForwardInput in;
  std::vector<size_t> who;  // the request of each logits row
  for (size_t i = 0; i < n_req; ++i) {
    const GenerateRequest& r = requests[i];
    in.add(seq_ids[i], 0, r.prompt.data(), static_cast<int64_t>(r.prompt.size()), false);
    if (r.max_tokens > 0)
      who.push_back(i);
    else
      results[i].finish_reason = "length";
  }
  // Requests with max_tokens 0 still prefill (their KV rows are written), but sample nothing.
  std::vector<size_t> row_of(n_req);
  for (size_t i = 0; i < n_req; ++i) row_of[i] = i;
  bool prefill = true;
  DpStats st;
  for (const GenerateRequest& r : requests)
    st.prompt_tokens += static_cast<int64_t>(r.prompt.size());
  using Clock = std::chrono::steady_clock;
  const auto since = [](Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  for (;;) {
    const bool decoding = !prefill && in.n_tokens() > 0;
    const Clock::time_point t_sync = Clock::now();
    const double wait0 = dispatcher_.wait_seconds();
    const std::vector<DpStepInfo> all = sync({in.n_tokens(), prefill && in.n_tokens() > 0});
    const double sync_s = since(t_sync);
    st.sync_seconds += sync_s;
    int64_t total = 0, most = 1;  // an idle rank runs the one-token dummy batch
    for (const DpStepInfo& s : all) total += s.n_tokens, most = std::max(most, s.n_tokens);
    if (total == 0) break;
    dispatcher_.plan_step(most);
    ++st.steps;
    std::vector<size_t> next_who;
    ForwardInput next;
    if (in.n_tokens() == 0) {
      run_dummy();
      ++st.dummy_steps;
    } else {
      const std::vector<float>& logits = forward(in);
      for (size_t w = 0; w < who.size(); ++w) {
        const size_t i = who[w];
        const GenerateRequest& r = requests[i];
        const size_t row = prefill ? row_of[i] : w;
        const int32_t tok = samplers[i].sample(logits.data() + row * n_vocab, n_vocab);
        results[i].tokens.push_back(tok);
        bool stop = false;
        for (int32_t s : r.stop_ids) stop |= s == tok;
        if (stop) {
          results[i].finish_reason = "stop";
        } else if (static_cast<int64_t>(results[i].tokens.size()) >= r.max_tokens) {
          results[i].finish_reason = "length";
        } else {
          const int64_t n_past =
              static_cast<int64_t>(r.prompt.size() + results[i].tokens.size()) - 1;
          next.add(seq_ids[i], n_past, &results[i].tokens.back(), 1, false);
          next_who.push_back(i);
        }
      }
    }
    if (prefill) {
      st.prefill_seconds += since(t_sync);
    } else if (decoding) {
      st.decode_seconds += since(t_sync);
      st.decode_comm_seconds += sync_s + dispatcher_.wait_seconds() - wait0;
      ++st.decode_steps;
    }
    in = std::move(next);
    who = std::move(next_who);
    prefill = false;
  }
  for (const GenerateResult& r : results)
    st.generated_tokens += static_cast<int64_t>(r.tokens.size());
  if (stats) *stats = st;
  return results;
}

}  // namespace duet
