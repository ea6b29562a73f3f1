// A software model of the AVX-512 (F/BW/DQ/VL) and AVX intrinsics quantize_avx512.cpp uses (with
// transpose8x8_avx.inc and transpose16x16_avx512.inc), lane by lane per the Intel SDM, for
// test_quantize_avx512_emulated. The floating-point operations are IEEE single operations in the
// default environment (round to nearest even, no DAZ/FTZ), as the kernels run. Notes on the less
// obvious ones:
//  * MAXPS/MINPS return the second operand when either is NaN or both are zeros: (a > b) ? a : b.
//  * VRANGEPS imm 0x0B: the larger magnitude with its sign cleared; a NaN operand gives that NaN
//    quieted (first operand first). The kernels only reach it with finite values.
//  * VCVTPS2DQ rounds to nearest even; NaN and out-of-range give 0x80000000.
//  * VPMOV{DB,QB,WB} truncate; VPACKUS{DW,WB} saturate signed to unsigned, per 128-bit lane, the
//    first source's elements first; VPMADDUBSW multiplies u8 x s8 pairs and saturates to int16.
//  * Permutes index modulo the element count (the two-source forms take one more index bit as the
//    source select); masked loads read only the selected lanes.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "avx512_vnni_intrinsics.h"  // __m512, __m512i, __m128 and the FP32/int32 basics
#include "sse_intrinsics.h"          // __m128i

using __mmask16 = uint16_t;
using __mmask8 = uint8_t;

struct __m256 {
  float f[8];
};
struct __m256i {
  uint8_t b[32];
};

namespace emulated_avx512 {
// The 512 bits as an array of T (and back).
template <class T>
struct Lanes {
  T v[64 / sizeof(T)];
  static constexpr int n = 64 / sizeof(T);
};
template <class T, class V>
inline Lanes<T> lanes(const V& x) {
  static_assert(sizeof(V) == 64);
  Lanes<T> r;
  std::memcpy(r.v, &x, 64);
  return r;
}
template <class V, class T>
inline V vec(const Lanes<T>& l) {
  V r;
  std::memcpy(&r, l.v, 64);
  return r;
}
inline float quiet(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u |= 0x00400000u;
  std::memcpy(&x, &u, 4);
  return x;
}
}  // namespace emulated_avx512

// ---- FP32 arithmetic, compares and masks ----
inline __m512 _mm512_add_ps(__m512 a, __m512 b) {
  for (int i = 0; i < 16; ++i) a.f[i] += b.f[i];
  return a;
}
inline __m512 _mm512_sub_ps(__m512 a, __m512 b) {
  for (int i = 0; i < 16; ++i) a.f[i] -= b.f[i];
  return a;
}
inline __m512 _mm512_max_ps(__m512 a, __m512 b) {
  for (int i = 0; i < 16; ++i) a.f[i] = a.f[i] > b.f[i] ? a.f[i] : b.f[i];
  return a;
}
inline __m512 _mm512_min_ps(__m512 a, __m512 b) {
  for (int i = 0; i < 16; ++i) a.f[i] = a.f[i] < b.f[i] ? a.f[i] : b.f[i];
  return a;
}
inline __m512 _mm512_range_ps(__m512 a, __m512 b, int imm) {
  if (imm != 0x0B) std::abort();  // only the form the kernels use: max magnitude, sign cleared
  for (int i = 0; i < 16; ++i) {
    if (std::isnan(a.f[i]) || std::isnan(b.f[i])) {
      a.f[i] = emulated_avx512::quiet(std::isnan(a.f[i]) ? a.f[i] : b.f[i]);
      continue;
    }
    a.f[i] = std::fabs(a.f[i]) > std::fabs(b.f[i]) ? std::fabs(a.f[i]) : std::fabs(b.f[i]);
  }
  return a;
}
#define _CMP_UNORD_Q 0x03
#define _CMP_ORD_Q 0x07
#define _CMP_LT_OQ 0x11
inline __mmask16 _mm512_cmp_ps_mask(__m512 a, __m512 b, int predicate) {
  __mmask16 k = 0;
  for (int i = 0; i < 16; ++i) {
    const bool unordered = std::isnan(a.f[i]) || std::isnan(b.f[i]);
    bool bit = false;
    switch (predicate) {
      case _CMP_UNORD_Q: bit = unordered; break;
      case _CMP_ORD_Q: bit = !unordered; break;
      case _CMP_LT_OQ: bit = !unordered && a.f[i] < b.f[i]; break;
      default: std::abort();
    }
    k = static_cast<__mmask16>(k | (bit ? 1u << i : 0u));
  }
  return k;
}
inline __m512 _mm512_maskz_mov_ps(__mmask16 k, __m512 a) {
  for (int i = 0; i < 16; ++i)
    if (!(k >> i & 1)) a.f[i] = 0.0f;
  return a;
}
inline __m512 _mm512_maskz_loadu_ps(__mmask16 k, const void* p) {
  __m512 r{};
  for (int i = 0; i < 16; ++i)
    if (k >> i & 1) std::memcpy(&r.f[i], static_cast<const uint8_t*>(p) + 4 * i, 4);
  return r;
}
inline __m512i _mm512_maskz_loadu_epi32(__mmask16 k, const void* p) {
  __m512i r{};
  for (int i = 0; i < 16; ++i)
    if (k >> i & 1) std::memcpy(&r.i[i], static_cast<const uint8_t*>(p) + 4 * i, 4);
  return r;
}
inline void _mm512_mask_storeu_ps(void* p, __mmask16 k, __m512 a) {
  for (int i = 0; i < 16; ++i)
    if (k >> i & 1) std::memcpy(static_cast<uint8_t*>(p) + 4 * i, &a.f[i], 4);
}
inline __m512 _mm512_setr_ps(float e0, float e1, float e2, float e3, float e4, float e5, float e6, float e7, float e8,
                             float e9, float e10, float e11, float e12, float e13, float e14, float e15) {
  return {{e0, e1, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11, e12, e13, e14, e15}};
}
inline float _mm512_reduce_max_ps(__m512 a) {
  float m = a.f[0];
  for (int i = 1; i < 16; ++i) m = a.f[i] > m ? a.f[i] : m;
  return m;
}

// ---- Casts and conversions ----
inline __m512i _mm512_castps_si512(__m512 a) {
  __m512i r;
  std::memcpy(&r, &a, 64);
  return r;
}
inline __m512 _mm512_castsi512_ps(__m512i a) {
  __m512 r;
  std::memcpy(&r, &a, 64);
  return r;
}
inline __m512i _mm512_cvtps_epi32(__m512 a) {
  __m512i r;
  for (int i = 0; i < 16; ++i) {
    const float x = std::nearbyint(a.f[i]);
    r.i[i] = std::isnan(x) || x < -2147483648.0f || x >= 2147483648.0f ? std::numeric_limits<int32_t>::min()
                                                                         : static_cast<int32_t>(x);
  }
  return r;
}
inline __m128i _mm512_cvtepi32_epi8(__m512i a) {
  __m128i r;
  for (int i = 0; i < 16; ++i) r.b[i] = static_cast<uint8_t>(a.i[i]);
  return r;
}
inline __m128i _mm512_cvtepi64_epi8(__m512i a) {
  const auto q = emulated_avx512::lanes<uint64_t>(a);
  __m128i r{};
  for (int i = 0; i < 8; ++i) r.b[i] = static_cast<uint8_t>(q.v[i]);
  return r;
}
inline __m256i _mm512_cvtepi16_epi8(__m512i a) {
  const auto w = emulated_avx512::lanes<uint16_t>(a);
  __m256i r;
  for (int i = 0; i < 32; ++i) r.b[i] = static_cast<uint8_t>(w.v[i]);
  return r;
}
inline __m512i _mm512_cvtepu8_epi32(__m128i a) {
  __m512i r;
  for (int i = 0; i < 16; ++i) r.i[i] = a.b[i];
  return r;
}
inline __m512i _mm512_cvtepu8_epi64(__m128i a) {
  emulated_avx512::Lanes<uint64_t> q;
  for (int i = 0; i < 8; ++i) q.v[i] = a.b[i];
  return emulated_avx512::vec<__m512i>(q);
}
inline __mmask16 _mm512_movepi32_mask(__m512i a) {
  __mmask16 k = 0;
  for (int i = 0; i < 16; ++i) k = static_cast<__mmask16>(k | (a.i[i] < 0 ? 1u << i : 0u));
  return k;
}

// ---- Integer element-wise ----
inline __m512i _mm512_setzero_si512() { return {}; }
inline __m512i _mm512_setr_epi32(int e0, int e1, int e2, int e3, int e4, int e5, int e6, int e7, int e8, int e9, int e10,
                                 int e11, int e12, int e13, int e14, int e15) {
  return {{e0, e1, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11, e12, e13, e14, e15}};
}
inline __m512i _mm512_set1_epi64(int64_t v) {
  emulated_avx512::Lanes<int64_t> q;
  for (auto& x : q.v) x = v;
  return emulated_avx512::vec<__m512i>(q);
}
inline __m512i _mm512_setr_epi64(int64_t e0, int64_t e1, int64_t e2, int64_t e3, int64_t e4, int64_t e5, int64_t e6,
                                 int64_t e7) {
  const emulated_avx512::Lanes<int64_t> q{{e0, e1, e2, e3, e4, e5, e6, e7}};
  return emulated_avx512::vec<__m512i>(q);
}
inline __m512i _mm512_set1_epi16(short v) {
  emulated_avx512::Lanes<int16_t> w;
  for (auto& x : w.v) x = v;
  return emulated_avx512::vec<__m512i>(w);
}
// Arguments from element 31 down to element 0.
inline __m512i _mm512_set_epi16(short e31, short e30, short e29, short e28, short e27, short e26, short e25, short e24,
                                short e23, short e22, short e21, short e20, short e19, short e18, short e17, short e16,
                                short e15, short e14, short e13, short e12, short e11, short e10, short e9, short e8,
                                short e7, short e6, short e5, short e4, short e3, short e2, short e1, short e0) {
  const emulated_avx512::Lanes<int16_t> w{{e0,  e1,  e2,  e3,  e4,  e5,  e6,  e7,  e8,  e9,  e10,
                                           e11, e12, e13, e14, e15, e16, e17, e18, e19, e20, e21,
                                           e22, e23, e24, e25, e26, e27, e28, e29, e30, e31}};
  return emulated_avx512::vec<__m512i>(w);
}
inline void _mm512_storeu_si512(void* p, __m512i a) { std::memcpy(p, &a, 64); }
inline __m512i _mm512_and_si512(__m512i a, __m512i b) {
  for (int i = 0; i < 16; ++i) a.i[i] &= b.i[i];
  return a;
}
inline __m512i _mm512_or_si512(__m512i a, __m512i b) {
  for (int i = 0; i < 16; ++i) a.i[i] |= b.i[i];
  return a;
}
inline __m512i _mm512_add_epi32(__m512i a, __m512i b) {
  for (int i = 0; i < 16; ++i) a.i[i] = static_cast<int32_t>(static_cast<uint32_t>(a.i[i]) + static_cast<uint32_t>(b.i[i]));
  return a;
}
inline __m512i _mm512_sub_epi32(__m512i a, __m512i b) {
  for (int i = 0; i < 16; ++i) a.i[i] = static_cast<int32_t>(static_cast<uint32_t>(a.i[i]) - static_cast<uint32_t>(b.i[i]));
  return a;
}
inline __m512i _mm512_add_epi64(__m512i a, __m512i b) {
  auto x = emulated_avx512::lanes<uint64_t>(a);
  const auto y = emulated_avx512::lanes<uint64_t>(b);
  for (int i = 0; i < 8; ++i) x.v[i] += y.v[i];
  return emulated_avx512::vec<__m512i>(x);
}
inline __m512i _mm512_srli_epi32(__m512i a, unsigned n) {
  for (int i = 0; i < 16; ++i) a.i[i] = n > 31 ? 0 : static_cast<int32_t>(static_cast<uint32_t>(a.i[i]) >> n);
  return a;
}
inline __m512i _mm512_srli_epi64(__m512i a, unsigned n) {
  auto q = emulated_avx512::lanes<uint64_t>(a);
  for (auto& x : q.v) x = n > 63 ? 0 : x >> n;
  return emulated_avx512::vec<__m512i>(q);
}
inline __m512i _mm512_slli_epi64(__m512i a, unsigned n) {
  auto q = emulated_avx512::lanes<uint64_t>(a);
  for (auto& x : q.v) x = n > 63 ? 0 : x << n;
  return emulated_avx512::vec<__m512i>(q);
}
inline __m512i _mm512_max_epu32(__m512i a, __m512i b) {
  for (int i = 0; i < 16; ++i)
    if (static_cast<uint32_t>(b.i[i]) > static_cast<uint32_t>(a.i[i])) a.i[i] = b.i[i];
  return a;
}
inline unsigned _mm512_reduce_max_epu32(__m512i a) {
  uint32_t m = 0;
  for (int i = 0; i < 16; ++i) m = static_cast<uint32_t>(a.i[i]) > m ? static_cast<uint32_t>(a.i[i]) : m;
  return m;
}
inline __m512i _mm512_mul_epu32(__m512i a, __m512i b) {
  auto x = emulated_avx512::lanes<uint64_t>(a);
  const auto y = emulated_avx512::lanes<uint64_t>(b);
  for (int i = 0; i < 8; ++i) x.v[i] = (x.v[i] & 0xFFFFFFFFu) * (y.v[i] & 0xFFFFFFFFu);
  return emulated_avx512::vec<__m512i>(x);
}
inline __m512i _mm512_ternarylogic_epi32(__m512i a, __m512i b, __m512i c, int imm) {
  for (int i = 0; i < 16; ++i) {
    uint32_t r = 0;
    for (int bit = 0; bit < 32; ++bit) {
      const unsigned index = (static_cast<uint32_t>(a.i[i]) >> bit & 1) << 2 | (static_cast<uint32_t>(b.i[i]) >> bit & 1) << 1 |
                             (static_cast<uint32_t>(c.i[i]) >> bit & 1);
      r |= static_cast<uint32_t>(imm >> index & 1) << bit;
    }
    a.i[i] = static_cast<int32_t>(r);
  }
  return a;
}
inline __m512i _mm512_mask_mov_epi32(__m512i src, __mmask16 k, __m512i a) {
  for (int i = 0; i < 16; ++i)
    if (k >> i & 1) src.i[i] = a.i[i];
  return src;
}
inline __m512i _mm512_mask_or_epi32(__m512i src, __mmask16 k, __m512i a, __m512i b) {
  return _mm512_mask_mov_epi32(src, k, _mm512_or_si512(a, b));
}
inline __m512i _mm512_mask_add_epi32(__m512i src, __mmask16 k, __m512i a, __m512i b) {
  return _mm512_mask_mov_epi32(src, k, _mm512_add_epi32(a, b));
}
inline __m512i _mm512_maddubs_epi16(__m512i a, __m512i b) {
  const auto x = emulated_avx512::lanes<uint8_t>(a);
  const auto y = emulated_avx512::lanes<int8_t>(b);
  emulated_avx512::Lanes<int16_t> r;
  for (int i = 0; i < 32; ++i) {
    const int s = x.v[2 * i] * y.v[2 * i] + x.v[2 * i + 1] * y.v[2 * i + 1];
    r.v[i] = static_cast<int16_t>(s > 32767 ? 32767 : s < -32768 ? -32768 : s);
  }
  return emulated_avx512::vec<__m512i>(r);
}
inline __m512i _mm512_packus_epi32(__m512i a, __m512i b) {
  emulated_avx512::Lanes<uint16_t> r;
  auto sat = [](int32_t v) { return static_cast<uint16_t>(v < 0 ? 0 : v > 65535 ? 65535 : v); };
  for (int lane = 0; lane < 4; ++lane)
    for (int j = 0; j < 4; ++j) {
      r.v[8 * lane + j] = sat(a.i[4 * lane + j]);
      r.v[8 * lane + 4 + j] = sat(b.i[4 * lane + j]);
    }
  return emulated_avx512::vec<__m512i>(r);
}
inline __m512i _mm512_packus_epi16(__m512i a, __m512i b) {
  const auto x = emulated_avx512::lanes<int16_t>(a), y = emulated_avx512::lanes<int16_t>(b);
  emulated_avx512::Lanes<uint8_t> r;
  auto sat = [](int16_t v) { return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v); };
  for (int lane = 0; lane < 4; ++lane)
    for (int j = 0; j < 8; ++j) {
      r.v[16 * lane + j] = sat(x.v[8 * lane + j]);
      r.v[16 * lane + 8 + j] = sat(y.v[8 * lane + j]);
    }
  return emulated_avx512::vec<__m512i>(r);
}

// ---- Permutes and shuffles ----
inline __m512 _mm512_permutexvar_ps(__m512i idx, __m512 a) {
  __m512 r;
  for (int i = 0; i < 16; ++i) r.f[i] = a.f[idx.i[i] & 15];
  return r;
}
inline __m512i _mm512_permutexvar_epi16(__m512i idx, __m512i a) {
  const auto x = emulated_avx512::lanes<uint16_t>(a), k = emulated_avx512::lanes<uint16_t>(idx);
  emulated_avx512::Lanes<uint16_t> r;
  for (int i = 0; i < 32; ++i) r.v[i] = x.v[k.v[i] & 31];
  return emulated_avx512::vec<__m512i>(r);
}
inline __m512 _mm512_permutex2var_ps(__m512 a, __m512i idx, __m512 b) {
  __m512 r;
  for (int i = 0; i < 16; ++i) r.f[i] = idx.i[i] & 16 ? b.f[idx.i[i] & 15] : a.f[idx.i[i] & 15];
  return r;
}
inline __m512i _mm512_permutex2var_epi32(__m512i a, __m512i idx, __m512i b) {
  __m512i r;
  for (int i = 0; i < 16; ++i) r.i[i] = idx.i[i] & 16 ? b.i[idx.i[i] & 15] : a.i[idx.i[i] & 15];
  return r;
}
inline __m512i _mm512_permutex2var_epi64(__m512i a, __m512i idx, __m512i b) {
  const auto x = emulated_avx512::lanes<uint64_t>(a), y = emulated_avx512::lanes<uint64_t>(b),
             k = emulated_avx512::lanes<uint64_t>(idx);
  emulated_avx512::Lanes<uint64_t> r;
  for (int i = 0; i < 8; ++i) r.v[i] = k.v[i] & 8 ? y.v[k.v[i] & 7] : x.v[k.v[i] & 7];
  return emulated_avx512::vec<__m512i>(r);
}
// _MM_PERM_ENUM: the four 2-bit dword selectors, element 3's first (CDAB swaps the dwords of each pair).
enum _MM_PERM_ENUM : int { _MM_PERM_CDAB = 0xB1 };
inline __m512i _mm512_shuffle_epi32(__m512i a, int imm) {
  __m512i r;
  for (int lane = 0; lane < 4; ++lane)
    for (int j = 0; j < 4; ++j) r.i[4 * lane + j] = a.i[4 * lane + (imm >> (2 * j) & 3)];
  return r;
}
inline __m512i _mm512_mask_shuffle_epi32(__m512i src, __mmask16 k, __m512i a, int imm) {
  return _mm512_mask_mov_epi32(src, k, _mm512_shuffle_epi32(a, imm));
}
inline __m512i _mm512_shuffle_i32x4(__m512i a, __m512i b, int imm) {
  __m512i r;
  for (int lane = 0; lane < 4; ++lane) {
    const __m512i& src = lane < 2 ? a : b;
    std::memcpy(&r.i[4 * lane], &src.i[4 * (imm >> (2 * lane) & 3)], 16);
  }
  return r;
}
inline __m512i _mm512_unpacklo_epi32(__m512i a, __m512i b) {
  __m512i r;
  for (int lane = 0; lane < 4; ++lane)
    for (int j = 0; j < 2; ++j) r.i[4 * lane + 2 * j] = a.i[4 * lane + j], r.i[4 * lane + 2 * j + 1] = b.i[4 * lane + j];
  return r;
}
inline __m512i _mm512_unpackhi_epi32(__m512i a, __m512i b) {
  __m512i r;
  for (int lane = 0; lane < 4; ++lane)
    for (int j = 0; j < 2; ++j)
      r.i[4 * lane + 2 * j] = a.i[4 * lane + 2 + j], r.i[4 * lane + 2 * j + 1] = b.i[4 * lane + 2 + j];
  return r;
}
inline __m512i _mm512_unpacklo_epi64(__m512i a, __m512i b) {
  const auto x = emulated_avx512::lanes<uint64_t>(a), y = emulated_avx512::lanes<uint64_t>(b);
  emulated_avx512::Lanes<uint64_t> r;
  for (int lane = 0; lane < 4; ++lane) r.v[2 * lane] = x.v[2 * lane], r.v[2 * lane + 1] = y.v[2 * lane];
  return emulated_avx512::vec<__m512i>(r);
}
inline __m512i _mm512_unpackhi_epi64(__m512i a, __m512i b) {
  const auto x = emulated_avx512::lanes<uint64_t>(a), y = emulated_avx512::lanes<uint64_t>(b);
  emulated_avx512::Lanes<uint64_t> r;
  for (int lane = 0; lane < 4; ++lane) r.v[2 * lane] = x.v[2 * lane + 1], r.v[2 * lane + 1] = y.v[2 * lane + 1];
  return emulated_avx512::vec<__m512i>(r);
}
inline __m512 _mm512_i32gather_ps(__m512i idx, const void* base, int scale) {
  __m512 r;
  for (int i = 0; i < 16; ++i) std::memcpy(&r.f[i], static_cast<const uint8_t*>(base) + int64_t{idx.i[i]} * scale, 4);
  return r;
}

// ---- 128/256-bit stores, prefetch ----
inline void _mm_mask_storeu_epi8(void* p, __mmask16 k, __m128i a) {
  for (int i = 0; i < 16; ++i)
    if (k >> i & 1) static_cast<uint8_t*>(p)[i] = a.b[i];
}
inline void _mm256_storeu_si256(__m256i* p, __m256i a) { std::memcpy(p, a.b, 32); }
#define _MM_HINT_T0 3
inline void _mm_prefetch(const char*, int) {}

// ---- AVX (transpose8x8_avx.inc) ----
#define _MM_SHUFFLE(z, y, x, w) (((z) << 6) | ((y) << 4) | ((x) << 2) | (w))
inline __m256 _mm256_loadu_ps(const float* p) {
  __m256 r;
  std::memcpy(r.f, p, 32);
  return r;
}
inline void _mm256_storeu_ps(float* p, __m256 a) { std::memcpy(p, a.f, 32); }
inline __m256 _mm256_unpacklo_ps(__m256 a, __m256 b) {
  __m256 r;
  for (int lane = 0; lane < 2; ++lane)
    for (int j = 0; j < 2; ++j) r.f[4 * lane + 2 * j] = a.f[4 * lane + j], r.f[4 * lane + 2 * j + 1] = b.f[4 * lane + j];
  return r;
}
inline __m256 _mm256_unpackhi_ps(__m256 a, __m256 b) {
  __m256 r;
  for (int lane = 0; lane < 2; ++lane)
    for (int j = 0; j < 2; ++j)
      r.f[4 * lane + 2 * j] = a.f[4 * lane + 2 + j], r.f[4 * lane + 2 * j + 1] = b.f[4 * lane + 2 + j];
  return r;
}
inline __m256 _mm256_shuffle_ps(__m256 a, __m256 b, int imm) {
  __m256 r;
  for (int lane = 0; lane < 2; ++lane) {
    r.f[4 * lane + 0] = a.f[4 * lane + (imm & 3)];
    r.f[4 * lane + 1] = a.f[4 * lane + (imm >> 2 & 3)];
    r.f[4 * lane + 2] = b.f[4 * lane + (imm >> 4 & 3)];
    r.f[4 * lane + 3] = b.f[4 * lane + (imm >> 6 & 3)];
  }
  return r;
}
inline __m256 _mm256_permute2f128_ps(__m256 a, __m256 b, int imm) {
  __m256 r;
  for (int half = 0; half < 2; ++half) {
    const int sel = imm >> (4 * half) & 0xF;
    if (sel & 8) {
      std::memset(&r.f[4 * half], 0, 16);
      continue;
    }
    const __m256& src = sel & 2 ? b : a;
    std::memcpy(&r.f[4 * half], &src.f[4 * (sel & 1)], 16);
  }
  return r;
}
