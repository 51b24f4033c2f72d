// Private to matmul_q8.cpp, included once per instruction set inside a namespace that defines
// K (the vector operations of one kernel) and DUET_SIMD_TARGET (its target attribute): the
// register block of the int8 products.

// One block of 4 weight rows × kT tokens. Per superblock, the int32 sums of its 16 (row, group)
// pairs build up over 8 steps for each token, each step's weights loaded once for the kT tokens;
// then they are scaled into the token's f32 accumulator.
template <int kT>
DUET_SIMD_TARGET void block(const Block& b) {
  using VF = typename K::VF;
  using VI = typename K::VI;
  const int64_t n_super = b.ld / kSuper;
  VF accf[kT];
#pragma GCC unroll 8
  for (int t = 0; t < kT; ++t) accf[t] = K::zero();
  for (int64_t s = 0; s < n_super; ++s) {
    VI acc[kT];
#pragma GCC unroll 8
    for (int t = 0; t < kT; ++t) acc[t] = K::init(b.corr + (t * n_super + s) * kLanes);
    const uint8_t* w = b.w + s * kSuperBytes;
    const int8_t* x = b.x + s * kSuper;
#pragma GCC unroll 8
    for (int k = 0; k < kSteps; ++k) {
      const typename K::W wk = K::prep(w + k * 64);
#pragma GCC unroll 8
      for (int t = 0; t < kT; ++t) acc[t] = K::dot(acc[t], wk, x + t * b.ld + k * 16);
    }
#pragma GCC unroll 8
    for (int t = 0; t < kT; ++t) {
      accf[t] = K::finish(acc[t], b.ws + s * kLanes, b.xs + (t * n_super + s) * kLanes, accf[t]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < kT; ++t) {
    float out[4];
    K::reduce(accf[t], out);
    for (int r = 0; r < b.r_count; ++r) b.y[t * b.ldy + r] = out[b.r_first + r];
  }
}

// block<n_tokens> for n_tokens in [1, kTokens].
inline BlockFn block_fn(int n_tokens) {
  static_assert(kTokens == 4);
  static constexpr BlockFn kTable[kTokens] = {&block<1>, &block<2>, &block<3>, &block<4>};
  return kTable[n_tokens - 1];
}
