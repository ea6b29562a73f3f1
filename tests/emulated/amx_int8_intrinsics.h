// A software model of what gemm_amx.cpp uses: the AMX-TILE/AMX-INT8 intrinsics, its AVX-512 epilogue
// (avx512_vnni_intrinsics.h plus the aligned loads and stores) and the SSE/SSSE3 of its panel packers
// (e2m1_nibbles_sse.inc), for test_gemm_amx_emulated. Per the Intel SDM:
//  * LDTILECFG (palette 1): byte 0 palette, bytes 16..47 colsb[16] (uint16), bytes 48..63 rows[16];
//    TILERELEASE returns every tile to the init state.
//  * TILELOADD/TILESTORED move rows[t] rows of colsb[t] bytes, `stride` bytes apart; TILEZERO zeroes.
//  * TDPBSSD: C[m][n] (int32) += sum over k < colsb(A)/4, j < 4 of s8 A[m][4k+j] * s8 B[k][4n+j],
//    with wraparound, for m < rows(C), n < colsb(C)/4.
// The tile numbers are arguments here (immediates pasted into the asm text on hardware).
#pragma once
#include <cstdint>
#include <cstring>

#include "avx512_vnni_intrinsics.h"

inline __m512 _mm512_load_ps(const float* p) { return _mm512_loadu_ps(p); }
inline void _mm512_store_ps(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline __m512i _mm512_load_si512(const void* p) { return _mm512_loadu_si512(p); }

// ---- SSE / SSSE3 ----
struct __m128i {
  uint8_t b[16];
};
inline __m128i _mm_setzero_si128() { return {}; }
inline __m128i _mm_loadu_si128(const __m128i* p) {
  __m128i r;
  std::memcpy(r.b, p, 16);
  return r;
}
inline void _mm_storeu_si128(__m128i* p, __m128i v) { std::memcpy(p, v.b, 16); }
inline void _mm_store_si128(__m128i* p, __m128i v) { std::memcpy(p, v.b, 16); }
inline __m128i _mm_loadl_epi64(const __m128i* p) {
  __m128i r{};
  std::memcpy(r.b, p, 8);
  return r;
}
inline __m128i _mm_set1_epi8(char v) {
  __m128i r;
  std::memset(r.b, static_cast<uint8_t>(v), 16);
  return r;
}
inline __m128i _mm_and_si128(__m128i a, __m128i b) {
  for (int i = 0; i < 16; ++i) a.b[i] &= b.b[i];
  return a;
}
inline __m128i _mm_srli_epi16(__m128i a, int n) {
  for (int i = 0; i < 16; i += 2) {
    const uint16_t w = static_cast<uint16_t>((a.b[i] | a.b[i + 1] << 8) >> n);
    a.b[i] = static_cast<uint8_t>(w), a.b[i + 1] = static_cast<uint8_t>(w >> 8);
  }
  return a;
}
inline __m128i _mm_unpacklo_epi8(__m128i a, __m128i b) {
  __m128i r;
  for (int i = 0; i < 8; ++i) r.b[2 * i] = a.b[i], r.b[2 * i + 1] = b.b[i];
  return r;
}
inline __m128i _mm_shuffle_epi8(__m128i table, __m128i idx) {  // PSHUFB
  __m128i r;
  for (int i = 0; i < 16; ++i) r.b[i] = idx.b[i] & 0x80 ? 0 : table.b[idx.b[i] & 15];
  return r;
}

// ---- AMX ----
namespace emulated_amx {
struct Tiles {
  uint8_t palette = 0;
  uint16_t colsb[8] = {};
  uint8_t rows[8] = {};
  uint8_t data[8][16][64] = {};
};
inline Tiles& tiles() {
  thread_local Tiles t;
  return t;
}
}  // namespace emulated_amx

inline void _tile_loadconfig(const void* config) {
  emulated_amx::Tiles& t = emulated_amx::tiles();
  const auto* c = static_cast<const uint8_t*>(config);
  t = {};
  t.palette = c[0];
  for (int i = 0; i < 8; ++i) {
    std::memcpy(&t.colsb[i], c + 16 + 2 * i, 2);
    t.rows[i] = c[48 + i];
  }
}
inline void _tile_release() { emulated_amx::tiles() = {}; }
inline void _tile_zero(int tile) { std::memset(emulated_amx::tiles().data[tile], 0, sizeof emulated_amx::tiles().data[tile]); }
inline void _tile_loadd(int tile, const void* base, int64_t stride) {
  emulated_amx::Tiles& t = emulated_amx::tiles();
  for (int r = 0; r < t.rows[tile]; ++r)
    std::memcpy(t.data[tile][r], static_cast<const uint8_t*>(base) + r * stride, t.colsb[tile]);
}
inline void _tile_stored(int tile, void* base, int64_t stride) {
  const emulated_amx::Tiles& t = emulated_amx::tiles();
  for (int r = 0; r < t.rows[tile]; ++r) std::memcpy(static_cast<uint8_t*>(base) + r * stride, t.data[tile][r], t.colsb[tile]);
}
inline void _tile_dpbssd(int c, int a, int b) {
  emulated_amx::Tiles& t = emulated_amx::tiles();
  for (int m = 0; m < t.rows[c]; ++m)
    for (int n = 0; n < t.colsb[c] / 4; ++n) {
      uint32_t sum;
      std::memcpy(&sum, &t.data[c][m][4 * n], 4);
      for (int k = 0; k < t.colsb[a] / 4; ++k)
        for (int j = 0; j < 4; ++j)
          sum += static_cast<uint32_t>(static_cast<int8_t>(t.data[a][m][4 * k + j]) * static_cast<int8_t>(t.data[b][k][4 * n + j]));
      std::memcpy(&t.data[c][m][4 * n], &sum, 4);
    }
}
