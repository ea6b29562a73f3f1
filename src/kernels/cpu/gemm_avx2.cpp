// AVX2 micro-kernels over the packed panels (gemm_kernels.h). Without VNNI, a block's integer
// dot product is vpmaddubsw (u8 x s8 -> pairs summed to int16; at most 2*24*12 = 576, so it never
// saturates) summed over the block's groups in int16 (at most 16*288 = 4608), then one vpmaddwd
// against ones to widen to int32. With 16 ymm registers the 8x32 tile is done 4 rows x 8 columns
// at a time so that the accumulators, B and the broadcasts stay in registers.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/gemm_kernels.h"

namespace nibble::cpu::gemm_detail {
namespace {

// One pass over the blocks for rows [r0, r0 + Rows) x columns [8 q, 8 q + 8) of the 8 x 32 tile.
// Rows = 4 keeps the accumulators, B's groups and the temporaries in the 16 ymm registers; all 8
// rows at once spilled the accumulators to the stack on every block (~1/3 slower).
template <int64_t Groups, int Rows>
inline void int8_pass_avx2(const uint8_t* pa, const uint8_t* pb, int64_t blocks, float* acc, bool first, int r0,
                           int quarter) {
  constexpr int64_t block_len = Groups * 4;
  // NVFP4 (16-blocks): the scales are E4M3 values (4 significant bits, within [2^-9, 448]), so
  // their product is exact, and so is |dot| (< 2^12) times it. MXFP4's E8M0 scales (2^-127..2^127)
  // could underflow or overflow as a product: there sb multiplies dot first, as the scalar kernel.
  constexpr bool kScaleProductExact = Groups == 4;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 c[Rows];
#pragma GCC unroll 8
  for (int m = 0; m < Rows; ++m)
    c[m] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + (r0 + m) * kNr + 8 * quarter);
  const uint8_t* a = pa;
  const uint8_t* b = pb;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int32_t* a_words = reinterpret_cast<const int32_t*>(a);
    const int32_t* init = reinterpret_cast<const int32_t*>(a + block_len * kMr);
    const float* sa = reinterpret_cast<const float*>(a + block_len * kMr + 4 * kMr);
    const __m256 sb = _mm256_loadu_ps(reinterpret_cast<const float*>(b + block_len * kNr) + 8 * quarter);
    __m256i bv[Groups];
#pragma GCC unroll 8
    for (int64_t g = 0; g < Groups; ++g)
      bv[g] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + g * kNr * 4 + 32 * quarter));
#pragma GCC unroll 8
    for (int m = r0; m < r0 + Rows; ++m) {
      // The group products summed as a tree (two adds deep instead of Groups - 1).
      __m256i part[Groups];
#pragma GCC unroll 8
      for (int64_t g = 0; g < Groups; ++g) part[g] = _mm256_maddubs_epi16(bv[g], _mm256_set1_epi32(a_words[g * kMr + m]));
#pragma GCC unroll 8
      for (int64_t width = 1; width < Groups; width *= 2)
#pragma GCC unroll 8
        for (int64_t g = 0; g + width < Groups; g += 2 * width) part[g] = _mm256_add_epi16(part[g], part[g + width]);
      const __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(part[0], ones), _mm256_set1_epi32(init[m]));
      if constexpr (kScaleProductExact) {
        // sa * sb is exact, and so is dot * sa * sb: one rounding as below, one multiply less on the
        // path from the products to the accumulator.
        c[m - r0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(sb, _mm256_set1_ps(sa[m])), c[m - r0]);
      } else {
        c[m - r0] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(dot), sb), _mm256_set1_ps(sa[m]), c[m - r0]);
      }
    }
    a += int8_a_block_bytes(block_len);
    b += int8_b_block_bytes(block_len);
  }
#pragma GCC unroll 8
  for (int m = 0; m < Rows; ++m) _mm256_storeu_ps(acc + (r0 + m) * kNr + 8 * quarter, c[m]);
}

template <int64_t Groups>
void int8_blocks_avx2(const uint8_t* pa, const uint8_t* pb, int64_t blocks, float* acc, bool first) {
  for (int quarter = 0; quarter < 4; ++quarter)
    for (int r0 = 0; r0 < kMr; r0 += 4) int8_pass_avx2<Groups, 4>(pa, pb, blocks, acc, first, r0, quarter);
}

// One pass over the k chunk for Rows rows x 8*Vecs columns of the 8 x 32 tile, starting at (r0, n0).
// Every loop over c is unrolled so that c lives in registers (a loop left rolled makes GCC keep c
// on the stack and store it every k, which halved the speed).
template <int Rows, int Vecs>
inline void f32_pass_avx2(const float* pa, const float* pb, int64_t ks, float* acc, bool first, int r0, int n0) {
  __m256 c[Rows][Vecs];
#pragma GCC unroll 8
  for (int m = 0; m < Rows; ++m)
#pragma GCC unroll 4
    for (int h = 0; h < Vecs; ++h)
      c[m][h] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + (r0 + m) * kNr + n0 + 8 * h);
  const float* a = pa + r0;
  const float* b = pb + n0;
  for (int64_t k = 0; k < ks; ++k, a += kMr, b += kNr) {
    __m256 bv[Vecs];
#pragma GCC unroll 4
    for (int h = 0; h < Vecs; ++h) bv[h] = _mm256_loadu_ps(b + 8 * h);
#pragma GCC unroll 8
    for (int m = 0; m < Rows; ++m) {
      const __m256 av = _mm256_broadcast_ss(a + m);
#pragma GCC unroll 4
      for (int h = 0; h < Vecs; ++h) c[m][h] = _mm256_fmadd_ps(av, bv[h], c[m][h]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < Rows; ++m)
#pragma GCC unroll 4
    for (int h = 0; h < Vecs; ++h) _mm256_storeu_ps(acc + (r0 + m) * kNr + n0 + 8 * h, c[m][h]);
}

// The 8 x 32 tile in three passes: rows 0-3 and 4-7 of columns 0-23 (12 accumulators, three B
// loads and four broadcasts per k: all 16 ymm registers), then all 8 rows of columns 24-31 (8
// accumulators). With FMA latency 4 on two pipes, 8 independent accumulators are exactly enough
// in theory and in practice ran at ~56 % of the FMA peak (four passes of 4 x 16 before); 12 keep
// both pipes busy through load hiccups. Each output is still one FMA per k, in k order.
void f32_avx2(const uint8_t* pa, const uint8_t* pb, int64_t ks, float* acc, bool first) {
  const float* a = reinterpret_cast<const float*>(pa);
  const float* b = reinterpret_cast<const float*>(pb);
  f32_pass_avx2<5, 2>(a, b, ks, acc, first, 0, 0);
  f32_pass_avx2<5, 2>(a, b, ks, acc, first, 0, 16);
  f32_pass_avx2<3, 4>(a, b, ks, acc, first, 5, 0);
}

}  // namespace

MicroKernel int8_micro_kernel_avx2(int64_t block_len) {
  return block_len == 32 ? &int8_blocks_avx2<8> : &int8_blocks_avx2<4>;
}
MicroKernel f32_micro_kernel_avx2() { return &f32_avx2; }

}  // namespace nibble::cpu::gemm_detail
