#include "engine/step_worker.h"

#include <algorithm>

#include "core/affinity.h"
#include "core/error.h"

namespace duet {

namespace {

// Multi-step: the batch's next decode step. Every span is one token whose logits were sampled;
// its sampled token is the next input, one position further on.
void advance(ForwardInput& in, const std::vector<int32_t>& sampled) {
  for (size_t i = 0; i < in.spans.size(); ++i) {
    SeqSpan& span = in.spans[i];
    ++span.n_past;
    const size_t t = static_cast<size_t>(span.first);
    ++in.pos[t];
    // A row whose sampling failed keeps computing a harmless token; its request has ended.
    in.tokens[t] = sampled[i] >= 0 ? sampled[i] : 0;
  }
}

}  // namespace

StepWorker::StepWorker(StepRunner& steps, FutureMap& future, ThreadPool& pool, int64_t n_vocab,
                       bool overlapped, BeforeJob before_job)
    : steps_(steps),
      future_(future),
      pool_(pool),
      n_vocab_(n_vocab),
      overlapped_(overlapped),
      before_job_(std::move(before_job)) {
  if (!overlapped_) return;
  thread_ = std::thread([this] {
    name_this_thread("duet-step");
    loop();
  });
}

StepWorker::~StepWorker() {
  if (!overlapped_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t StepWorker::launch(StepJob job) {
  DUET_CHECK(job.plan.runs() && job.n_steps >= 1, "launch of a step that does not run");
  DUET_CHECK(job.samplers.size() == job.in.out_rows.size() &&
                 job.placeholders.size() == job.samplers.size() * static_cast<size_t>(job.n_steps),
             "step job with " << job.samplers.size() << " samplers, " << job.in.out_rows.size()
                              << " rows and " << job.placeholders.size() << " placeholders");
  const uint64_t id = n_launched_.fetch_add(1) + 1;
  n_expected_ += static_cast<uint64_t>(job.n_steps);
  if (!overlapped_) {
    try {
      run_job(job, id);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
      failed_.store(true, std::memory_order_release);
    }
    return id;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.emplace_back(id, std::move(job));
  }
  cv_.notify_all();
  return id;
}

StepOutput StepWorker::wait() {
  DUET_CHECK(n_taken_ < n_expected_, "wait() with no step launched");
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !outputs_.empty() || error_; });
  if (outputs_.empty()) std::rethrow_exception(error_);
  StepOutput out = std::move(outputs_.front());
  outputs_.pop_front();
  ++n_taken_;
  return out;
}

void StepWorker::post(StepOutput out) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    outputs_.push_back(std::move(out));
    n_posted_.fetch_add(1);  // seq_cst: ThreadPool::wake_helpers
  }
  cv_.notify_all();
  pool_.wake_helpers();  // an engine thread helping the pool while it waits for this
}

void StepWorker::loop() {
  for (;;) {
    std::pair<uint64_t, StepJob> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stop_
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    try {
      run_job(job.second, job.first);
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        error_ = std::current_exception();
        failed_.store(true);
        jobs_.clear();  // the group has failed: nothing after this step can run
      }
      cv_.notify_all();
      pool_.wake_helpers();
      return;
    }
  }
}

void StepWorker::run_job(StepJob& job, uint64_t id) {
  if (before_job_) before_job_(id, *this);
  const size_t n_rows = job.samplers.size();
  for (int64_t k = 0; k < job.n_steps; ++k) {
    // Tokens sampled by earlier steps (only in the first step of a job: later ones take them
    // from the step before, in advance()).
    if (k == 0) future_.resolve(job.in.tokens.data(), job.in.n_tokens());
    const StepRunner::Launch launch = steps_.execute(job.plan, job.in, *job.kv);
    StepOutput out;
    out.job = id;
    out.step = k;
    out.last = k + 1 == job.n_steps;
    out.tokens.assign(n_rows, -1);
    out.errors.resize(n_rows);
    // The rows over the pool (each has a sampler of its own, and a slot of the future map).
    const auto sample_rows = [&](int64_t begin, int64_t end) {
      for (size_t r = size_t(begin); r < size_t(end); ++r) {
        const float* logits = launch.logits->data() + static_cast<int64_t>(r) * n_vocab_;
        try {
          out.tokens[r] = job.samplers[r]->sample(logits, n_vocab_);
        } catch (const Error& e) {  // this request ends with the error; the others go on
          out.errors[r] = e.what();
        }
        // A failed row's placeholder still resolves (to token 0): its request has ended, and a
        // step already scheduled with it computes a token that is discarded.
        future_.store(job.placeholders[static_cast<size_t>(k) * n_rows + r],
                      out.tokens[r] >= 0 ? out.tokens[r] : 0);
      }
    };
    pool_.parallel_for(static_cast<int64_t>(n_rows), sample_rows,
                       std::max<int64_t>(1, kMinLogitsPerTask / n_vocab_));
    out.stats = steps_.execute_stats();
    if (!out.last) advance(job.in, out.tokens);
    post(std::move(out));
  }
}

}  // namespace duet
