// A software model of what gemm_amx.cpp uses: the AMX-TILE/AMX-INT8 intrinsics, its AVX-512 epilogue
// (avx512_vnni_intrinsics.h) and the SSE/SSSE3 of its panel packers (sse_intrinsics.h), for
// test_gemm_amx_emulated. Per the Intel SDM:
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
#include "sse_intrinsics.h"


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
