// The BPE merge step on token ids: a linear scan for short words, a heap for long ones.
#include "text/tokenizer_bpe.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <functional>
#include <queue>

namespace duet {

void BpeMerges::add(int32_t left, int32_t right, int32_t rank, int32_t result) {
  map_[key(left, right)] = Merge{rank, result};
}

void BpeMerges::apply(std::vector<int32_t>* ids) const {
  if (ids->size() <= kScanMaxSymbols) {
    apply_scan(ids);
  } else {
    apply_heap(ids);
  }
}

void BpeMerges::apply_scan(std::vector<int32_t>* ids) const {
  std::vector<int32_t>& v = *ids;
  if (v.size() < 2) return;
  // [v.size() - 1] merge of each adjacent pair, nullptr if none
  std::vector<const Merge*> pair(v.size() - 1);
  for (size_t i = 0; i + 1 < v.size(); ++i) pair[i] = find(v[i], v[i + 1]);
  for (;;) {
    size_t best = SIZE_MAX;
    int32_t best_rank = INT32_MAX;
    for (size_t i = 0; i < pair.size(); ++i) {
      if (pair[i] != nullptr && pair[i]->rank < best_rank) best_rank = pair[i]->rank, best = i;
    }
    if (best == SIZE_MAX) return;
    v[best] = pair[best]->result;
    v.erase(v.begin() + best + 1);
    pair.erase(pair.begin() + best);
    if (best > 0) pair[best - 1] = find(v[best - 1], v[best]);
    if (best < pair.size()) pair[best] = find(v[best], v[best + 1]);
  }
}

void BpeMerges::apply_heap(std::vector<int32_t>* ids) const {
  std::vector<int32_t>& v = *ids;
  const int32_t n = static_cast<int32_t>(v.size());
  if (n < 2) return;
  // Symbols form a linked list over the original positions; a merged-away symbol becomes -1.
  std::vector<int32_t> prev(n), next(n);  // next == n: no next symbol
  for (int32_t i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1;
  struct Candidate {
    int32_t rank, pos, left, right;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push = [&](int32_t i, int32_t j) {
    if (const Merge* m = find(v[i], v[j])) heap.push({m->rank, i, v[i], v[j]});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i, i + 1);
  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    // Stale if either symbol changed since the push: a symbol only changes by growing, and its
    // right neighbour only goes away by merging into it, so comparing ids is enough.
    int32_t i = c.pos, j = next[c.pos];
    if (v[i] != c.left || j >= n || v[j] != c.right) continue;
    v[i] = find(c.left, c.right)->result;
    v[j] = -1;
    next[i] = next[j];
    if (next[i] < n) prev[next[i]] = i;
    if (prev[i] >= 0) push(prev[i], i);
    if (next[i] < n) push(i, next[i]);
  }
  v.erase(std::remove(v.begin(), v.end(), -1), v.end());
}

}  // namespace duet
