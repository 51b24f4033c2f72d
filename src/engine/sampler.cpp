#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace duet {

int32_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return static_cast<int32_t>(best);
}

Sampler::Sampler(const SamplingParams& p) : p_(p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature))
    DUET_ERROR("temperature must be >= 0, got " << p.temperature);
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) DUET_ERROR("top_p must be in (0, 1], got " << p.top_p);
  if (p.top_k < -1) DUET_ERROR("top_k must be -1, 0 or positive, got " << p.top_k);
  rng_.seed(p.seed ? *p.seed : std::random_device{}());
}

namespace {

// Throws if a logit is NaN or infinite: argmax would return an arbitrary id and the sort's
// comparator would not be a strict weak ordering.
void check_finite(const float* logits, int64_t n_vocab) {
  for (int64_t i = 0; i < n_vocab; ++i) {
    if (!std::isfinite(logits[i])) {
      DUET_ERROR("the logits are not finite (" << logits[i] << " at token id " << i
                                               << "): no token can be sampled");
    }
  }
}

}  // namespace

int32_t Sampler::sample(const float* logits, int64_t n_vocab) {
  check_finite(logits, n_vocab);
  if (p_.temperature == 0.0f) return argmax(logits, n_vocab);
  cand_.resize(static_cast<size_t>(n_vocab));
  for (int64_t i = 0; i < n_vocab; ++i) cand_[i] = {logits[i] / p_.temperature, (int32_t)i};
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t n = cand_.size();
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < n) {
    n = static_cast<size_t>(p_.top_k);
    std::partial_sort(cand_.begin(), cand_.begin() + n, cand_.end(), by_logit);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // Softmax over the survivors (sorted descending, so cand_[0] is the max).
  const float max = cand_[0].first;
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    cand_[i].first = std::exp(cand_[i].first - max);
    sum += cand_[i].first;
  }
  // Top-p: the smallest prefix whose probability reaches p (at least one token).
  if (p_.top_p < 1.0f) {
    double cum = 0.0;
    size_t keep = 0;
    while (keep < n) {
      cum += cand_[keep].first / sum;
      ++keep;
      if (cum >= p_.top_p) break;
    }
    n = keep;
    sum = 0.0;
    for (size_t i = 0; i < n; ++i) sum += cand_[i].first;
  }
  const double r = std::uniform_real_distribution<double>(0.0, sum)(rng_);
  double acc = 0.0;
  for (size_t i = 0; i < n; ++i) {
    acc += cand_[i].first;
    if (r < acc) return cand_[i].second;
  }
  return cand_[n - 1].second;
}

}  // namespace duet
