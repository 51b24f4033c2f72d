#include "engine/logit_divergence.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace duet {

namespace {

// log p = logits - (max + log sum exp(logits - max)), into `out` [n_vocab]; returns the argmax.
int64_t log_softmax(const float* logits, int64_t n_vocab, const char* which,
                    std::vector<float>& out) {
  int64_t top = 0;
  for (int64_t i = 0; i < n_vocab; ++i) {
    if (!std::isfinite(logits[i])) DUET_ERROR(which << " logit of id " << i << " is not finite");
    if (logits[i] > logits[top]) top = i;
  }
  const float max = logits[top];
  double sum = 0;
  for (int64_t i = 0; i < n_vocab; ++i) sum += std::exp(logits[i] - max);
  const float log_z = max + static_cast<float>(std::log(sum));
  out.resize(static_cast<size_t>(n_vocab));
  for (int64_t i = 0; i < n_vocab; ++i) out[static_cast<size_t>(i)] = logits[i] - log_z;
  return top;
}

}  // namespace

TokenDivergence token_divergence(const float* ref, const float* other, int64_t n_vocab) {
  DUET_CHECK(n_vocab > 0, "n_vocab " << n_vocab);
  thread_local std::vector<float> lp, lq;
  TokenDivergence d;
  const int64_t top_p = log_softmax(ref, n_vocab, "reference", lp);
  const int64_t top_q = log_softmax(other, n_vocab, "compared", lq);
  double kl = 0, entropy = 0;
  for (size_t i = 0; i < lp.size(); ++i) {
    const double p = std::exp(lp[i]);
    kl += p * double(lp[i] - lq[i]);
    entropy -= p * double(lp[i]);
  }
  d.kl = std::max(kl, 0.0);
  d.same_top = top_p == top_q;
  d.ref_entropy = std::max(entropy, 0.0);
  d.ref_top_prob = std::exp(double(lp[static_cast<size_t>(top_p)]));
  return d;
}

void DivergenceStats::add(const TokenDivergence& d) {
  kl_.push_back(d.kl);
  same_top_ += d.same_top;
  ref_entropy_ += d.ref_entropy;
  ref_top_prob_ += d.ref_top_prob;
}

double DivergenceStats::mean_kl() const {
  if (kl_.empty()) return 0.0;
  double sum = 0;
  for (double v : kl_) sum += v;
  return sum / double(kl_.size());
}

double DivergenceStats::mean_kl_stderr() const {
  const size_t n = kl_.size();
  if (n < 2) return 0.0;
  const double mean = mean_kl();
  double ss = 0;
  for (double v : kl_) ss += (v - mean) * (v - mean);
  return std::sqrt(ss / double(n - 1) / double(n));
}

double DivergenceStats::kl_quantile(double q) const {
  DUET_CHECK(q >= 0.0 && q <= 1.0, "q " << q);
  if (kl_.empty()) return 0.0;
  std::vector<double> sorted = kl_;
  std::sort(sorted.begin(), sorted.end());
  // Nearest rank: the smallest value with at least a fraction q of the positions at or below it.
  const size_t rank = static_cast<size_t>(std::ceil(q * double(sorted.size())));
  return sorted[rank == 0 ? 0 : rank - 1];
}

double DivergenceStats::top1_agreement() const {
  return kl_.empty() ? 0.0 : double(same_top_) / double(kl_.size());
}

double DivergenceStats::top1_stderr() const {
  const size_t n = kl_.size();
  if (n < 2) return 0.0;
  const double p = top1_agreement();
  return std::sqrt(p * (1.0 - p) / double(n - 1));
}

}  // namespace duet
