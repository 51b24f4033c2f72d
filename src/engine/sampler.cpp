#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/ops.h"

namespace duet {

Sampler::Sampler(const SamplingParams& p) : p_(p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature))
    DUET_ERROR("temperature must be >= 0, got " << p.temperature);
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) DUET_ERROR("top_p must be in (0, 1], got " << p.top_p);
  if (p.top_k < -1) DUET_ERROR("top_k must be -1, 0 or positive, got " << p.top_k);
  rng_.seed(p.seed ? *p.seed : std::random_device{}());
}

namespace {

// A NaN or infinite logit: argmax would return an arbitrary id and no probability is defined.
[[noreturn]] void throw_not_finite(const float* logits, int64_t n_vocab) {
  int64_t i = 0;
  while (i + 1 < n_vocab && std::isfinite(logits[i])) ++i;
  DUET_ERROR("the logits are not finite (" << logits[i] << " at token id " << i
                                           << "): no token can be sampled");
}

// Descending logit, the lower id first among equal logits: a strict total order, so the tokens
// kept and their order do not depend on the sorting algorithm.
// (A function object, so the sorts inline it.)
struct ByLogit {
  bool operator()(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) const {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  }
};
constexpr ByLogit by_logit;

// Top-p sorts the ranks around the nucleus's end once the candidates left are this few.
constexpr size_t kSortedTail = 64;
// Top-p's buckets: a probability's float bits shifted right by kBucketShift (its exponent and
// top 3 mantissa bits); 1.0f's are the last bucket.
constexpr uint32_t kBucketShift = 20;
constexpr uint32_t kBuckets = (0x3f800000u >> kBucketShift) + 1;

}  // namespace

int32_t Sampler::sample(const float* logits, int64_t n_vocab) {
  const int64_t best = argmax_finite(logits, n_vocab);
  if (best < 0) throw_not_finite(logits, n_vocab);
  if (p_.temperature == 0.0f) return static_cast<int32_t>(best);

  const size_t n = static_cast<size_t>(n_vocab);
  const float t = p_.temperature, shift = logits[best] / t;
  probs_.resize(n);  // [n_vocab] exp(l / T - max / T), filled where needed: the largest is 1
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < n) {
    // Top-k: the k largest logits sorted, and only their probabilities. One scan keeps the k
    // best so far in a heap whose front is the worst of them; a vectorised filter skips every
    // logit not above it (nearly all, after the first few thousand), so the scan costs about
    // one compare per 16 logits. A logit equal to the worst comes later, i.e. with a larger id:
    // by_logit keeps the lower id, so "not above" is exactly "not better".
    const size_t k = static_cast<size_t>(p_.top_k);
    cand_.resize(k);
    for (size_t i = 0; i < k; ++i) cand_[i] = {logits[i], static_cast<int32_t>(i)};
    std::make_heap(cand_.begin(), cand_.end(), by_logit);
    for (int64_t i = int64_t(k);; ++i) {
      i += first_above(logits + i, n_vocab - i, cand_.front().first);
      if (i >= n_vocab) break;
      std::pop_heap(cand_.begin(), cand_.end(), by_logit);
      cand_.back() = {logits[i], static_cast<int32_t>(i)};
      std::push_heap(cand_.begin(), cand_.end(), by_logit);
    }
    std::sort(cand_.begin(), cand_.end(), by_logit);
    double sum = 0;
    for (size_t r = 0; r < k; ++r) {
      const size_t id = size_t(cand_[r].second);
      probs_[id] = std::exp(logits[id] / t - shift);
      sum += probs_[id];
    }
    return p_.top_p < 1.0f ? draw_nucleus(k, /*sorted=*/true, sum) : draw_first(k, sum);
  }
  block_sums_.resize(size_t((n_vocab + kExpBlock - 1) / kExpBlock));
  const double total = exp_scaled(logits, n_vocab, t, shift, probs_.data(), block_sums_.data());
  if (p_.top_p >= 1.0f) return draw_all(n_vocab, total);
  // Top-p over every token: those below tau weigh less than (1 - p) of the whole together, so
  // the others already reach p and hold the nucleus; only they are sorted.
  const double tau = (1.0 - double(p_.top_p)) * total / double(n);
  // The least float f with f >= tau as doubles: a probability passes as a float compare exactly
  // when it passes as a double one.
  float f_tau = static_cast<float>(tau);
  if (double(f_tau) < tau) f_tau = std::nextafter(f_tau, INFINITY);
  ids_.resize(n + 16);
  const size_t n_cand = size_t(indices_at_least(probs_.data(), n_vocab, f_tau, ids_.data()));
  cand_.resize(n_cand);
  for (size_t r = 0; r < n_cand; ++r) cand_[r] = {logits[size_t(ids_[r])], ids_[r]};
  return draw_nucleus(n_cand, /*sorted=*/false, total);
}

int32_t Sampler::draw_nucleus(size_t n_cand, bool sorted, double sum) {
  // The ranks [0, lo) are in the nucleus; it ends within [lo, hi), which must give `need` more.
  // Buckets of probability narrow that range in two passes; halving it by selection (the upper
  // half's ranks before the lower's, neither sorted) finds the end in linear time; only the last
  // few ranks are sorted. A probability's order is its logit's: the exp is monotone.
  const auto prob = [&](size_t rank) { return double(probs_[size_t(cand_[rank].second)]); };
  size_t lo = 0, hi = n_cand;
  double need = double(p_.top_p) * sum, cum = 0;
  if (!sorted && n_cand > kSortedTail) {
    // First by buckets of probability (an eighth of an octave each): the buckets wholly in the
    // nucleus go first, then the one it ends in, which alone is searched further.
    const auto bucket = [&](const std::pair<float, int32_t>& c) {
      uint32_t bits;
      std::memcpy(&bits, &probs_[size_t(c.second)], sizeof bits);
      return bits >> kBucketShift;  // probabilities are in [0, 1]: below kBuckets
    };
    bucket_mass_.assign(kBuckets, 0.0);
    for (size_t r = 0; r < n_cand; ++r) bucket_mass_[bucket(cand_[r])] += prob(r);
    uint32_t end = kBuckets - 1;
    for (; end > 0 && bucket_mass_[end] < need; --end) {
      need -= bucket_mass_[end];
      cum += bucket_mass_[end];
    }
    const auto first = cand_.begin(), last = first + ptrdiff_t(n_cand);
    const auto at = std::partition(first, last, [&](const auto& c) { return bucket(c) > end; });
    const auto below = std::partition(at, last, [&](const auto& c) { return bucket(c) == end; });
    lo = size_t(at - first);
    hi = size_t(below - first);
  }
  while (!sorted && hi - lo > kSortedTail) {
    const size_t mid = lo + (hi - lo) / 2;
    std::nth_element(cand_.begin() + lo, cand_.begin() + mid, cand_.begin() + hi, by_logit);
    double upper = 0;
    for (size_t r = lo; r < mid; ++r) upper += prob(r);
    if (upper >= need) {
      hi = mid;
    } else {
      need -= upper;
      cum += upper;
      lo = mid;
    }
  }
  if (!sorted) std::sort(cand_.begin() + lo, cand_.begin() + hi, by_logit);
  double tail = 0;
  size_t keep = lo;
  while (keep < hi && tail < need) tail += prob(keep++);
  return draw_first(std::max<size_t>(keep, 1), cum + tail);
}

int32_t Sampler::draw_first(size_t n_keep, double sum) {
  const double r = std::uniform_real_distribution<double>(0.0, sum)(rng_);
  double acc = 0.0;
  for (size_t i = 0; i < n_keep; ++i) {
    acc += probs_[static_cast<size_t>(cand_[i].second)];
    if (r < acc) return cand_[i].second;
  }
  return cand_[n_keep - 1].second;
}

int32_t Sampler::draw_all(int64_t n_vocab, double total) {
  const double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
  // The block the draw falls in (total is the blocks' sums added in this order), then the token.
  double acc = 0.0;
  size_t b = 0;
  while (b < block_sums_.size() && !(r < acc + block_sums_[b])) acc += block_sums_[b++];
  int64_t end = n_vocab;
  if (b < block_sums_.size()) {
    end = std::min(n_vocab, int64_t(b + 1) * kExpBlock);
    for (int64_t i = int64_t(b) * kExpBlock; i < end; ++i) {
      acc += probs_[static_cast<size_t>(i)];
      if (r < acc) return static_cast<int32_t>(i);
    }
  }
  // r fell in the rounding between a vectorised sum and this running one: the last token with
  // any probability up to there.
  int64_t i = end - 1;
  while (i > 0 && probs_[static_cast<size_t>(i)] == 0.0f) --i;
  return static_cast<int32_t>(i);
}

}  // namespace duet
