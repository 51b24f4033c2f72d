// The merge step of byte-level BPE, on token ids. Private to the tokenizer (and its tests).
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace duet {

// Merge table of a BPE model: (left id, right id) -> (rank, merged id).
class BpeMerges {
 public:
  // Adds the merge left + right -> result with priority `rank` (lower merges first). A pair
  // that is added again takes the later rank and result, as Hugging Face's loader does.
  void add(int32_t left, int32_t right, int32_t rank, int32_t result);
  void reserve(size_t n_merges) { map_.reserve(n_merges); }
  size_t size() const { return map_.size(); }

  // Merges *ids in place: repeatedly the adjacent pair of lowest rank (the leftmost one on a
  // tie) becomes its merged id, until no adjacent pair has a merge. apply() picks the scan for
  // short words and the heap for long ones; both give the same result.
  void apply(std::vector<int32_t>* ids) const;
  void apply_scan(std::vector<int32_t>* ids) const;  // O(n^2): a linear scan per merge
  void apply_heap(std::vector<int32_t>* ids) const;  // O(n log n): a priority queue of pairs

  // Words up to this many symbols use the scan.
  static constexpr size_t kScanMaxSymbols = 48;

 private:
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  static uint64_t key(int32_t left, int32_t right) {
    return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
  }
  const Merge* find(int32_t left, int32_t right) const {
    auto it = map_.find(key(left, right));
    return it == map_.end() ? nullptr : &it->second;
  }

  std::unordered_map<uint64_t, Merge> map_;
};

}  // namespace duet
