// AVX512-BF16 micro-kernel over BF16-pair panels (gemm_kernels.h): vdpbf16ps multiplies the two
// BF16 pairs of each 32-bit lane exactly and adds both products to the FP32 accumulator, twice the
// multiply-adds per instruction of an FP32 FMA. Same 8 x 32 micro-tile and register plan as
// f32_avx512 (16 accumulators, two B vectors, one broadcast), one k pair per step.
#ifdef NIBBLE_EMULATED_INTRINSICS
// tests/emulated/: a software model of the few intrinsics below, so that this kernel's panel layout
// and indexing are tested on CPUs without AVX512-BF16 too (the instruction itself only on one).
#include NIBBLE_EMULATED_INTRINSICS
#else
#include <immintrin.h>
#endif

#include "kernels/cpu/gemm/gemm_kernels.h"

namespace nibble::cpu::gemm_detail {
namespace {

void bf16_pairs_avx512bf16(const uint8_t* pa, const uint8_t* pb, int64_t pairs, float* acc, bool first) {
  __m512 c[kMr][2];
  for (int m = 0; m < kMr; ++m) {
    c[m][0] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + m * kNr);
    c[m][1] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + m * kNr + 16);
  }
  const int32_t* a = reinterpret_cast<const int32_t*>(pa);
  const uint8_t* b = pb;
  for (int64_t p = 0; p < pairs; ++p, a += kMr, b += bf16_pair_b_unit_bytes()) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + 64);
#pragma GCC unroll 8
    for (int m = 0; m < kMr; ++m) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(a[m]);
      c[m][0] = _mm512_dpbf16_ps(c[m][0], av, b0);
      c[m][1] = _mm512_dpbf16_ps(c[m][1], av, b1);
    }
  }
  for (int m = 0; m < kMr; ++m) {
    _mm512_storeu_ps(acc + m * kNr, c[m][0]);
    _mm512_storeu_ps(acc + m * kNr + 16, c[m][1]);
  }
}

}  // namespace

MicroKernel bf16_pair_micro_kernel_avx512bf16() { return &bf16_pairs_avx512bf16; }

}  // namespace nibble::cpu::gemm_detail
