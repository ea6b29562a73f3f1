// A software model of what gemm_bf16_amx.cpp uses, for test_gemm_bf16_amx_emulated: the tiles of
// amx_int8_intrinsics.h, the AVX-512 permutes, masks and conversions of
// avx512_quantize_intrinsics.h, and the two BF16 instructions, per the Intel SDM:
//  * VCVTNE2PS2BF16 a, b: BF16 element i is b[i] for i < 16, a[i - 16] above, each rounded to nearest
//    even; NaN stays a quiet NaN with its sign; FP32 subnormal inputs read as signed zeros (DAZ).
//  * TDPBF16PS: C[m][n] (FP32) += A[m][2p] B[p][n][0] + A[m][2p+1] B[p][n][1] for each pair p in order.
//    The tile unit's internal FP32 rounding is its own (gemm_bf16_amx.cpp); this model adds the odd
//    product, then the even one, as the vdpbf16ps model does (avx512bf16_intrinsics.h). Every
//    product of two BF16 values is exact in FP32, so the model fixes only the order, and the test
//    checks the file's layout and indexing against a statement in the same order, not the rounding.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "amx_int8_intrinsics.h"
#include "avx512_quantize_intrinsics.h"

struct __m512bh {
  uint16_t h[32];
};

namespace emulated_bf16_amx {
inline uint16_t bf16_rne_daz(float x) {
  if (std::fpclassify(x) == FP_SUBNORMAL) x = std::copysign(0.0f, x);
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if (std::isnan(x)) return static_cast<uint16_t>((u >> 16) | 0x0040);
  return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
inline float widen(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace emulated_bf16_amx

inline __m512bh _mm512_cvtne2ps_pbh(__m512 a, __m512 b) {
  __m512bh r;
  for (int i = 0; i < 16; ++i) {
    r.h[i] = emulated_bf16_amx::bf16_rne_daz(b.f[i]);
    r.h[16 + i] = emulated_bf16_amx::bf16_rne_daz(a.f[i]);
  }
  return r;
}
inline __m128i _mm_maskz_loadu_epi8(__mmask16 k, const void* p) {
  __m128i r{};
  for (int i = 0; i < 16; ++i)
    if (k >> i & 1) r.b[i] = static_cast<const uint8_t*>(p)[i];
  return r;
}
inline void _mm512_store_si512(void* p, __m512i a) { std::memcpy(p, &a, 64); }

inline void _tile_dpbf16ps(int c, int a, int b) {
  using emulated_bf16_amx::widen;
  emulated_amx::Tiles& t = emulated_amx::tiles();
  for (int m = 0; m < t.rows[c]; ++m)
    for (int n = 0; n < t.colsb[c] / 4; ++n) {
      float acc;
      std::memcpy(&acc, &t.data[c][m][4 * n], 4);
      for (int p = 0; p < t.colsb[a] / 4; ++p) {
        uint16_t a2[2], b2[2];
        std::memcpy(a2, &t.data[a][m][4 * p], 4);
        std::memcpy(b2, &t.data[b][p][4 * n], 4);
        acc = acc + widen(a2[1]) * widen(b2[1]);
        acc = acc + widen(a2[0]) * widen(b2[0]);
      }
      std::memcpy(&t.data[c][m][4 * n], &acc, 4);
    }
}
