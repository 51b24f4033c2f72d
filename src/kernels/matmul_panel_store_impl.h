// Private to matmul.cpp and matmul_bf16.cpp: the end of a panel microkernel, written once
// against a vector interface.
//
// No include guard: included once per instruction set, inside a namespace that defines S, V, kW
// and kPanelVecs and the macro DUET_SIMD_TARGET.

// y[t * ldy + j] (+)= acc[t][j / kW][j % kW] for t < T, j < nr (lanes at or past nr untouched).
template <int T>
DUET_SIMD_TARGET DUET_ALWAYS_INLINE void store_panel_block(const V (&acc)[T][kPanelVecs],
                                                           float* y, int64_t ldy, int64_t nr,
                                                           bool accumulate) {
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    float* yt = y + t * ldy;
#pragma GCC unroll 8
    for (int v = 0; v < kPanelVecs; ++v) {
      const int64_t n = std::min<int64_t>(kW, nr - v * kW);
      if (n <= 0) break;
      if (n == kW) {
        S::store(yt + v * kW, accumulate ? S::add(acc[t][v], S::load(yt + v * kW)) : acc[t][v]);
      } else {
        const int part = static_cast<int>(n);
        const V sum = accumulate ? S::add(acc[t][v], S::load_part(yt + v * kW, part)) : acc[t][v];
        S::store_part(yt + v * kW, sum, part);
      }
    }
  }
}
