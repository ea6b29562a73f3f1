// A software model of the SSE2/SSSE3 intrinsics that the emulated AVX-512 and AMX files use
// (their panel packers, e2m1_nibbles_sse.inc, 128-bit loads and stores of bytes), lane by lane, per
// the Intel SDM. __m128i is 16 bytes here.
#pragma once
#include <cstdint>
#include <cstring>

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
inline __m128i _mm_cvtsi32_si128(int v) {  // MOVD: v in dword 0, the rest zero
  __m128i r{};
  std::memcpy(r.b, &v, 4);  // x86 is little-endian: dword i is bytes 4i..4i+3, low byte first
  return r;
}
inline __m128i _mm_insert_epi32(__m128i a, int v, int i) {  // PINSRD
  std::memcpy(a.b + 4 * (i & 3), &v, 4);
  return a;
}
inline __m128i _mm_setr_epi8(char e0, char e1, char e2, char e3, char e4, char e5, char e6, char e7, char e8,
                             char e9, char e10, char e11, char e12, char e13, char e14, char e15) {
  const char e[16] = {e0, e1, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11, e12, e13, e14, e15};
  __m128i r;
  std::memcpy(r.b, e, 16);
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
inline void _mm_storel_epi64(__m128i* p, __m128i v) { std::memcpy(p, v.b, 8); }
