// A software model of the AVX-512BW intrinsics gemm_pack_avx512.cpp uses beyond those of the
// quantize kernels (avx512_quantize_intrinsics.h), lane by lane per the Intel SDM, for
// test_gemm_pack_avx512_emulated:
//  * VPMOVZXBW widens 32 unsigned bytes to 32 words, in order.
//  * VPSHUFB looks up within each 128-bit lane: result byte i of a lane is 0 when bit 7 of index
//    byte i is set, else byte (index & 15) of the same lane of the table.
#pragma once
#include "avx512_quantize_intrinsics.h"

inline __m256i _mm256_loadu_si256(const __m256i* p) {
  __m256i r;
  std::memcpy(r.b, p, 32);
  return r;
}
inline __m512i _mm512_cvtepu8_epi16(__m256i a) {
  emulated_avx512::Lanes<uint16_t> w;
  for (int i = 0; i < 32; ++i) w.v[i] = a.b[i];
  return emulated_avx512::vec<__m512i>(w);
}
inline __m512i _mm512_shuffle_epi8(__m512i table, __m512i index) {
  const auto t = emulated_avx512::lanes<uint8_t>(table), idx = emulated_avx512::lanes<uint8_t>(index);
  emulated_avx512::Lanes<uint8_t> r;
  for (int i = 0; i < 64; ++i) r.v[i] = idx.v[i] & 0x80 ? 0 : t.v[i / 16 * 16 + (idx.v[i] & 15)];
  return emulated_avx512::vec<__m512i>(r);
}
