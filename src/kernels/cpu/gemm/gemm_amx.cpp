// AMX-INT8 micro-kernels over the AMX panel layouts (gemm_kernels.h).
//
// Why tiles: with vpdpbusd a 16-element block costs 4 dot-product instructions plus 3 float ops
// (cvt, *sB, fma sA) on the same two vector ports, which caps the AVX-512 kernel at 4/7 of the
// vpdpbusd peak. tdpbssd computes a whole 16x16 block product (4096 multiply-adds, signed x signed,
// so no +12 shift) on the tile unit, off the vector ports. What remains on the vector ports is the
// per-block epilogue: for each of the 16 rows, cvt + fma (2 ops) when one operand's scale is
// uniform over the tile (NVFP4 16x16 weights; from a register when it is A's, from a broadcast
// load when it is B's), cvt + mul + fma (3 ops) otherwise. The tile work (loads, tdpbssd, the store
// of each 16x16 int32 product) and the epilogue do not overlap much, so the gain over the VNNI kernel
// is small for NVFP4 and larger for MXFP4 (half as many blocks, so epilogues, per element).
//
// The epilogue performs exactly the VNNI kernel's arithmetic: the block's exact int32 becomes a
// float, is multiplied by sA*sB (both exact products, see gemm_kernels.h) and added to the FP32
// accumulator with one rounding, blocks in K order. So this kernel is bitwise identical to the
// AVX-512 and scalar kernels, whatever the thread count.
#ifdef NIBBLE_EMULATED_INTRINSICS
// tests/emulated/: a software model of the tile, AVX-512 and SSE intrinsics below, so that this
// file's packers, tile configuration, pipeline and epilogues are tested on CPUs without AMX too.
#include NIBBLE_EMULATED_INTRINSICS
#else
#include <immintrin.h>
#endif

#include <cstdint>
#include <cstring>

#include "format/codecs.h"  // kE2M1TimesTwo only (data): no inline code from headers in an ISA file
#include "kernels/cpu/gemm/gemm_kernels.h"

// GCC 12 warns that _mm512_cvtepi32_ps's internal undefined vector "may be used uninitialized"
// (a false positive inside the intrinsic header).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace nibble::cpu::gemm_detail {
namespace {

#include "kernels/cpu/gemm/amx_tiles.inc"

// Tiles: 0-3 block products (16x16 int32); 4,5 A blocks (16 rows x block_len s8); 6,7 B blocks in
// the VNNI order (block_len/4 rows of 16 columns x 4 k). Four products let the tile unit run two
// blocks ahead of the epilogue (see int8_blocks_amx).
TileConfig make_config(int64_t block_len) {
  TileConfig c;
  for (int t : {0, 1, 2, 3}) c.rows[t] = 16, c.colsb[t] = 64;
  for (int t : {4, 5}) c.rows[t] = 16, c.colsb[t] = static_cast<uint16_t>(block_len);
  for (int t : {6, 7}) c.rows[t] = static_cast<uint8_t>(block_len / 4), c.colsb[t] = 64;
  return c;
}

// Which operand's scale is the same for all 16 rows (A) or columns (B) of each block (16x16 tiles).
enum class Uniform { none, a, b };

// acc[r] += float(prod[r]) * sA[r] * sB (16 columns), per the three scale cases.
template <Uniform U>
__attribute__((always_inline)) inline void block_epilogue(const int32_t* prod, const float* sa, const float* sb, __m512* acc) {
  if constexpr (U == Uniform::a) {
    const __m512 s = _mm512_mul_ps(_mm512_set1_ps(sa[0]), _mm512_load_ps(sb));
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(prod + 16 * r)), s, acc[r]);
  } else if constexpr (U == Uniform::b) {
    alignas(64) float s[16];
    _mm512_store_ps(s, _mm512_mul_ps(_mm512_load_ps(sa), _mm512_set1_ps(sb[0])));
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r)
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(prod + 16 * r)), _mm512_set1_ps(s[r]), acc[r]);
  } else {
    const __m512 sbv = _mm512_load_ps(sb);
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) {
      const __m512 p = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(prod + 16 * r)), sbv);
      acc[r] = _mm512_fmadd_ps(p, _mm512_set1_ps(sa[r]), acc[r]);
    }
  }
}

// Products of the blocks at a, b and the next ones into tiles C0, C1, stored to out[0], out[1].
// A macro because the tile intrinsics paste their register numbers into the asm text.
#define NIBBLE_AMX_PAIR_PRODUCTS(C0, C1, a, b, out)   \
  do {                                                 \
    _tile_zero(C0);                                    \
    _tile_zero(C1);                                    \
    _tile_loadd(4, (a), BlockLen);                     \
    _tile_loadd(6, (b), 64);                           \
    _tile_dpbssd(C0, 4, 6);                            \
    _tile_loadd(5, (a) + stride, BlockLen);            \
    _tile_loadd(7, (b) + stride, 64);                  \
    _tile_dpbssd(C1, 5, 7);                            \
    _tile_stored(C0, (out)[0], 64);                    \
    _tile_stored(C1, (out)[1], 64);                    \
  } while (0)

// Software pipeline: the tile unit computes and stores pair p while the vector ports run the
// epilogue of pair p-1, which reads products stored a whole pair earlier. Reading a product right
// after its tile store stalled (a tile store does not forward to vector loads), at ~100 cycles per
// block; with the lag the loads find the data in L1.
template <int64_t BlockLen, Uniform U>
void int8_blocks_amx(const uint8_t* pa, const uint8_t* pb, int64_t blocks, float* acc_out, bool first) {
  constexpr int64_t stride = amx_block_bytes(BlockLen);
  constexpr int64_t codes = 16 * BlockLen;  // the scales follow the codes in each block
  __m512 acc[16];
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) acc[r] = first ? _mm512_setzero_ps() : _mm512_load_ps(acc_out + 16 * r);
  alignas(64) int32_t prod[4][256];
  auto epilogue = [&](int64_t blk, const int32_t* product) __attribute__((always_inline)) {
    block_epilogue<U>(product, reinterpret_cast<const float*>(pa + blk * stride + codes),
                      reinterpret_cast<const float*>(pb + blk * stride + codes), acc);
  };
  const int64_t pairs = blocks / 2;
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t blk = 2 * p;
    if (p % 2 == 0) {
      NIBBLE_AMX_PAIR_PRODUCTS(0, 1, pa + blk * stride, pb + blk * stride, prod);
    } else {
      NIBBLE_AMX_PAIR_PRODUCTS(2, 3, pa + blk * stride, pb + blk * stride, prod + 2);
    }
    if (p > 0) {
      const int half = (p - 1) % 2 * 2;
      epilogue(blk - 2, prod[half]);
      epilogue(blk - 1, prod[half + 1]);
    }
  }
  if (pairs > 0) {
    const int half = (pairs - 1) % 2 * 2;
    epilogue(2 * pairs - 2, prod[half]);
    epilogue(2 * pairs - 1, prod[half + 1]);
  }
  if (blocks % 2 != 0) {
    const int64_t blk = blocks - 1;
    _tile_zero(0);
    _tile_loadd(4, pa + blk * stride, BlockLen);
    _tile_loadd(6, pb + blk * stride, 64);
    _tile_dpbssd(0, 4, 6);
    _tile_stored(0, prod[0], 64);
    epilogue(blk, prod[0]);
  }
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) _mm512_store_ps(acc_out + 16 * r, acc[r]);
}
#undef NIBBLE_AMX_PAIR_PRODUCTS

template <int64_t BlockLen>
MicroKernel pick(bool a_uniform, bool b_uniform) {
  if (a_uniform) return &int8_blocks_amx<BlockLen, Uniform::a>;
  if (b_uniform) return &int8_blocks_amx<BlockLen, Uniform::b>;
  return &int8_blocks_amx<BlockLen, Uniform::none>;
}

// 8 packed bytes -> the 16 doubled E2M1 values as int8, low nibble first (two SSSE3 lookups' worth
// in one pshufb), instead of a table lookup per byte in the packer.
#include "kernels/cpu/gemm/e2m1_nibbles_sse.inc"
inline __m128i doubled_e2m1x16(const uint8_t* packed) {
  return e2m1x16(packed, _mm_loadu_si128(reinterpret_cast<const __m128i*>(kE2M1TimesTwo)));
}

// One AMX panel (either side). `place(block, r, h, v)` stores the 16 values v of row r, half h of a
// block (a 32-element MX block has two halves). Padding rows get code 0 and the scale of the
// panel's first row (so a 16x16-tiled operand's scales stay uniform). Plain pointers only: no
// QuantizedTensor or std::vector member is instantiated in this AVX-512 file (see architecture.md).
template <class Place>
void pack_amx_panel(const E2m1PanelSource& q, int64_t row0, uint8_t* dst, Place place) {
  const int64_t block_len = q.block_len, blocks = q.cols / block_len, halves = block_len / 16;
  const int64_t stride = amx_block_bytes(block_len);
  const uint8_t* first_scales = q.scales + row0 * blocks;  // row0 < q.rows for every panel
  for (int r = 0; r < kAmxTile; ++r) {
    const int64_t row = row0 + r;
    const bool inside = row < q.rows;
    const uint8_t* src = inside ? q.codes + row * (q.cols / 2) : nullptr;
    const uint8_t* scales = inside ? q.scales + row * blocks : first_scales;
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* blk = dst + b * stride;
      for (int64_t h = 0; h < halves; ++h)
        place(blk, r, h, inside ? doubled_e2m1x16(src + b * (block_len / 2) + 8 * h) : _mm_setzero_si128());
      const float scale = q.scale_of[scales[b]];
      std::memcpy(blk + kAmxTile * block_len + 4 * r, &scale, 4);
    }
  }
}

}  // namespace

void pack_amx_a_panel(const E2m1PanelSource& q, int64_t row0, uint8_t* dst) {
  const int64_t block_len = q.block_len;
  pack_amx_panel(q, row0, dst, [block_len](uint8_t* blk, int r, int64_t h, __m128i v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(blk + r * block_len + 16 * h), v);
  });
}

void pack_amx_b_panel(const E2m1PanelSource& q, int64_t row0, uint8_t* dst) {
  // VNNI order: the 4 values of group g (k = 4g..4g+3) of column r go to blk + (g * 16 + r) * 4.
  pack_amx_panel(q, row0, dst, [](uint8_t* blk, int r, int64_t h, __m128i v) {
    alignas(16) uint32_t words[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(words), v);
    for (int g = 0; g < 4; ++g) std::memcpy(blk + ((4 * h + g) * kAmxTile + r) * 4, &words[g], 4);
  });
}

MicroKernel int8_micro_kernel_amx(int64_t block_len, bool a_uniform, bool b_uniform) {
  return block_len == 16 ? pick<16>(a_uniform, b_uniform) : pick<32>(a_uniform, b_uniform);
}

void amx_thread_begin(int64_t block_len) {
  load_tile_config(make_config(block_len));
}

void amx_thread_end() { _tile_release(); }

}  // namespace nibble::cpu::gemm_detail

namespace nibble::cpu::peaks {

// Four independent 16x16 accumulators, each fed 16x64 by 64x16 s8 tiles (the instruction's full K).
int32_t amx_int8_loop(int64_t iterations) {
  alignas(64) int8_t operand[16 * 64];
  for (int i = 0; i < 16 * 64; ++i) operand[i] = static_cast<int8_t>(i % 7 - 3);
  alignas(64) int32_t out[16 * 16];
  gemm_detail::tile_peak_loop(operand, iterations, [] {
    _tile_dpbssd(0, 4, 5);
    _tile_dpbssd(1, 4, 5);
    _tile_dpbssd(2, 4, 5);
    _tile_dpbssd(3, 4, 5);
  }, out);
  return out[0];
}

}  // namespace nibble::cpu::peaks
