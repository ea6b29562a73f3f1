// Peak loops for AVX-512: 16 independent zmm accumulators cover latency 4-5 on two ports.
#include <immintrin.h>

#include <cstdint>

namespace nibble::cpu::peaks {

float fma_zmm_loop(int64_t iterations) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-3f);
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < 16; ++i) sum = _mm512_add_ps(sum, acc[i]);
  return _mm512_reduce_add_ps(sum);
}

int32_t vnni_zmm_loop(int64_t iterations) {
  __m512i acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_epi32(i);
  const __m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-2);
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], u, s);
  }
  __m512i sum = acc[0];
  for (int i = 1; i < 16; ++i) sum = _mm512_add_epi32(sum, acc[i]);
  return _mm512_reduce_add_epi32(sum);
}

}  // namespace nibble::cpu::peaks
