// Private to matmul_q8.cpp, included once per instruction set inside a namespace that defines
// K (the vector operations of one kernel) and DUET_SIMD_TARGET (its target attribute): the
// register block of the int8 products.

// kR weight rows × kT tokens, one f32 accumulator vector each; every chunk of weights (and its
// scales) is loaded once for the kT tokens.
template <int kR, int kT>
DUET_SIMD_TARGET void block(const Block& b) {
  using VF = typename K::VF;
  constexpr int64_t kGroups = K::kChunk / kQ8Group;  // groups per chunk
  const int64_t n_groups = b.ld / kQ8Group, ld_xs = n_groups * kScaleRepeat;
  VF acc[kR][kT];
#pragma GCC unroll 8
  for (int r = 0; r < kR; ++r) {
#pragma GCC unroll 8
    for (int t = 0; t < kT; ++t) acc[r][t] = K::zero();
  }
  for (int64_t c = 0; c < b.ld / K::kChunk; ++c) {
#pragma GCC unroll 8
    for (int r = 0; r < kR; ++r) {
      const typename K::W w =
          K::load_w(b.w + r * b.ld + c * K::kChunk, b.ws + r * n_groups + c * kGroups);
#pragma GCC unroll 8
      for (int t = 0; t < kT; ++t) {
        const int8_t* x = b.x + t * b.ld + c * K::kChunk;
        const float* xs = b.xs + t * ld_xs + c * kGroups * kScaleRepeat;
        acc[r][t] = K::fmadd(K::dot(w, x), K::scale(w, xs), acc[r][t]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kR; ++r) {
#pragma GCC unroll 8
    for (int t = 0; t < kT; ++t) b.y[t * b.ldy + r] = K::hsum(acc[r][t]);
  }
}

// block<n_rows, n_tokens> for n_rows in {1, kRows} and n_tokens in [1, kTokens].
inline BlockFn block_fn(int n_rows, int n_tokens) {
  static_assert(kTokens == 4);
  static constexpr BlockFn kTable[2][kTokens] = {
      {&block<1, 1>, &block<1, 2>, &block<1, 3>, &block<1, 4>},
      {&block<kRows, 1>, &block<kRows, 2>, &block<kRows, 3>, &block<kRows, 4>}};
  return kTable[n_rows == kRows][n_tokens - 1];
}
