// AVX2 micro-kernels over the packed panels (gemm_kernels.h). Without VNNI, a block's integer
// dot product is vpmaddubsw (u8 x s8 -> pairs summed to int16; at most 2*24*12 = 576, so it never
// saturates) summed over the block's groups in int16 (at most 8*576 = 4608), then one vpmaddwd
// against ones to widen to int32. The int8 kernel reads the AVX2 panels: A biased (the broadcast
// side), B signed with the per-column init sums, so B's vectors feed vpmaddubsw from memory.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "format/codecs.h"  // kE2M1TimesTwo only: no inline code of it is used here
#include "kernels/cpu/gemm/gemm_kernels.h"

namespace nibble::cpu::gemm_detail {
namespace {

// One pass over the blocks for rows [r0, r0 + Rows) x columns [n0, n0 + 8 Vecs) of the 8 x 32 tile.
// Each broadcast of A feeds Vecs products and the init sums are one vector per block for all rows:
// 4 x 2 passes beat 4 x 1 passes over the A-signed layout, where each row broadcast its init sum
// (the tile's ops per row are otherwise the same).
// UniformB: B is 16x16-tiled NVFP4 (the weights in fprop and dgrad), so the pass's 16 columns share
// one scale per block: sA * sB is formed for the pass's rows at once and each row's epilogue is
// cvt + fma, without the per-vector multiply (the same exact product as below, the same bits).
template <int64_t Groups, int Rows, int Vecs, bool UniformB>
inline void int8_pass_avx2(const uint8_t* pa, const uint8_t* pb, int64_t blocks, float* acc, bool first, int r0,
                           int n0) {
  static_assert(!UniformB || (Groups == 4 && Rows == 4 && Vecs == 2), "uniform B: NVFP4, 4 rows x 16 columns");
  constexpr int64_t block_len = Groups * 4;
  constexpr int64_t a_stride = int8_biased_block_bytes(block_len, kMr);
  constexpr int64_t b_stride = int8_signed_block_bytes(block_len, kNr);
  // NVFP4 (16-blocks): the scales are E4M3 values (4 significant bits, within [2^-9, 448]), so
  // their product is exact, and so is |dot| (<= 2304 < 2^12) times it. MXFP4's E8M0 scales (2^-127..2^127)
  // could underflow or overflow as a product: there sb multiplies dot first, as the scalar kernel.
  constexpr bool kScaleProductExact = Groups == 4;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 c[Rows][Vecs];
#pragma GCC unroll 8
  for (int m = 0; m < Rows; ++m)
#pragma GCC unroll 4
    for (int h = 0; h < Vecs; ++h)
      c[m][h] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + (r0 + m) * kNr + n0 + 8 * h);
  const uint8_t* a = pa;
  const uint8_t* b = pb;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int32_t* a_words = reinterpret_cast<const int32_t*>(a);
    const float* sa = reinterpret_cast<const float*>(a + block_len * kMr);
    const int32_t* init = reinterpret_cast<const int32_t*>(b + block_len * kNr);
    const float* sb = reinterpret_cast<const float*>(b + block_len * kNr + 4 * kNr);
    alignas(16) float s[Rows];  // UniformB: sA * sB of each row
    if constexpr (UniformB) _mm_store_ps(s, _mm_mul_ps(_mm_loadu_ps(sa + r0), _mm_set1_ps(sb[n0])));
#pragma GCC unroll 8
    for (int m = r0; m < r0 + Rows; ++m) {
      // The group products of each vector summed in int16 as they come (at most 4608).
      __m256i part[Vecs];
#pragma GCC unroll 8
      for (int64_t g = 0; g < Groups; ++g) {
        const __m256i av = _mm256_set1_epi32(a_words[g * kMr + m]);
#pragma GCC unroll 4
        for (int h = 0; h < Vecs; ++h) {
          const __m256i bv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + (g * kNr + n0 + 8 * h) * 4));
          const __m256i p = _mm256_maddubs_epi16(av, bv);
          part[h] = g == 0 ? p : _mm256_add_epi16(part[h], p);
        }
      }
      const __m256 sam = _mm256_set1_ps(UniformB ? s[m - r0] : sa[m]);
#pragma GCC unroll 4
      for (int h = 0; h < Vecs; ++h) {
        const __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(part[h], ones),
                                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(init + n0 + 8 * h)));
        if constexpr (UniformB) {
          c[m - r0][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), sam, c[m - r0][h]);
          continue;
        }
        const __m256 sbv = _mm256_loadu_ps(sb + n0 + 8 * h);
        if constexpr (kScaleProductExact) {
          // sa * sb is exact, and so is dot * sa * sb: one rounding as below, one multiply less on
          // the path from the products to the accumulator.
          c[m - r0][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(sbv, sam), c[m - r0][h]);
        } else {
          c[m - r0][h] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(dot), sbv), sam, c[m - r0][h]);
        }
      }
    }
    a += a_stride;
    b += b_stride;
  }
#pragma GCC unroll 8
  for (int m = 0; m < Rows; ++m)
#pragma GCC unroll 4
    for (int h = 0; h < Vecs; ++h) _mm256_storeu_ps(acc + (r0 + m) * kNr + n0 + 8 * h, c[m][h]);
}

template <int64_t Groups, bool UniformB>
void int8_blocks_avx2(const uint8_t* pa, const uint8_t* pb, int64_t blocks, float* acc, bool first) {
  for (int n0 = 0; n0 < kNr; n0 += 16)
    for (int r0 = 0; r0 < kMr; r0 += 4) int8_pass_avx2<Groups, 4, 2, UniformB>(pa, pb, blocks, acc, first, r0, n0);
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
// in theory but leave the pipes idle at every load hiccup (as four passes of 4 x 16 would); 12 keep
// both pipes busy through them. Each output is still one FMA per k, in k order.
void f32_avx2(const uint8_t* pa, const uint8_t* pb, int64_t ks, float* acc, bool first) {
  const float* a = reinterpret_cast<const float*>(pa);
  const float* b = reinterpret_cast<const float*>(pb);
  f32_pass_avx2<5, 2>(a, b, ks, acc, first, 0, 0);
  f32_pass_avx2<5, 2>(a, b, ks, acc, first, 0, 16);
  f32_pass_avx2<3, 4>(a, b, ks, acc, first, 5, 0);
}

#include "kernels/cpu/gemm/e2m1_nibbles_sse.inc"

// x[i] holds 4 groups (4 bytes each) of row i; group g of rows 0..3 goes to out + g * group_stride,
// row after row: a 4 x 4 transpose of 32-bit words.
[[gnu::always_inline]] inline void store_groups_of_4_rows(const __m128i x[4], uint8_t* out, int64_t group_stride) {
  const __m128i t0 = _mm_unpacklo_epi32(x[0], x[1]), t1 = _mm_unpackhi_epi32(x[0], x[1]);
  const __m128i t2 = _mm_unpacklo_epi32(x[2], x[3]), t3 = _mm_unpackhi_epi32(x[2], x[3]);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_unpacklo_epi64(t0, t2));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + group_stride), _mm_unpackhi_epi64(t0, t2));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * group_stride), _mm_unpacklo_epi64(t1, t3));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 3 * group_stride), _mm_unpackhi_epi64(t1, t3));
}

// Sum of 16 signed bytes.
inline int32_t sum_i8x16(__m128i v) {
  const __m128i biased = _mm_sad_epu8(_mm_xor_si128(v, _mm_set1_epi8(static_cast<char>(0x80))), _mm_setzero_si128());
  return _mm_cvtsi128_si32(biased) + _mm_extract_epi16(biased, 4) - 16 * 128;
}

// The int8 panels of gemm_kernels.h for `Rows` rows, per block: codes[groups][Rows][4] (doubled
// E2M1 when kSigned, doubled + 12 otherwise; padding rows 0), then for a signed panel the init sums
// -12 * sum(row's codes), then the decoded scales (padding 0) -- the same bytes as the table
// packers in gemm_pack.cpp.
// The operand's fields are read into locals once: the panel is written through byte pointers, which
// may alias anything as far as the compiler knows, so read through q they were loaded again for
// every scale stored.
template <int Rows, bool kSigned>
void pack_int8_panel(const E2m1PanelSource& q, int64_t row0, uint8_t* dst) {
  const float* const scale_of = q.scale_of;
  const int64_t block_len = q.block_len, blocks = q.cols / block_len, halves = block_len / 16;
  const int64_t stride = kSigned ? int8_signed_block_bytes(block_len, Rows) : int8_biased_block_bytes(block_len, Rows);
  const int64_t row_bytes = q.cols / 2;
  const __m128i table = _mm_add_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kE2M1TimesTwo)),
                                     _mm_set1_epi8(kSigned ? 0 : 12));
  const int inside = static_cast<int>(std::min<int64_t>(Rows, q.rows - row0));
  const uint8_t* const first_row = q.codes + row0 * row_bytes;
  const uint8_t* const first_scales = q.scales + row0 * blocks;
  for (int64_t b = 0; b < blocks; ++b) {
    uint8_t* blk = dst + b * stride;
    int32_t sums[Rows] = {};
    for (int r0 = 0; r0 < Rows; r0 += 4)
      for (int64_t h = 0; h < halves; ++h) {
        __m128i x[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
          const int r = r0 + i;
          x[i] = r < inside ? e2m1x16(first_row + r * row_bytes + b * (block_len / 2) + 8 * h, table) : _mm_setzero_si128();
          if constexpr (kSigned) sums[r] += sum_i8x16(x[i]);
        }
        store_groups_of_4_rows(x, blk + (4 * h * Rows + r0) * 4, Rows * 4);
      }
    uint8_t* tail = blk + block_len * Rows;
    if constexpr (kSigned) {
      for (int r = 0; r < Rows; ++r) {
        const int32_t init = -12 * sums[r];
        std::memcpy(tail + 4 * r, &init, 4);
      }
      tail += 4 * Rows;
    }
    float scales[Rows];
    for (int r = 0; r < Rows; ++r) scales[r] = r < inside ? scale_of[first_scales[r * blocks + b]] : 0.0f;
    std::memcpy(tail, scales, sizeof scales);
  }
}

#include "kernels/cpu/common/bf16_round_avx2.inc"
#include "kernels/cpu/common/transpose8x8_avx.inc"

// The first n (0..8) floats at p, the rest 0; reads nothing past p + n.
inline __m256 load_first(const float* p, int64_t n) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), lanes));
}

// The f32 panel of gemm_kernels.h with Width rows (kMr for A, kNr for B): element r of every k is
// x(row0 + r, k), 0 past the edge -- the bytes of the scalar packers in gemm_pack.cpp. A
// K-contiguous operand is read 8 rows x 8 k at a time and transposed in registers instead of the
// scalar packer's strided stores, one float at a time, which weigh on the BF16-kept layers' GEMMs at
// small K.
template <int Width>
void pack_f32_operand_panel(const F32Operand& x, int64_t row0, uint8_t* dst) {
  static_assert(Width % 8 == 0);
  float* out = reinterpret_cast<float*>(dst);
  const int64_t rows = std::min<int64_t>(Width, x.rows - row0);
  if (x.k_contiguous) {
    const int64_t k8 = x.k / 8 * 8;
    for (int r0 = 0; r0 < Width; r0 += 8) {
      const float* src[8];
      for (int i = 0; i < 8; ++i) src[i] = r0 + i < rows ? x.p + (row0 + r0 + i) * x.ld : nullptr;
      for (int64_t k = 0; k < x.k; k += 8) {
        __m256 v[8];
        for (int i = 0; i < 8; ++i)
          v[i] = src[i] == nullptr ? _mm256_setzero_ps()
                 : k < k8          ? _mm256_loadu_ps(src[i] + k)
                                   : load_first(src[i] + k, x.k - k);
        transpose8x8_in_registers(v);
        for (int j = 0; j < 8 && k + j < x.k; ++j) _mm256_storeu_ps(out + (k + j) * Width + r0, v[j]);
      }
    }
    return;
  }
  for (int64_t k = 0; k < x.k; ++k) {
    const float* src = x.p + k * x.ld + row0;
    float* dst_k = out + k * Width;
    for (int64_t r = 0; r < Width; r += 8) {
      const __m256 v = r + 8 <= rows ? _mm256_loadu_ps(src + r)
                       : r < rows    ? load_first(src + r, rows - r)
                                     : _mm256_setzero_ps();
      _mm256_storeu_ps(dst_k + r, v);
    }
  }
}


// BF16 bits of 8 floats (RN-even, NaN quiet: round_to_bf16) in the low half of each 32-bit lane.
inline __m256i bf16_low(__m256 v) { return _mm256_srli_epi32(_mm256_castps_si256(round_to_bf16(v)), 16); }

// 16 floats of a row -> its 8 BF16 pairs (k, k + 1) as 8 dwords, in k order.
inline __m256 bf16_pairs_of_16(const float* src) {
  const __m256i packed = _mm256_packus_epi32(bf16_low(_mm256_loadu_ps(src)), bf16_low(_mm256_loadu_ps(src + 8)));
  return _mm256_castsi256_ps(_mm256_permute4x64_epi64(packed, 0xD8));  // packus works per 128-bit lane
}

// The BF16-pair panel of gemm_kernels.h with Width rows, the bytes of the scalar pair packers in
// gemm_pack.cpp: lane r of pair p is bf16(x(row0 + r, 2p)) | bf16(x(row0 + r, 2p + 1)) << 16, zero
// past the edge and for an odd K's last high half. A K-contiguous operand goes 8 rows x 16 k at a
// time (rounded, packed into pairs, 8 x 8 transposed in registers); a row-contiguous one pairs two
// k-rows lane by lane. The scalar packers cost a fifth of a bf16 training step.
constexpr int64_t kPairPrefetch = 4;

template <int Width>
void pack_bf16_pair_operand_panel(const F32Operand& x, int64_t row0, uint8_t* dst) {
  static_assert(Width % 8 == 0);
  float* out = reinterpret_cast<float*>(dst);
  const int64_t rows = std::min<int64_t>(Width, x.rows - row0), pairs = (x.k + 1) / 2;
  if (!x.k_contiguous) {
    const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
    const auto load = [&](const float* p, int64_t r) {
      return p == nullptr || r >= rows ? _mm256_setzero_ps() : r + 8 <= rows ? _mm256_loadu_ps(p + r) : load_first(p + r, rows - r);
    };
    for (int64_t p = 0; p < pairs; ++p) {
      const float* lo = x.p + 2 * p * x.ld + row0;
      const float* hi = 2 * p + 1 < x.k ? lo + x.ld : nullptr;
      // Each k-row gives the panel Width floats, a row stride apart: the prefetchers do not follow,
      // so the k-rows kPairPrefetch pairs ahead are requested now.
      if (2 * (p + kPairPrefetch) + 1 < x.k)
        for (int64_t r = 0; r < Width; r += 16) {
          _mm_prefetch(reinterpret_cast<const char*>(lo + 2 * kPairPrefetch * x.ld + r), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(lo + (2 * kPairPrefetch + 1) * x.ld + r), _MM_HINT_T0);
        }
      for (int64_t r = 0; r < Width; r += 8) {
        const __m256i h = _mm256_and_si256(_mm256_castps_si256(round_to_bf16(load(hi, r))), high);
        _mm256_storeu_ps(out + p * Width + r, _mm256_castsi256_ps(_mm256_or_si256(bf16_low(load(lo, r)), h)));
      }
    }
    return;
  }
  const int64_t k16 = x.k / 16 * 16;
  alignas(32) float tail[8][16];  // the last k < 16 of each row, zero-padded (an odd K's empty high half)
  for (int r0 = 0; r0 < Width; r0 += 8) {
    // Whole 16-k steps: the 8 rows in registers, unrolled (rolled, with the tail's copies in the same
    // loop, GCC kept them in stack memory).
    for (int64_t k = 0; k < k16; k += 16) {
      __m256 v[8];
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i)
        v[i] = r0 + i < rows ? bf16_pairs_of_16(x.p + (row0 + r0 + i) * x.ld + k) : _mm256_setzero_ps();
      transpose8x8_in_registers(v);
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) _mm256_storeu_ps(out + (k / 2 + j) * Width + r0, v[j]);
    }
    for (int64_t k = k16; k < x.k; k += 16) {
      std::memset(tail, 0, sizeof tail);
      __m256 v[8];
      for (int i = 0; i < 8; ++i) {
        if (r0 + i >= rows) {
          v[i] = _mm256_setzero_ps();
          continue;
        }
        std::memcpy(tail[i], x.p + (row0 + r0 + i) * x.ld + k, static_cast<size_t>(x.k - k) * sizeof(float));
        v[i] = bf16_pairs_of_16(tail[i]);
      }
      transpose8x8_in_registers(v);
      for (int64_t j = 0; j < 8 && k / 2 + j < pairs; ++j) _mm256_storeu_ps(out + (k / 2 + j) * Width + r0, v[j]);
    }
  }
}

}  // namespace

void pack_int8_a_panel_avx2(const E2m1PanelSource& q, int64_t row0, uint8_t* dst) {
  pack_int8_panel<kMr, true>(q, row0, dst);
}
void pack_int8_b_panel_avx2(const E2m1PanelSource& q, int64_t row0, uint8_t* dst) {
  pack_int8_panel<kNr, false>(q, row0, dst);
}
void pack_int8_biased_a_panel_avx2(const E2m1PanelSource& q, int64_t row0, uint8_t* dst) {
  pack_int8_panel<kMr, false>(q, row0, dst);
}
void pack_int8_signed_b_panel_avx2(const E2m1PanelSource& q, int64_t row0, uint8_t* dst) {
  pack_int8_panel<kNr, true>(q, row0, dst);
}

void pack_f32_a_panel_avx2(const F32Operand& x, int64_t row0, uint8_t* dst) { pack_f32_operand_panel<kMr>(x, row0, dst); }
void pack_f32_b_panel_avx2(const F32Operand& x, int64_t row0, uint8_t* dst) { pack_f32_operand_panel<kNr>(x, row0, dst); }

// widen_bf16_pairs (gemm_pack.cpp) eight lanes at a time: each unit's pairs are loaded whole before
// its two steps are stored (the last unit's steps overlap its pairs).
void widen_bf16_pairs_avx2(int64_t width, int64_t pairs, uint8_t* dst) {
  float* out = reinterpret_cast<float*>(dst);
  const float* in = out + pairs * width;
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  const __m256i exponent = _mm256_set1_epi32(0x7F800000), magnitude = _mm256_set1_epi32(0x7FFFFFFF);
  // A subnormal (zero exponent field) keeps only its sign.
  const auto flushed = [&](__m256i v) {
    const __m256i zero_exponent = _mm256_cmpeq_epi32(_mm256_and_si256(v, exponent), _mm256_setzero_si256());
    return _mm256_castsi256_ps(_mm256_andnot_si256(_mm256_and_si256(zero_exponent, magnitude), v));
  };
  const int64_t vectors = width / 8;  // width is kMr or kNr: 1 or 4 vectors
  for (int64_t p = 0; p < pairs; ++p) {
    __m256i v[kNr / 8];
    for (int64_t j = 0; j < vectors; ++j) v[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + p * width + 8 * j));
    for (int64_t j = 0; j < vectors; ++j) {
      _mm256_storeu_ps(out + (2 * p) * width + 8 * j, flushed(_mm256_and_si256(v[j], high)));
      _mm256_storeu_ps(out + (2 * p + 1) * width + 8 * j, flushed(_mm256_slli_epi32(v[j], 16)));
    }
  }
}

void pack_bf16_pair_a_panel_avx2(const F32Operand& x, int64_t row0, uint8_t* dst) {
  pack_bf16_pair_operand_panel<kMr>(x, row0, dst);
}
void pack_bf16_pair_b_panel_avx2(const F32Operand& x, int64_t row0, uint8_t* dst) {
  pack_bf16_pair_operand_panel<kNr>(x, row0, dst);
}

MicroKernel int8_micro_kernel_avx2(int64_t block_len, bool b_uniform) {
  if (block_len == 32) return &int8_blocks_avx2<8, false>;
  return b_uniform ? &int8_blocks_avx2<4, true> : &int8_blocks_avx2<4, false>;
}
MicroKernel f32_micro_kernel_avx2() { return &f32_avx2; }

void stream_scaled_avx2(const float* in, int64_t n, float scale, float* out) {
  int64_t j = 0;
  for (; j < n && (reinterpret_cast<uintptr_t>(out + j) & 31) != 0; ++j) out[j] = scale * in[j];
  const __m256 s = _mm256_set1_ps(scale);
  for (; j + 8 <= n; j += 8) _mm256_stream_ps(out + j, _mm256_mul_ps(s, _mm256_loadu_ps(in + j)));
  for (; j < n; ++j) out[j] = scale * in[j];
}

}  // namespace nibble::cpu::gemm_detail
