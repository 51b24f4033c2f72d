// Private to matmul_q8.cpp, included once per instruction set inside a namespace that defines
// K (the vector operations of one kernel) and DUET_SIMD_TARGET (its target attribute): the
// register block of the products with int8 and int4 weights.

// Rows [b.r_first, b.r_first + b.r_count) of a block's accumulator f, summed, to y[0, r_count).
DUET_SIMD_TARGET DUET_ALWAYS_INLINE void store_rows(typename K::VF f, const Block& b, float* y) {
  float out[4];
  K::reduce(f, out);
  if (b.r_count == 4) {  // whole blocks, most of them: no call for a 4-float copy
    y[0] = out[0];
    y[1] = out[1];
    y[2] = out[2];
    y[3] = out[3];
    return;
  }
  for (int r = 0; r < b.r_count; ++r) y[r] = out[b.r_first + r];
}

// acc[t] = token t's int32 sums of one superblock of kQ4 weights at w, for kernels with
// K::kHigh16: the high nibbles' products in sums of their own, 16 times too large, started from
// x's corrections as int8's sums are (-128 · Σ q_x: 16 times int4's -8 · Σ q_x), and added to the
// low nibbles' as a sixteenth at the end. The same int32 sums (every one a multiple of 16 before
// the shift, none near 2^31), two shorter chains, and 1 shift a superblock instead of 5 (int4 at
// one token, weights in L2, one thread, Emerald Rapids: the loop had been bound by the one port
// that takes both vpdpbusd and shifts). KK: K, named so that the body is compiled only for the
// kernels that take this path.
template <int kT, typename KK = K>
DUET_SIMD_TARGET DUET_ALWAYS_INLINE void dot_u4_high16(typename KK::VI (&acc)[kT], const uint8_t* w,
                                                       const int8_t* x, int64_t ld,
                                                       const int32_t* corr, int64_t corr_ld) {
  typename KK::VI acc_hi[kT];
#pragma GCC unroll 8
  for (int t = 0; t < kT; ++t) {
    acc[t] = KK::zero_i();
    acc_hi[t] = KK::init(corr + t * corr_ld);
  }
#pragma GCC unroll 4
  for (int k = 0; k < kSteps / 2; ++k) {
    typename KK::W lo, hi16;
    KK::unpack_u4_high16(w + k * 64, lo, hi16);
#pragma GCC unroll 8
    for (int t = 0; t < kT; ++t) {
      acc[t] = KK::dot_u(acc[t], lo, x + t * ld + k * 16);
      acc_hi[t] = KK::dot_u(acc_hi[t], hi16, x + t * ld + (k + kSteps / 2) * 16);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < kT; ++t) acc[t] = KK::add_high16(acc[t], acc_hi[t]);
}

// One block of 4 weight rows × kT tokens of kQ8 weights (kBits 8) or kQ4 ones (kBits 4). Per
// superblock, the int32 sums of its 16 (row, group) pairs build up over 8 steps for each token,
// each step's weights loaded (kQ4: unpacked, two steps from one vector) once for the kT tokens;
// then they are scaled into the token's f32 accumulator by the weights' scales (f16 × the row's
// factor, in a register for the whole block: the same f32 scale, exactly) and x's.
template <int kT, int kBits>
DUET_SIMD_TARGET DUET_ALWAYS_INLINE void block_once(const Block& b) {
  using VF = typename K::VF;
  using VI = typename K::VI;
  using W = typename K::W;
  constexpr int64_t kBytes = kSuperBytes * kBits / 8;  // of a block's superblock
  const int64_t n_super = b.ld / kSuper;
  VF accf[kT];
#pragma GCC unroll 8
  for (int t = 0; t < kT; ++t) accf[t] = K::zero();
  const VF dw = K::row_factors(b.wd);
  for (int64_t s = 0; s < n_super; ++s) {
    VI acc[kT];
    const int32_t* corr = b.corr + s * kLanes;
    const uint8_t* w = b.w + s * kBytes;
    const int8_t* x = b.x + s * kSuper;
    // The weights kPrefetchBytes ahead in their stream (the next blocks' past the block's end:
    // another thread's or past the matrix, prefetches never fault), and their scales as far
    // ahead in theirs. Every block of tokens issues them again: with the first alone, decode
    // of 8 and 32 sequences was 1.5-2.7 % slower (alternating step by step, int4, Zen 4).
    // At one token (kT 1) only b.pf_one ahead, into L1, and only where it is set
    // (simd::one_token_prefetch_bytes: on Intel's CPUs). On Zen 4 one prefetch per cache line of
    // little arithmetic cost more than the hardware's own prefetch of the stream left to gain
    // (in huge pages, alternating step by step: decode of one sequence with int8 weights
    // 1.05-1.06x without, on one thread 1.25x; int4 1.08x on one thread, on two a median 1.015x
    // of eight runs of 0.92-1.04x; at 8 sequences level; the product alone, int8, 1.10x on 2
    // threads, 1.38x on 1). On Emerald Rapids, 4 KiB ahead, decode of one sequence took 0.89x
    // (int8) and 0.78-0.88x (int4) of the time without (cold steps, alternating step by step).
    // And b.pf_l2 ahead into L2 (simd::one_token_prefetch_l2_bytes), which keeps more of the
    // core's reads in flight than the prefetches into L1 can.
    if constexpr (kT > 1) {
#pragma GCC unroll 8
      for (int64_t l = 0; l < kBytes; l += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetchBytes + l), _MM_HINT_T1);
      }
    } else {
      if (b.pf_one > 0) {
#pragma GCC unroll 8
        for (int64_t l = 0; l < kBytes; l += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(w + b.pf_one + l), _MM_HINT_T0);
        }
      }
      if (b.pf_l2 > 0) {
#pragma GCC unroll 8
        for (int64_t l = 0; l < kBytes; l += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(w + b.pf_l2 + l), _MM_HINT_T1);
        }
      }
    }
    if (s % 2 == 0) {
      _mm_prefetch(reinterpret_cast<const char*>(b.ws + (s + kPrefetchBytes / kBytes) * kLanes),
                   _MM_HINT_T1);
    }
    if constexpr (kBits == 8) {
#pragma GCC unroll 8
      for (int t = 0; t < kT; ++t) acc[t] = K::init(corr + t * n_super * kLanes);
#pragma GCC unroll 8
      for (int k = 0; k < kSteps; ++k) {
        const W wk = K::prep(w + k * 64);
#pragma GCC unroll 8
        for (int t = 0; t < kT; ++t) acc[t] = K::dot(acc[t], wk, x + t * b.ld + k * 16);
      }
    } else {
      static_assert(kBits == 4);
      if constexpr (K::kHigh16) {
        dot_u4_high16<kT>(acc, w, x, b.ld, corr, n_super * kLanes);
      } else {
#pragma GCC unroll 8
        for (int t = 0; t < kT; ++t) acc[t] = K::init_u4(corr + t * n_super * kLanes);
#pragma GCC unroll 4
        for (int k = 0; k < kSteps / 2; ++k) {
          W lo, hi;
          K::unpack_u4(w + k * 64, lo, hi);
#pragma GCC unroll 8
          for (int t = 0; t < kT; ++t) {
            acc[t] = K::dot_u(acc[t], lo, x + t * b.ld + k * 16);
            acc[t] = K::dot_u(acc[t], hi, x + t * b.ld + (k + kSteps / 2) * 16);
          }
        }
      }
    }
#pragma GCC unroll 8
    for (int t = 0; t < kT; ++t) {
      accf[t] =
          K::finish(acc[t], b.ws + s * kLanes, dw, b.xs + (t * n_super + s) * kLanes, accf[t]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < kT; ++t) store_rows(accf[t], b, b.y + t * b.ldy);
}

// block_once over b.n_blocks blocks.
template <int kT, int kBits>
DUET_SIMD_TARGET void block(const Block& b) {
  if (b.n_blocks == 1) {
    block_once<kT, kBits>(b);
    return;
  }
  const int64_t n_super = b.ld / kSuper;
  Block bi = b;
  for (int64_t i = 0; i < b.n_blocks; ++i) {
    block_once<kT, kBits>(bi);
    bi.w += n_super * (kSuperBytes * kBits / 8);
    bi.ws += n_super * kLanes;
    bi.wd += kQ8BlockRows;
    bi.y += kQ8BlockRows;
  }
}

// block<n_tokens, bits of dtype> for n_tokens in [1, kTokens], dtype kQ8 or kQ4.
inline BlockFn block_fn(DType dtype, int n_tokens) {
  static_assert(kTokens == 4);
  static constexpr BlockFn kQ8Table[kTokens] = {&block<1, 8>, &block<2, 8>, &block<3, 8>,
                                                &block<4, 8>};
  static constexpr BlockFn kQ4Table[kTokens] = {&block<1, 4>, &block<2, 4>, &block<3, 4>,
                                                &block<4, 4>};
  return (dtype == DType::kQ4 ? kQ4Table : kQ8Table)[n_tokens - 1];
}
