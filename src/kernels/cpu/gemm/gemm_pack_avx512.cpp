// The signed int8 A panel and the biased int8 B panel (gemm_kernels.h) of NVFP4 16-blocks with
// AVX-512BW, four blocks of the panel's rows at a time: one 128-bit lane per block. The AVX-512 int8
// kernel takes every A operand in this layout (activations in fprop, dY in dgrad, dY^T in wgrad), and
// packing it with 16-byte SSE steps, one row and block at a time, cost about a tenth of an NVFP4
// training step; the B panels (weights, X^T) went the same way at a smaller share.
#ifdef NIBBLE_EMULATED_INTRINSICS
// tests/emulated/: a software model of the intrinsics below (test_gemm_pack_avx512_emulated).
#include NIBBLE_EMULATED_INTRINSICS
#else
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>

#include "format/codecs.h"
#include "kernels/cpu/gemm/gemm_kernels.h"

// GCC 12 warns that the intrinsics' internal undefined vectors are used uninitialized (a false
// positive inside the intrinsic headers, as in gemm_avx512.cpp).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace nibble::cpu::gemm_detail {
namespace {

constexpr int64_t kBlockLen = 16;
constexpr int64_t kStepBlocks = 4;                                          // one 128-bit lane each
constexpr int64_t kBlockBytes = int8_signed_block_bytes(kBlockLen, kMr);   // 128 codes + 8 init + 8 scales
static_assert(kBlockBytes == 3 * 64 && kMr == 8);

// The doubled E2M1 value of each code plus `bias` (0 for A, 12 for B), in all four lanes (vpshufb
// looks up within a lane).
__m512i doubled_code_table(int8_t bias = 0) {
  alignas(64) int8_t t[64];
  for (int i = 0; i < 64; ++i) t[i] = static_cast<int8_t>(kE2M1TimesTwo[i % 16] + bias);
  return _mm512_loadu_si512(t);
}

// 32 packed bytes of a row (64 codes, element 2i in the low nibble of byte i) -> the 64 doubled
// codes, a signed byte each, in k order: lane b holds the row's block b.
__m512i doubled_codes(const uint8_t* packed, __m512i table) {
  const __m512i words = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(packed)));
  const __m512i low = _mm512_and_si512(words, _mm512_set1_epi16(0x000F));                          // byte 2i
  const __m512i high = _mm512_slli_epi64(_mm512_and_si512(words, _mm512_set1_epi16(0x00F0)), 4);  // byte 2i+1
  return _mm512_shuffle_epi8(table, _mm512_or_si512(low, high));
}

// out[b] = lane b of a, b_, c, d side by side: a 4 x 4 transpose of 128-bit lanes, which turns
// "one vector per part, a lane per block" into "one vector per block".
[[gnu::always_inline]] inline void lanes_by_block(__m512i a, __m512i b_, __m512i c, __m512i d, __m512i out[4]) {
  const __m512i ab01 = _mm512_shuffle_i32x4(a, b_, 0x44), ab23 = _mm512_shuffle_i32x4(a, b_, 0xEE);
  const __m512i cd01 = _mm512_shuffle_i32x4(c, d, 0x44), cd23 = _mm512_shuffle_i32x4(c, d, 0xEE);
  out[0] = _mm512_shuffle_i32x4(ab01, cd01, 0x88);
  out[1] = _mm512_shuffle_i32x4(ab01, cd01, 0xDD);
  out[2] = _mm512_shuffle_i32x4(ab23, cd23, 0x88);
  out[3] = _mm512_shuffle_i32x4(ab23, cd23, 0xDD);
}

// Per lane, 4 rows regrouped as 4 k at a time: groups[g] holds dword g (k 4g..4g+3) of the 4 rows.
[[gnu::always_inline]] inline void groups_of_4_rows(const __m512i r[4], __m512i groups[4]) {
  const __m512i t0 = _mm512_unpacklo_epi32(r[0], r[1]), t1 = _mm512_unpackhi_epi32(r[0], r[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(r[2], r[3]), t3 = _mm512_unpackhi_epi32(r[2], r[3]);
  groups[0] = _mm512_unpacklo_epi64(t0, t2);
  groups[1] = _mm512_unpackhi_epi64(t0, t2);
  groups[2] = _mm512_unpacklo_epi64(t1, t3);
  groups[3] = _mm512_unpackhi_epi64(t1, t3);
}

// The decoded scales of 4 rows (scales[i]: row i's 4 scale codes) in the lanes' order: lane b holds
// block b's scales of the 4 rows. One gather instead of 16 table lookups stored one by one and
// read back as a vector.
// The 4 rows' codes go into the vector as dwords, register to register: written to a stack buffer
// and read back as one 16-byte load, they stalled on the store-to-load forwarding that four 4-byte
// stores cannot give one wider load (~70 % of this packer's time on Zen 4).
__m512i decoded_scales(const uint8_t* const scales[4], const float* scale_of) {
  auto codes_of_row = [&](int i) {  // row i's 4 codes, block b in byte b
    uint32_t v;
    std::memcpy(&v, scales[i], 4);
    return static_cast<int>(v);
  };
  __m128i by_row = _mm_cvtsi32_si128(codes_of_row(0));  // byte 4i + b: row i, block b
  by_row = _mm_insert_epi32(by_row, codes_of_row(1), 1);
  by_row = _mm_insert_epi32(by_row, codes_of_row(2), 2);
  by_row = _mm_insert_epi32(by_row, codes_of_row(3), 3);
  const __m128i to_block_order = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m128i codes = _mm_shuffle_epi8(by_row, to_block_order);
  return _mm512_castps_si512(_mm512_i32gather_ps(_mm512_cvtepu8_epi32(codes), scale_of, 4));
}

// Four blocks of the panel's 8 rows: codes[r] points at row r's 32 packed bytes of these blocks,
// scales[r] at its 4 scale codes. Writes the four blocks' 4 x 192 bytes.
void pack_four_blocks(const uint8_t* const codes[kMr], const uint8_t* const scales[kMr], const float* scale_of,
                      __m512i table, uint8_t* out) {
  // Every loop unrolled, so that the rows and groups stay in registers (rolled, GCC 12 kept them on
  // the stack).
  __m512i rows[kMr];
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r) rows[r] = doubled_codes(codes[r], table);
  // Per lane, rows 4h..4h+3 regrouped as 4 k at a time: groups[h][g] holds dword g (k 4g..4g+3) of
  // the 4 rows, the panel's codes[g][rows 4h..4h+3][4].
  __m512i groups[2][4];
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) groups_of_4_rows(rows + 4 * h, groups[h]);
  // init = -12 * sum of the row's block: 12 (unsigned) times each code (signed), 4 at a time.
  const __m512i twelve = _mm512_set1_epi32(0x0C0C0C0C);
  __m512i init[2];
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    __m512i s = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) s = _mm512_dpbusd_epi32(s, twelve, groups[h][g]);
    init[h] = _mm512_sub_epi32(_mm512_setzero_si512(), s);
  }
  __m512i block[3][4];
  lanes_by_block(groups[0][0], groups[1][0], groups[0][1], groups[1][1], block[0]);  // bytes 0..63: groups 0, 1
  lanes_by_block(groups[0][2], groups[1][2], groups[0][3], groups[1][3], block[1]);  // 64..127: groups 2, 3
  lanes_by_block(init[0], init[1], decoded_scales(scales, scale_of), decoded_scales(scales + 4, scale_of), block[2]);
#pragma GCC unroll 4
  for (int b = 0; b < kStepBlocks; ++b)
#pragma GCC unroll 3
    for (int part = 0; part < 3; ++part) _mm512_storeu_si512(out + b * kBlockBytes + 64 * part, block[part][b]);
}

constexpr int64_t kBBlockBytes = int8_biased_block_bytes(kBlockLen, kNr);  // 512 codes + 32 scales
static_assert(kBBlockBytes == 10 * 64 && kNr == 32);

// Four blocks of the B panel's 32 rows: codes[r] points at row r's 32 packed bytes of these blocks,
// scales[r] at its 4 scale codes; rows from `inside` on are padding (codes 0, not the bias 12).
// Writes the four blocks' 4 x 640 bytes: per block codes[g][32 rows][4], then 32 scales.
void pack_four_b_blocks(const uint8_t* const codes[kNr], const uint8_t* const scales[kNr], int inside,
                        const float* scale_of, __m512i table, uint8_t* out) {
#pragma GCC unroll 2
  for (int half = 0; half < 2; ++half) {  // rows 16 * half .. 16 * half + 15
    __m512i groups[4][4];                 // [row quad][g]
#pragma GCC unroll 4
    for (int quad = 0; quad < 4; ++quad) {
      __m512i rows[4];
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const int r = 16 * half + 4 * quad + i;
        rows[i] = r < inside ? doubled_codes(codes[r], table) : _mm512_setzero_si512();
      }
      groups_of_4_rows(rows, groups[quad]);
    }
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      __m512i block[4];  // block b: dword g of the half's 16 rows, in row order
      lanes_by_block(groups[0][g], groups[1][g], groups[2][g], groups[3][g], block);
#pragma GCC unroll 4
      for (int b = 0; b < kStepBlocks; ++b)
        _mm512_storeu_si512(out + b * kBBlockBytes + g * 4 * kNr + 64 * half, block[b]);
    }
    __m512i block_scales[4];
    lanes_by_block(decoded_scales(scales + 16 * half, scale_of), decoded_scales(scales + 16 * half + 4, scale_of),
                   decoded_scales(scales + 16 * half + 8, scale_of), decoded_scales(scales + 16 * half + 12, scale_of),
                   block_scales);
#pragma GCC unroll 4
    for (int b = 0; b < kStepBlocks; ++b)
      _mm512_storeu_si512(out + b * kBBlockBytes + kBlockLen * kNr + 64 * half, block_scales[b]);
  }
}

// A panel of `Rows` rows (kMr for A, kNr for B) four blocks at a time: pack_step(codes, scales,
// inside, out) packs one step from each row's 32 code bytes and 4 scale codes. Rows past the edge
// read zero bytes (scale code 0 is +0 in E4M3; the step packer gives them code 0).
template <int64_t Rows, int64_t BlockBytes, class PackStep>
void pack_panel_by_steps(const E2m1PanelSource& q, int64_t row0, uint8_t* dst, PackStep pack_step) {
  const int64_t blocks = q.cols / kBlockLen, row_bytes = q.cols / 2;
  const int inside = static_cast<int>(std::min<int64_t>(Rows, q.rows - row0));
  static const uint8_t zeros[32] = {};
  const uint8_t* codes[Rows];
  const uint8_t* scales[Rows];
  const int64_t whole = blocks / kStepBlocks * kStepBlocks;
  for (int64_t b = 0; b < whole; b += kStepBlocks) {
    for (int r = 0; r < Rows; ++r) {
      codes[r] = r < inside ? q.codes + (row0 + r) * row_bytes + b * (kBlockLen / 2) : zeros;
      scales[r] = r < inside ? q.scales + (row0 + r) * blocks + b : zeros;
    }
    pack_step(codes, scales, inside, dst + b * BlockBytes);
  }
  if (whole == blocks) return;
  // The last 1-3 blocks: from zero-padded copies of each row's bytes, and only they are written.
  const int64_t left = blocks - whole;
  alignas(64) uint8_t code_copy[Rows][32] = {}, scale_copy[Rows][kStepBlocks] = {};
  for (int r = 0; r < Rows; ++r) {
    if (r < inside) {
      std::memcpy(code_copy[r], q.codes + (row0 + r) * row_bytes + whole * (kBlockLen / 2), left * (kBlockLen / 2));
      std::memcpy(scale_copy[r], q.scales + (row0 + r) * blocks + whole, left);
    }
    codes[r] = code_copy[r];
    scales[r] = scale_copy[r];
  }
  alignas(64) uint8_t out[kStepBlocks * BlockBytes];
  pack_step(codes, scales, inside, out);
  std::memcpy(dst + whole * BlockBytes, out, left * BlockBytes);
}

}  // namespace

void pack_int8_b_panel_avx512(const E2m1PanelSource& q, int64_t row0, uint8_t* dst) {
  const __m512i table = doubled_code_table(12);
  pack_panel_by_steps<kNr, kBBlockBytes>(q, row0, dst, [&](const uint8_t* const* codes, const uint8_t* const* scales,
                                                           int inside, uint8_t* out) {
    pack_four_b_blocks(codes, scales, inside, q.scale_of, table, out);
  });
}

void pack_int8_a_panel_avx512(const E2m1PanelSource& q, int64_t row0, uint8_t* dst) {
  const __m512i table = doubled_code_table();
  // Padding rows pack as the table packer pads them: code 0, init 0, scale 0.
  pack_panel_by_steps<kMr, kBlockBytes>(q, row0, dst, [&](const uint8_t* const* codes, const uint8_t* const* scales,
                                                          int, uint8_t* out) {
    pack_four_blocks(codes, scales, q.scale_of, table, out);
  });
}

}  // namespace nibble::cpu::gemm_detail
