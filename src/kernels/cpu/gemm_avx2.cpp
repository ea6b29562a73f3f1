// AVX2 micro-kernels over the packed panels (gemm_kernels.h). Without VNNI, a block's integer
// dot product is vpmaddubsw (u8 x s8 -> pairs summed to int16; at most 2*24*12 = 576, so it never
// saturates) summed over the block's groups in int16 (at most 16*288 = 4608), then one vpmaddwd
// against ones to widen to int32. With 16 ymm registers the 8x32 tile is done 8 columns at a
// time so that the 8 accumulators, B and the broadcasts stay in registers.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/gemm_kernels.h"

namespace nibble::cpu::gemm_detail {
namespace {

template <int64_t Groups>
void int8_blocks_avx2(const uint8_t* pa, const uint8_t* pb, int64_t blocks, float* acc, bool first) {
  constexpr int64_t block_len = Groups * 4;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int quarter = 0; quarter < 4; ++quarter) {
    __m256 c[kMr];
    for (int m = 0; m < kMr; ++m) c[m] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + m * kNr + 8 * quarter);
    const uint8_t* a = pa;
    const uint8_t* b = pb;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int32_t* a_words = reinterpret_cast<const int32_t*>(a);
      const int32_t* init = reinterpret_cast<const int32_t*>(a + block_len * kMr);
      const float* sa = reinterpret_cast<const float*>(a + block_len * kMr + 4 * kMr);
      const __m256 sb = _mm256_loadu_ps(reinterpret_cast<const float*>(b + block_len * kNr) + 8 * quarter);
      __m256i bv[Groups];
      for (int64_t g = 0; g < Groups; ++g)
        bv[g] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + g * kNr * 4 + 32 * quarter));
#pragma GCC unroll 8
      for (int m = 0; m < kMr; ++m) {
        __m256i pairs = _mm256_maddubs_epi16(bv[0], _mm256_set1_epi32(a_words[m]));
        for (int64_t g = 1; g < Groups; ++g)
          pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(bv[g], _mm256_set1_epi32(a_words[g * kMr + m])));
        __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(pairs, ones), _mm256_set1_epi32(init[m]));
        c[m] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(dot), sb), _mm256_set1_ps(sa[m]), c[m]);
      }
      a += int8_a_block_bytes(block_len);
      b += int8_b_block_bytes(block_len);
    }
    for (int m = 0; m < kMr; ++m) _mm256_storeu_ps(acc + m * kNr + 8 * quarter, c[m]);
  }
}

void f32_avx2(const uint8_t* pa, const uint8_t* pb, int64_t ks, float* acc, bool first) {
  for (int quarter = 0; quarter < 4; ++quarter) {
    __m256 c[kMr];
    for (int m = 0; m < kMr; ++m) c[m] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + m * kNr + 8 * quarter);
    const float* a = reinterpret_cast<const float*>(pa);
    const float* b = reinterpret_cast<const float*>(pb) + 8 * quarter;
    for (int64_t k = 0; k < ks; ++k, a += kMr, b += kNr) {
      const __m256 bv = _mm256_loadu_ps(b);
#pragma GCC unroll 8
      for (int m = 0; m < kMr; ++m) c[m] = _mm256_fmadd_ps(_mm256_set1_ps(a[m]), bv, c[m]);
    }
    for (int m = 0; m < kMr; ++m) _mm256_storeu_ps(acc + m * kNr + 8 * quarter, c[m]);
  }
}

}  // namespace

MicroKernel int8_micro_kernel_avx2(int64_t block_len) {
  return block_len == 32 ? &int8_blocks_avx2<8> : &int8_blocks_avx2<4>;
}
MicroKernel f32_micro_kernel_avx2() { return &f32_avx2; }

}  // namespace nibble::cpu::gemm_detail
