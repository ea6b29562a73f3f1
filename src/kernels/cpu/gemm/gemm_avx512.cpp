// AVX-512 VNNI micro-kernels over the packed panels (gemm_kernels.h).
//
// int8 blocks: per block and row m, an int32 vector starts at -12*sum(A block row) and takes
// Groups vpdpbusd (B's 64-byte u8 vectors against A's 4 codes broadcast, the s8 operand), giving
// the exact block dot product for 16 columns; then cvt -> *sB -> fma(sA) into FP32. Per 16-block
// that is 4 vpdpbusd to 3 float ops on the same two vector ports, which bounds this kernel at 4/7
// of the pure vpdpbusd peak; the 32-element MX blocks amortise the epilogue over 8.
#ifdef NIBBLE_EMULATED_INTRINSICS
// tests/emulated/: a software model of the intrinsics below, so that this file's panel indexing,
// row groups and scale epilogues are tested on CPUs without AVX-512 too.
#include NIBBLE_EMULATED_INTRINSICS
#else
#include <immintrin.h>
#endif

#include "kernels/cpu/gemm/gemm_kernels.h"

// GCC 12 warns that _mm512_cvtepi32_ps's internal undefined vector "may be used uninitialized"
// (a false positive inside the intrinsic header).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace nibble::cpu::gemm_detail {
namespace {

// The 8x32 tile is computed as two 4x32 row groups, each over the whole K chunk (the B chunk is
// read twice from L1). Each A word broadcast then feeds two vpdpbusd (one per 16-column vector),
// which halves the broadcast loads per multiply-add against 8x16 halves: with 8x16 the kernel
// issued almost one load per vector op and was bound by the load ports, not by vpdpbusd.
// 8 int32 + 8 float accumulators, 2 B vectors and the scales fit in the 32 zmm registers, and the
// 8 independent vpdpbusd chains of a group hide its latency.
// UniformB: B is 16x16-tiled NVFP4, so each 16-column half of the panel has one scale per block and
// sA*sB is one number per row and half; it is formed for the 4 rows at once and broadcast from
// memory, which turns the per-row cvt, mul, fma into cvt, fma (6 vector ops per block and vector
// instead of 7). Same value: both ways add the exact product P*sA*sB with one rounding.
template <int64_t Groups, bool UniformB>
void int8_blocks_avx512(const uint8_t* pa, const uint8_t* pb, int64_t blocks, float* acc, bool first) {
  static_assert(kNrVectors == 2 && kMr % 4 == 0);
  constexpr int kRows = 4;
  constexpr int64_t block_len = Groups * 4;
  for (int r0 = 0; r0 < kMr; r0 += kRows) {
    __m512 c[kRows][2];
#pragma GCC unroll 4
    for (int m = 0; m < kRows; ++m)
      for (int h = 0; h < 2; ++h)
        c[m][h] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + (r0 + m) * kNr + 16 * h);
    const uint8_t* a = pa;
    const uint8_t* b = pb;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int32_t* a_words = reinterpret_cast<const int32_t*>(a);
      const int32_t* init = reinterpret_cast<const int32_t*>(a + block_len * kMr);
      const float* sa = reinterpret_cast<const float*>(a + block_len * kMr + 4 * kMr);
      __m512i d[kRows][2];
#pragma GCC unroll 4
      for (int m = 0; m < kRows; ++m) d[m][0] = d[m][1] = _mm512_set1_epi32(init[r0 + m]);
#pragma GCC unroll 8
      for (int64_t g = 0; g < Groups; ++g) {
        const __m512i b0 = _mm512_loadu_si512(b + g * kNr * 4);
        const __m512i b1 = _mm512_loadu_si512(b + g * kNr * 4 + 64);
#pragma GCC unroll 4
        for (int m = 0; m < kRows; ++m) {
          const __m512i av = _mm512_set1_epi32(a_words[g * kMr + r0 + m]);
          d[m][0] = _mm512_dpbusd_epi32(d[m][0], b0, av);
          d[m][1] = _mm512_dpbusd_epi32(d[m][1], b1, av);
        }
      }
      const float* sb_row = reinterpret_cast<const float*>(b + block_len * kNr);
      if constexpr (UniformB) {
        alignas(16) float s[2][kRows];
        const __m128 sa4 = _mm_loadu_ps(sa + r0);
        _mm_store_ps(s[0], _mm_mul_ps(sa4, _mm_set1_ps(sb_row[0])));
        _mm_store_ps(s[1], _mm_mul_ps(sa4, _mm_set1_ps(sb_row[16])));
#pragma GCC unroll 4
        for (int m = 0; m < kRows; ++m) {
          c[m][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[m][0]), _mm512_set1_ps(s[0][m]), c[m][0]);
          c[m][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[m][1]), _mm512_set1_ps(s[1][m]), c[m][1]);
        }
      } else {
        const __m512 sb0 = _mm512_loadu_ps(sb_row), sb1 = _mm512_loadu_ps(sb_row + 16);
#pragma GCC unroll 4
        for (int m = 0; m < kRows; ++m) {
          const __m512 sam = _mm512_set1_ps(sa[r0 + m]);
          c[m][0] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(d[m][0]), sb0), sam, c[m][0]);
          c[m][1] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(d[m][1]), sb1), sam, c[m][1]);
        }
      }
      a += int8_a_block_bytes(block_len);
      b += int8_b_block_bytes(block_len);
    }
#pragma GCC unroll 4
    for (int m = 0; m < kRows; ++m)
      for (int h = 0; h < 2; ++h) _mm512_storeu_ps(acc + (r0 + m) * kNr + 16 * h, c[m][h]);
  }
}

void f32_avx512(const uint8_t* pa, const uint8_t* pb, int64_t ks, float* acc, bool first) {
  __m512 c[kMr][2];
  for (int m = 0; m < kMr; ++m) {
    c[m][0] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + m * kNr);
    c[m][1] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + m * kNr + 16);
  }
  const float* a = reinterpret_cast<const float*>(pa);
  const float* b = reinterpret_cast<const float*>(pb);
  for (int64_t k = 0; k < ks; ++k, a += kMr, b += kNr) {
    const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
#pragma GCC unroll 8
    for (int m = 0; m < kMr; ++m) {
      const __m512 av = _mm512_set1_ps(a[m]);
      c[m][0] = _mm512_fmadd_ps(av, b0, c[m][0]);
      c[m][1] = _mm512_fmadd_ps(av, b1, c[m][1]);
    }
  }
  for (int m = 0; m < kMr; ++m) {
    _mm512_storeu_ps(acc + m * kNr, c[m][0]);
    _mm512_storeu_ps(acc + m * kNr + 16, c[m][1]);
  }
}

}  // namespace

MicroKernel int8_micro_kernel_avx512(int64_t block_len, bool b_uniform) {
  if (block_len == 32) return &int8_blocks_avx512<8, false>;
  return b_uniform ? &int8_blocks_avx512<4, true> : &int8_blocks_avx512<4, false>;
}
MicroKernel f32_micro_kernel_avx512() { return &f32_avx512; }

// Whole 64-byte lines streamed (a partial line's non-temporal store costs a read at the memory).
void stream_scaled_avx512(const float* in, int64_t n, float scale, float* out) {
  int64_t j = 0;
  for (; j < n && (reinterpret_cast<uintptr_t>(out + j) & 63) != 0; ++j) out[j] = scale * in[j];
  const __m512 s = _mm512_set1_ps(scale);
  for (; j + 16 <= n; j += 16) _mm512_stream_ps(out + j, _mm512_mul_ps(s, _mm512_loadu_ps(in + j)));
  for (; j < n; ++j) out[j] = scale * in[j];
}

}  // namespace nibble::cpu::gemm_detail
