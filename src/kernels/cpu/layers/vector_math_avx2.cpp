// glibc's AVX2 vector expf (libmvec; the vector function ABI names it _ZGVdN8v_expf).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

extern "C" __m256 _ZGVdN8v_expf(__m256 x);

namespace nibble::cpu::vector_math {

// negate: exp(-x), the sign flipped as x is loaded.
void exp_avx2(const float* x, float* out, int64_t n, bool negate) {
  const __m256 sign = _mm256_set1_ps(negate ? -0.0f : 0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _ZGVdN8v_expf(_mm256_xor_ps(_mm256_loadu_ps(x + i), sign)));
  if (i < n) {
    alignas(32) float tail[8] = {};
    std::memcpy(tail, x + i, static_cast<size_t>(n - i) * sizeof(float));
    _mm256_store_ps(tail, _ZGVdN8v_expf(_mm256_xor_ps(_mm256_load_ps(tail), sign)));
    std::memcpy(out + i, tail, static_cast<size_t>(n - i) * sizeof(float));
  }
}

}  // namespace nibble::cpu::vector_math
