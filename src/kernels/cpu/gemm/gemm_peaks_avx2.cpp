// Peak loops for AVX2: 12 independent ymm accumulators.
#include <immintrin.h>

#include <cstdint>

namespace nibble::cpu::peaks {

float fma_ymm_loop(int64_t iterations) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(1e-3f);
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], x, y);
  }
  __m256 sum = acc[0];
  for (int i = 1; i < 12; ++i) sum = _mm256_add_ps(sum, acc[i]);
  float out[8];
  _mm256_storeu_ps(out, sum);
  return out[0] + out[7];
}

// vpmaddubsw: 32 u8 x s8 products per ymm instruction (pairs summed to int16).
int32_t maddubs_ymm_loop(int64_t iterations) {
  __m256i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_epi8(static_cast<char>(i));
  const __m256i s = _mm256_set1_epi8(1);
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_maddubs_epi16(acc[i], s);
  }
  __m256i sum = acc[0];
  for (int i = 1; i < 12; ++i) sum = _mm256_add_epi16(sum, acc[i]);
  return _mm256_extract_epi32(sum, 0) + _mm256_extract_epi32(sum, 7);
}

}  // namespace nibble::cpu::peaks
