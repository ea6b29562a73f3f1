// glibc's AVX-512 vector expf (libmvec; the vector function ABI names it _ZGVeN16v_expf).
#include <immintrin.h>

#include <cstdint>

extern "C" __m512 _ZGVeN16v_expf(__m512 x);

namespace nibble::cpu::vector_math {

// negate: exp(-x), the sign flipped as x is loaded.
void exp_avx512(const float* x, float* out, int64_t n, bool negate) {
  const __m512 sign = _mm512_set1_ps(negate ? -0.0f : 0.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, _ZGVeN16v_expf(_mm512_xor_ps(_mm512_loadu_ps(x + i), sign)));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(out + i, m, _ZGVeN16v_expf(_mm512_xor_ps(_mm512_maskz_loadu_ps(m, x + i), sign)));
  }
}

}  // namespace nibble::cpu::vector_math
