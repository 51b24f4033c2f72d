// Private to matmul_fp8_pairs.cpp: products of x rounded to bf16 with fp8 weights in bf16 pairs,
// written once against a vector interface.
//
// No include guard: matmul_fp8_pairs.cpp instantiates it once per interface that multiplies
// bf16 pairs (kernels/pairs_instances.h), with S the interface and DUET_SIMD_TARGET its target
// attribute.
//
// Every E4M3 value times 2^-8 is a bf16 (at most 4 significant bits, exponents from -17 to 0:
// no bf16 subnormal), so a tile of kRows rows of codes is widened once to bf16 into a small
// buffer, exactly, and multiplied from there with S::dpbf16 (32 products per instruction where
// the f32 kernels run 16) by blocks of kTokens tokens; each 128-column block's partial sums are
// multiplied by the block's scale in registers, as the f32 kernels of matmul_fp8.cpp do.

using V = S::V;
constexpr int kPairW = S::kPairWidth;  // bf16 elements per vector
constexpr int kRows = 4;               // weight rows per tile
constexpr int kTokens = 3;  // 12 block sums + 12 totals + 4 weight vectors + 1 x vector of 32 zmm

// The first n (<= kPairW) elements of a vector of bf16 pairs, the rest zero.
DUET_SIMD_TARGET DUET_ALWAYS_INLINE V load_first(const uint16_t* p, int64_t n) {
  return n >= kPairW ? S::load_pairs(p) : S::load_pairs_part(p, static_cast<int>(n));
}

// out[i * ldb + c] = bf16(e4m3(code(r + i, c)) × 2^-8) for i < nr, c < w.cols, and zero from
// w.cols to the next multiple of kPairW. A group of 32 normal codes (exponent 1 to 15) widens by
// shifts (fp8_simd::bf16_of_normal, 5 instructions with the zero extension). A group holding a zero
// or a subnormal (or a row's last, partial group) widens through f32 (fp8_simd::widen, exact for
// every code) and keeps the high halves, which hold the whole value: the same bits for every normal
// code. On Emerald Rapids the shifts widen 1.35-1.48x as fast as the f32 path (rows in L1); decode
// of 8-32 sequences of the fp8 checkpoint did not move measurably (step by step, 0.93-1.07).
DUET_SIMD_TARGET void widen_rows(const Matrix& w, int64_t r, int64_t nr, uint16_t* out,
                                 int64_t ldb) {
  const __m512i high_halves =
      _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27,
                       25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  const int64_t cols = w.cols;
  for (int64_t i = 0; i < nr; ++i) {
    const uint8_t* codes = static_cast<const uint8_t*>(w.data) + (r + i) * cols;
    uint16_t* o = out + i * ldb;
    for (int64_t c = 0; c < cols; c += kPairW) {
      const int64_t n = std::min<int64_t>(kPairW, cols - c);
      const __m256i v =
          n == kPairW
              ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + c))
              : _mm256_maskz_loadu_epi8(static_cast<__mmask32>((uint64_t{1} << n) - 1u), codes + c);
      if (n == kPairW && !fp8_simd::has_exponent_0(v)) {
        const __m512i c16 = _mm512_cvtepu8_epi16(v);
        _mm512_storeu_si512(
            o + c, fp8_simd::bf16_of_normal(_mm512_slli_epi16(c16, 4), _mm512_slli_epi16(c16, 8)));
        continue;
      }
      const __m512i lo = _mm512_castps_si512(fp8_simd::widen(_mm256_castsi256_si128(v)));
      const __m512i hi = _mm512_castps_si512(fp8_simd::widen(_mm256_extracti128_si256(v, 1)));
      _mm512_storeu_si512(o + c, _mm512_permutex2var_epi16(lo, high_halves, hi));
    }
  }
}

// y[j * ldy + i] = x[j] · w[r + i] for i < R, j < T, from the rows widened at wb (ldb apart) and
// x's rounded rows at xt (ldx apart): per block of bc columns, R × T vector sums of pairs,
// multiplied by the block's scale (sr[i][b], times 2^8 to undo the widening's 2^-8) into R × T
// totals. The loops over R and T are unrolled so the sums stay in registers.
template <int R, int T>
DUET_SIMD_TARGET void pair_tile(const uint16_t* wb, int64_t ldb, const float* const* sr,
                                int64_t cols, int64_t bc, const uint16_t* xt, int64_t ldx, float* y,
                                int64_t ldy) {
  V tot[R][T];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < T; ++j) tot[i][j] = S::zero();
  for (int64_t b = 0, c0 = 0; c0 < cols; ++b, c0 += bc) {  // block b: no division per block
    const int64_t c1 = std::min(cols, c0 + bc);
    V blk[R][T];
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
      for (int j = 0; j < T; ++j) blk[i][j] = S::zero();
    // Whole vectors of pairs with plain loads; a block's ragged end (a block of 16 × an odd
    // number of columns, or the matrix's last) with masked ones, x masked too, so that what lies
    // past the block never meets a zero weight.
    const int64_t c_full = c0 + (c1 - c0) / kPairW * kPairW;
    for (int64_t c = c0; c < c_full; c += kPairW) {
      V wv[R];
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) wv[i] = S::load_pairs(wb + i * ldb + c);
#pragma GCC unroll 8
      for (int j = 0; j < T; ++j) {
        const V xv = S::load_pairs(xt + j * ldx + c);
#pragma GCC unroll 8
        for (int i = 0; i < R; ++i) blk[i][j] = S::dpbf16(blk[i][j], wv[i], xv);
      }
    }
    if (c_full < c1) {
      V wv[R];
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) wv[i] = load_first(wb + i * ldb + c_full, c1 - c_full);
#pragma GCC unroll 8
      for (int j = 0; j < T; ++j) {
        const V xv = load_first(xt + j * ldx + c_full, c1 - c_full);
#pragma GCC unroll 8
        for (int i = 0; i < R; ++i) blk[i][j] = S::dpbf16(blk[i][j], wv[i], xv);
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const V s = S::set1(sr[i][b]);
#pragma GCC unroll 8
      for (int j = 0; j < T; ++j) tot[i][j] = S::fmadd(blk[i][j], s, tot[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < T; ++j) y[j * ldy + i] = S::hsum(tot[i][j]) * 256.0f;
}

using TileFn = void (*)(const uint16_t*, int64_t, const float* const*, int64_t, int64_t,
                        const uint16_t*, int64_t, float*, int64_t);

template <int... I>
constexpr std::array<TileFn, sizeof...(I)> make_tile_table(std::integer_sequence<int, I...>) {
  return {&pair_tile<I / kTokens + 1, I % kTokens + 1>...};
}

// The tile kernel for nr <= kRows rows and nt <= kTokens tokens.
inline TileFn tile_fn(int64_t nr, int64_t nt) {
  static constexpr auto kTable =
      make_tile_table(std::make_integer_sequence<int, kRows * kTokens>{});
  return kTable[static_cast<size_t>((nr - 1) * kTokens + (nt - 1))];
}

// y[t * ldy + r - r_begin] = x[t] · w[r] for r in [r_begin, r_end), t < n_tokens; w fp8, x rounded
// (XRows::rounded). kWidenRows rows at a time are widened once (into L2); then kChunk tokens at a
// time (their rows of x in L2 too) run over them, each tile of kRows rows serving every block of
// kTokens tokens of the chunk from L1.
DUET_SIMD_TARGET void matmul_rows(const Matrix& w, const XRows& x, int64_t n_tokens, float* y,
                                  int64_t ldy, int64_t r_begin, int64_t r_end) {
  constexpr int64_t kWidenRows = 32, kChunk = 48;
  const int64_t cols = w.cols, bc = w.f8.block_cols;
  const int64_t ldb = (cols + kPairW - 1) / kPairW * kPairW;
  thread_local std::vector<uint16_t> buf;
  uint16_t* wb = matmul_impl::aligned_bf16(buf, kWidenRows * ldb);  // [kWidenRows, ldb] bf16
  for (int64_t r0 = r_begin; r0 < r_end; r0 += kWidenRows) {
    const int64_t r1 = std::min(r_end, r0 + kWidenRows);
    widen_rows(w, r0, r1 - r0, wb, ldb);
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kChunk) {
      const matmul_impl::EvenBlocks tb(std::min(kChunk, n_tokens - t0), kTokens);
      for (int64_t r = r0; r < r1; r += kRows) {
        const int64_t nr = std::min<int64_t>(kRows, r1 - r);
        const float* sr[kRows];
        for (int64_t i = 0; i < nr; ++i) sr[i] = scale_row(w, r + i);
        for (int64_t b = 0; b < tb.n; ++b) {
          const int64_t t = t0 + tb.begin(b);
          tile_fn(nr, tb.size(b))(wb + (r - r0) * ldb, ldb, sr, cols, bc, x.bf16 + t * x.ld, x.ld,
                                  y + t * ldy + (r - r_begin), ldy);
        }
      }
    }
  }
}
