// How far a model's next-token distributions are from a reference's on the same text (`duet
// bench accuracy`): per position the KL divergence KL(ref || other) of the two softmaxes and
// whether their argmaxes agree, and over many positions the mean, spread and agreement rate.
#pragma once

#include <cstdint>
#include <vector>

namespace duet {

struct TokenDivergence {
  double kl = 0;          // KL(ref || other) in nats, >= 0
  bool same_top = false;  // argmax(ref) == argmax(other), the lowest id among equal maxima
  // The reference's distribution: how flat it is (entropy in nats, at most ln n_vocab) and its
  // top probability. A flat reference makes top-1 agreement fragile.
  double ref_entropy = 0;
  double ref_top_prob = 0;
};

// ref, other: [n_vocab] f32 logits of one position. Each is turned into log-probabilities by a
// stable log-softmax (max subtracted, exp in f32, sums in f64); KL = sum_i p_i (log p_i - log
// q_i), clamped at 0 against rounding. REQUIRES: n_vocab > 0; finite logits (checked: a NaN or
// infinite logit throws duet::Error naming the row and the id).
TokenDivergence token_divergence(const float* ref, const float* other, int64_t n_vocab);

// The divergences of many positions.
class DivergenceStats {
 public:
  void add(const TokenDivergence& d);

  int64_t n_tokens() const { return static_cast<int64_t>(kl_.size()); }
  double mean_kl() const;         // 0 for no positions
  double mean_kl_stderr() const;  // standard error of the mean (0 for fewer than 2 positions)
  // The q-quantile of the positions' KL, q in [0, 1], nearest rank (q = 1: the largest).
  double kl_quantile(double q) const;
  // Positions whose argmaxes agree, as a fraction in [0, 1] (0 for no positions), and the
  // standard error of that fraction.
  double top1_agreement() const;
  double top1_stderr() const;
  // Means over the positions of TokenDivergence::ref_entropy and ref_top_prob.
  double mean_ref_entropy() const { return kl_.empty() ? 0.0 : ref_entropy_ / double(kl_.size()); }
  double mean_ref_top_prob() const {
    return kl_.empty() ? 0.0 : ref_top_prob_ / double(kl_.size());
  }

 private:
  std::vector<double> kl_;  // [n_tokens] per position
  int64_t same_top_ = 0;
  double ref_entropy_ = 0;   // summed over positions
  double ref_top_prob_ = 0;  // summed over positions
};

}  // namespace duet
