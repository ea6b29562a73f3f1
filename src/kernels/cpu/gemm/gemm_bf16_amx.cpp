// AMX-BF16 kernel with FP32 element-product summation (Summation::fp32_products, gemm.h): the spec's
// section 7 route, the one Hopper takes. Every E2M1 value times its E4M3 block scale is exact in BF16
// (<= 6 significant bits, magnitudes 2^-10..2688), as are E4M3/E5M2 values and E2M1 times an E8M0
// scale within BF16's normal range, so packing decodes each operand once to BF16 and tdpbf16ps
// multiplies every pair exactly and accumulates in FP32 inside the tile unit. No per-block epilogue
// is left on the vector ports (the limit of the int8 kernels, gemm_amx.cpp): a 32x32 micro-tile keeps
// its four FP32 accumulators in tiles over a whole K chunk. The same micro-kernel runs gemm_bf16,
// whose FP32 operands are rounded to BF16 while they are packed.
//
// The tile unit's FP32 accumulation has its own internal rounding (it matches neither sequential,
// pairwise nor fused scalar models on Sapphire Rapids), so this path is tested against the FP64
// reference with the FP32-accumulation bound, not bitwise. Its order is fixed by the packing and the
// driver's K chunks, never by the thread, so results are bitwise identical for any thread count.
#ifdef NIBBLE_EMULATED_INTRINSICS
// tests/emulated/: a software model of the tile, AVX-512 and SSE intrinsics below, so that this
// file's packers and tile walk are tested on CPUs without AMX too.
#include NIBBLE_EMULATED_INTRINSICS
#else
#include <immintrin.h>
#endif

#include <bit>
#include <cstdint>
#include <cstring>

#include "format/codecs.h"  // kE2M1Values only (data): no inline code from headers in an ISA file
#include "kernels/cpu/gemm/gemm_kernels.h"

// GCC 12 false positives inside the intrinsic headers (see gemm_amx.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace nibble::cpu::gemm_detail {
namespace {

#include "kernels/cpu/gemm/amx_tiles.inc"
#include "kernels/cpu/common/transpose16x16_avx512.inc"

// Tiles: 0-3 the four 16x16 FP32 accumulators of the 32x32 micro-tile; 4,5 A (16 rows x 32 BF16);
// 6,7 B (16 k-pairs x 16 columns x 2 BF16): full_tiles_config().

// acc: 32x32 FP32, `stride` floats per row. Each unit: two A tiles x two B tiles -> four tdpbf16ps.
void tiles_amx(const uint8_t* pa, const uint8_t* pb, int64_t units, float* acc, int64_t stride, bool first) {
  const int64_t ld = stride * 4;  // bytes per accumulator row
  if (first) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  } else {
    _tile_loadd(0, acc, ld);
    _tile_loadd(1, acc + 16, ld);
    _tile_loadd(2, acc + 16 * stride, ld);
    _tile_loadd(3, acc + 16 * stride + 16, ld);
  }
  for (int64_t u = 0; u < units; ++u) {
    const uint8_t* a = pa + u * kBf16UnitBytes;
    const uint8_t* b = pb + u * kBf16UnitBytes;
    _tile_loadd(4, a, 64);
    _tile_loadd(6, b, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(7, b + kBf16UnitBytes / 2, 64);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(5, a + kBf16UnitBytes / 2, 64);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, acc, ld);
  _tile_stored(1, acc + 16, ld);
  _tile_stored(2, acc + 16 * stride, ld);
  _tile_stored(3, acc + 16 * stride + 16, ld);
}

// The driver's micro-kernel: acc in its scratch macro tile (stride kBf16AccStride).
void bf16_tiles_amx(const uint8_t* pa, const uint8_t* pb, int64_t units, float* acc, bool first) {
  tiles_amx(pa, pb, units, acc, kBf16AccStride, first);
}

// Two rows of 16 floats (k and k+1 of the same 16 columns) -> 16 dwords, each the BF16 pair
// (k low, k+1 high) of one column: the tile unit's pair order. vcvtne2ps2bf16 rounds to nearest
// even and keeps NaN quiet with its sign and upper payload, as bf16_from_float_rn does; unlike it,
// it treats FP32 subnormal inputs (|x| < 2^-126) as zero, a difference far below the FP32
// accumulation bound of gemm_bf16.
inline __m512i pair_rows(__m512 k0, __m512 k1) {
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                              21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(interleave, std::bit_cast<__m512i>(_mm512_cvtne2ps_pbh(k1, k0)));
}

// 32 consecutive k of one row (16 floats each half) -> 16 dwords of consecutive k pairs.
inline __m512i pair_row(__m512 lo, __m512 hi) { return std::bit_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)); }

inline __m512 load16(const float* p, int64_t valid) {
  if (valid >= 16) return _mm512_loadu_ps(p);
  if (valid <= 0) return _mm512_setzero_ps();
  return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << valid) - 1), p);
}

// One 16-row x 32-k block of a K-contiguous operand as 16x16 dwords (BF16 pairs). by_row: out[r]
// holds row r's 16 k pairs (A tile order); else out[g] holds k pair g of the 16 rows (B tile order).
// load(row, k0, valid) gives 16 values of `row` from k0 on, zero past `valid`. Rows past the operand
// are zero.
template <class Load>
void block_pairs_k_contiguous(Load load, int64_t rows, int64_t k, int64_t r0, int64_t k0, bool by_row, __m512i out[16]) {
  const int64_t rows_left = rows - r0, k_left = k - k0;
  for (int r = 0; r < 16; ++r)
    out[r] = r < rows_left ? pair_row(load(r0 + r, k0, k_left), load(r0 + r, k0 + 16, k_left - 16)) : _mm512_setzero_si512();
  if (!by_row) transpose16x16(out);
}

// The same block of an FP32 operand, either orientation.
void block_pairs(const F32Operand& x, int64_t r0, int64_t k0, bool by_row, __m512i out[16]) {
  if (x.k_contiguous) {
    const auto load = [&x](int64_t row, int64_t k, int64_t valid) { return load16(x.p + row * x.ld + k, valid); };
    return block_pairs_k_contiguous(load, x.rows, x.k, r0, k0, by_row, out);
  }
  const int64_t rows_left = x.rows - r0, k_left = x.k - k0;
  for (int g = 0; g < 16; ++g) {
    const int64_t k = 2 * g;
    const __m512 a = k < k_left ? load16(x.p + (k0 + k) * x.ld + r0, rows_left) : _mm512_setzero_ps();
    const __m512 b = k + 1 < k_left ? load16(x.p + (k0 + k + 1) * x.ld + r0, rows_left) : _mm512_setzero_ps();
    out[g] = pair_rows(a, b);
  }
  if (by_row) transpose16x16(out);
}

// FP8 codes (one byte per value, rows x k row-major) decoded through the 256-entry table: E4M3 and
// E5M2 values are all exact BF16 (at most 3 mantissa bits, exponents within BF16's normal range).
void block_pairs(const Fp8PanelSource& x, int64_t r0, int64_t k0, bool by_row, __m512i out[16]) {
  const auto load = [&x](int64_t row, int64_t k, int64_t valid) {
    if (valid <= 0) return _mm512_setzero_ps();
    const __mmask16 m = valid >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << valid) - 1);
    const __m512i codes = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, x.codes + row * x.k + k));
    return _mm512_maskz_mov_ps(m, _mm512_i32gather_ps(codes, x.value_of, 4));
  };
  block_pairs_k_contiguous(load, x.rows, x.k, r0, k0, by_row, out);
}

#include "kernels/cpu/gemm/e2m1_nibbles_sse.inc"

// E2M1 codes (NVFP4 or MXFP4: 4-bit, two per byte, low nibble first) times their block scales. Each
// product is exactly a BF16 value (see the top of the file), so the RNE conversion keeps it.
void block_pairs(const E2m1PanelSource& q, int64_t r0, int64_t k0, bool by_row, __m512i out[16]) {
  const __m512 table = _mm512_loadu_ps(kE2M1Values);
  const int64_t blocks_per_row = q.cols / q.block_len;
  const auto load = [&](int64_t row, int64_t k, int64_t valid) {
    if (valid <= 0) return _mm512_setzero_ps();  // k is a multiple of 16, and so is the row length
    const __m512i index = _mm512_cvtepu8_epi32(e2m1_codes16(q.codes + row * (q.cols / 2) + k / 2));
    const float scale = q.scale_of[q.scales[row * blocks_per_row + k / q.block_len]];
    return _mm512_mul_ps(_mm512_permutexvar_ps(index, table), _mm512_set1_ps(scale));
  };
  block_pairs_k_contiguous(load, q.rows, q.cols, r0, k0, by_row, out);
}

// One panel (kBf16Panel rows of A, or columns of B) over all k of an operand with `k` columns.
template <class Source>
void pack_panel(const Source& x, int64_t k, int64_t row0, uint8_t* dst, bool a_side) {
  const int64_t units = bf16_units(k);
  __m512i block[16];
  for (int64_t u = 0; u < units; ++u)
    for (int half = 0; half < 2; ++half) {
      block_pairs(x, row0 + 16 * half, u * kBf16UnitK, a_side, block);
      uint8_t* tile = dst + u * kBf16UnitBytes + half * (kBf16UnitBytes / 2);
      for (int i = 0; i < 16; ++i) _mm512_store_si512(tile + 64 * i, block[i]);
    }
}

}  // namespace

void pack_bf16_a_panel(const E2m1PanelSource& q, int64_t row0, uint8_t* dst) { pack_panel(q, q.cols, row0, dst, true); }
void pack_bf16_b_panel(const E2m1PanelSource& q, int64_t row0, uint8_t* dst) { pack_panel(q, q.cols, row0, dst, false); }
void pack_bf16_a_panel(const F32Operand& x, int64_t row0, uint8_t* dst) { pack_panel(x, x.k, row0, dst, true); }
void pack_bf16_b_panel(const F32Operand& x, int64_t row0, uint8_t* dst) { pack_panel(x, x.k, row0, dst, false); }
void pack_bf16_a_panel(const Fp8PanelSource& x, int64_t row0, uint8_t* dst) { pack_panel(x, x.k, row0, dst, true); }
void pack_bf16_b_panel(const Fp8PanelSource& x, int64_t row0, uint8_t* dst) { pack_panel(x, x.k, row0, dst, false); }

void pack_bf16_b_panels(int64_t K, int64_t N, const float* B, int64_t ldb, uint8_t* panels) {
  const F32Operand b{B, ldb, N, K, false};  // column n's K values run down B's rows
  const int64_t panel_bytes = bf16_units(K) * kBf16UnitBytes;
  for (int64_t n0 = 0; n0 < N; n0 += kBf16Panel) pack_bf16_b_panel(b, n0, panels + n0 / kBf16Panel * panel_bytes);
}

// A's panels over its k (zero past it, so B's rows past the prefix add nothing), then one 32x32
// micro-tile at a time: the whole k in one tile-unit pass, stored into C itself when it overwrites a
// whole micro-tile, else through acc (C's edges, or added to C).
void bf16_product_amx(int64_t M, int64_t N, int64_t k, const float* A, int64_t a_row, int64_t a_k,
                      const uint8_t* b_panels, int64_t b_units, float* C, int64_t ldc, bool accumulate,
                      uint8_t* a_panels, float* acc) {
  const F32Operand a = a_k == 1 ? F32Operand{A, a_row, M, k, true} : F32Operand{A, a_k, M, k, false};
  const int64_t units = bf16_units(k), a_panel_bytes = units * kBf16UnitBytes, b_panel_bytes = b_units * kBf16UnitBytes;
  for (int64_t m0 = 0; m0 < M; m0 += kBf16Panel) pack_bf16_a_panel(a, m0, a_panels + m0 / kBf16Panel * a_panel_bytes);
  amx_bf16_thread_begin();
  for (int64_t m0 = 0; m0 < M; m0 += kBf16Panel)
    for (int64_t n0 = 0; n0 < N; n0 += kBf16Panel) {
      const uint8_t* pa = a_panels + m0 / kBf16Panel * a_panel_bytes;
      const uint8_t* pb = b_panels + n0 / kBf16Panel * b_panel_bytes;
      const int64_t rows = M - m0 < kBf16Panel ? M - m0 : kBf16Panel, cols = N - n0 < kBf16Panel ? N - n0 : kBf16Panel;
      if (!accumulate && rows == kBf16Panel && cols == kBf16Panel) {  // a whole micro-tile: the tiles go to C
        tiles_amx(pa, pb, units, C + m0 * ldc + n0, ldc, true);
        continue;
      }
      tiles_amx(pa, pb, units, acc, kBf16AccStride, true);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < cols; j += 16) {
          const int64_t n = cols - j < 16 ? cols - j : 16;
          const auto mask = static_cast<__mmask16>((1u << n) - 1);
          float* c = C + (m0 + r) * ldc + n0 + j;
          __m512 v = _mm512_maskz_loadu_ps(mask, acc + r * kBf16AccStride + j);
          if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, c));
          _mm512_mask_storeu_ps(c, mask, v);
        }
    }
  _tile_release();
}

MicroKernel bf16_micro_kernel_amx() { return &bf16_tiles_amx; }

void amx_bf16_thread_begin() { load_tile_config(full_tiles_config()); }

}  // namespace nibble::cpu::gemm_detail

namespace nibble::cpu::peaks {

// Four independent 16x16 FP32 accumulators, each fed 16x32 by 32x16 BF16 tiles (the full K).
float amx_bf16_loop(int64_t iterations) {
  alignas(64) uint16_t operand[16 * 32];
  for (int i = 0; i < 16 * 32; ++i) operand[i] = static_cast<uint16_t>(0x3F80 + (i % 7));  // ~1.0
  alignas(64) float out[16 * 16];
  gemm_detail::tile_peak_loop(operand, iterations, [] {
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 4, 5);
    _tile_dpbf16ps(2, 4, 5);
    _tile_dpbf16ps(3, 4, 5);
  }, out);
  return out[0];
}

}  // namespace nibble::cpu::peaks
