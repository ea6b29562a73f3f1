// AVX-512 (F/BW/VL/DQ) variant of the quantize kernels: one NVFP4 block of 16 FP32 values is one
// zmm register. Compiled with the AVX-512 flags (CMakeLists.txt picks them from the file name);
// only reached when active_isa() says the CPU has them.
#pragma GCC optimize("fp-contract=off")  // -mfma must not fuse the reference's separate mul and add
// GCC 12 warns about the deliberately undefined pass-through operand inside its own AVX-512
// intrinsic headers once an optimize pragma is active (GCC bug 105593); the warning is noise.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#ifdef NIBBLE_EMULATED_INTRINSICS
// tests/emulated/: a software model of the intrinsics below, so that these kernels are checked
// against the reference on CPUs without AVX-512 too.
#include NIBBLE_EMULATED_INTRINSICS
#else
#include <immintrin.h>
#endif

#include <bit>
#include <cstdint>

#include "kernels/cpu/quantize/quantize_kernels.h"

namespace nibble::cpu::kernels::avx512 {
namespace {

#include "kernels/cpu/quantize/quantize_local_codecs.inc"

// Software prefetch distance for the quantize pass (8 KB ahead): on tensors far larger than the
// caches the hardware prefetcher alone does not keep up with it. (The amax scan, a pure read, is
// left to the hardware prefetcher.)
constexpr int64_t kPrefetchFloats = 2048;

inline __m512 abs_ps(__m512 v) {
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFFFFFF)));
}

uint32_t max_abs_bits(const float* x, int64_t n) {
  const __m512i mask = _mm512_set1_epi32(0x7FFFFFFF);
  __m512i m0 = _mm512_setzero_si512(), m1 = m0, m2 = m0, m3 = m0;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    m0 = _mm512_max_epu32(m0, _mm512_and_si512(_mm512_loadu_si512(x + i), mask));
    m1 = _mm512_max_epu32(m1, _mm512_and_si512(_mm512_loadu_si512(x + i + 16), mask));
    m2 = _mm512_max_epu32(m2, _mm512_and_si512(_mm512_loadu_si512(x + i + 32), mask));
    m3 = _mm512_max_epu32(m3, _mm512_and_si512(_mm512_loadu_si512(x + i + 48), mask));
  }
  for (; i + 16 <= n; i += 16) m0 = _mm512_max_epu32(m0, _mm512_and_si512(_mm512_loadu_si512(x + i), mask));
  if (i < n) {
    __mmask16 tail = static_cast<__mmask16>((1u << (n - i)) - 1u);
    m1 = _mm512_max_epu32(m1, _mm512_and_si512(_mm512_maskz_loadu_epi32(tail, x + i), mask));
  }
  m0 = _mm512_max_epu32(_mm512_max_epu32(m0, m1), _mm512_max_epu32(m2, m3));
  return _mm512_reduce_max_epu32(m0);
}

// Finite, non-negative values: the integer maximum of the bit patterns is the float maximum.
inline float absmax_of(__m512 v) {
  return std::bit_cast<float>(static_cast<uint32_t>(_mm512_reduce_max_epu32(_mm512_castps_si512(abs_ps(v)))));
}

float absmax16(const float* x) { return absmax_of(_mm512_loadu_ps(x)); }

float absmax16_ignore_nan(const float* x) {
  __m512 a = abs_ps(_mm512_loadu_ps(x));
  return absmax_of(_mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, a, _CMP_ORD_Q), a));
}

// 16 codes (one per 32-bit lane) -> 8 bytes, element 2i in the low nibble of byte i.
inline void pack_nibbles(__m512i codes, uint8_t* out8) {
  __m512i pairs = _mm512_or_si512(codes, _mm512_srli_epi64(codes, 28));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out8), _mm512_cvtepi64_epi8(pairs));
}

void e2m1_rn16(const float* x, float enc, uint8_t* packed8);  // defined with the hot path below

void e2m1_sr16(const float* x, float enc, const uint8_t* r8, uint8_t* packed8);  // defined with the hot path below

// Sylvester butterfly in register, stage h pairs lane j with j^h: the low lane gets a+b, the high
// lane a-b, exactly as format/hadamard.cpp computes them. Each stage is one permute and one FMA,
// p + v * (+-1): the product is exact (a sign flip, also for Inf, NaN and zeros), so the single
// rounding of the FMA is that of b + a (= a + b) in the low lanes and a + (-b) (= a - b) in the high
// lanes, signed zeros included.
inline __m512 walsh_hadamard16(__m512 v) {
  const __m512i xor1 = _mm512_setr_epi32(1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  const __m512i xor2 = _mm512_setr_epi32(2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  const __m512i xor4 = _mm512_setr_epi32(4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
  const __m512i xor8 = _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  const __m512 s1 = _mm512_setr_ps(1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1);
  const __m512 s2 = _mm512_setr_ps(1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1);
  const __m512 s4 = _mm512_setr_ps(1, 1, 1, 1, -1, -1, -1, -1, 1, 1, 1, 1, -1, -1, -1, -1);
  const __m512 s8 = _mm512_setr_ps(1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1, -1);
  v = _mm512_fmadd_ps(v, s1, _mm512_permutexvar_ps(xor1, v));
  v = _mm512_fmadd_ps(v, s2, _mm512_permutexvar_ps(xor2, v));
  v = _mm512_fmadd_ps(v, s4, _mm512_permutexvar_ps(xor4, v));
  return _mm512_fmadd_ps(v, s8, _mm512_permutexvar_ps(xor8, v));
}

inline __m512 rht_signs() {
  return _mm512_setr_ps(1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1);
}

// BF16 RN (ties to even) kept in FP32, for values that are not NaN.
inline __m512 round_to_bf16_not_nan(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb);
  return _mm512_castsi512_ps(_mm512_and_si512(rounded, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// rht16_bf16 for a block whose transform has no NaN (Job::rht_finite).
inline __m512 rht16_bf16_finite(__m512 x) {
  return round_to_bf16_not_nan(_mm512_mul_ps(walsh_hadamard16(_mm512_mul_ps(x, rht_signs())), _mm512_set1_ps(0.25f)));
}

void rht16_bf16(const float* x, float* out) {
  __m512 v = walsh_hadamard16(_mm512_mul_ps(_mm512_loadu_ps(x), rht_signs()));
  v = _mm512_mul_ps(v, _mm512_set1_ps(0.25f));
  // BF16 RN (ties to even) kept in FP32; NaN stays a quiet NaN with its sign.
  const __m512i u = _mm512_castps_si512(v);
  const __m512i keep = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  __m512i rounded = _mm512_add_epi32(
      u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
  rounded = _mm512_and_si512(rounded, keep);
  const __m512i quiet = _mm512_and_si512(_mm512_or_si512(u, _mm512_set1_epi32(0x00400000)), keep);
  rounded = _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), quiet);
  _mm512_storeu_si512(out, rounded);
}

void rht16_inverse(float* v) {
  const __m512 scale = _mm512_mul_ps(rht_signs(), _mm512_set1_ps(0.25f));  // exact: +-0.25
  _mm512_storeu_ps(v, _mm512_mul_ps(walsh_hadamard16(_mm512_loadu_ps(v)), scale));
}

float wht_absmax(const float* x, int64_t n) {
  __m512 m0 = _mm512_setzero_ps(), m1 = m0;
  int64_t i = 0;
  // max_ps returns its second operand when either is NaN: NaN values are skipped.
  for (; i + 32 <= n; i += 32) {
    m0 = _mm512_max_ps(abs_ps(walsh_hadamard16(_mm512_mul_ps(_mm512_loadu_ps(x + i), rht_signs()))), m0);
    m1 = _mm512_max_ps(abs_ps(walsh_hadamard16(_mm512_mul_ps(_mm512_loadu_ps(x + i + 16), rht_signs()))), m1);
  }
  if (i < n) m0 = _mm512_max_ps(abs_ps(walsh_hadamard16(_mm512_mul_ps(_mm512_loadu_ps(x + i), rht_signs()))), m0);
  return absmax_of(_mm512_max_ps(m0, m1));
}

// Philox4x32-10 for 8 consecutive counters, one per 64-bit lane: every word lives in the low half
// of a 64-bit lane (the high half is don't-care), so each 32x32-bit multiply is one vpmuludq whose
// 64-bit product holds both the low word (in place) and the high word (moved down by a shift or a
// dword swap; the two are mixed to spread the work over two execution ports).
struct Philox8x64 {
  __m512i c0, c1, c2, c3;
};

template <bool kShiftDown>
inline void philox8x64_round(Philox8x64& s, __m512i k0, __m512i k1) {
  const __m512i m0 = _mm512_set1_epi64(0xD2511F53), m1 = _mm512_set1_epi64(0xCD9E8D57);
  const __m512i p0 = _mm512_mul_epu32(s.c0, m0), p1 = _mm512_mul_epu32(s.c2, m1);
  const __m512i hi0 = kShiftDown ? _mm512_srli_epi64(p0, 32) : _mm512_shuffle_epi32(p0, _MM_PERM_CDAB);
  const __m512i hi1 = kShiftDown ? _mm512_srli_epi64(p1, 32) : _mm512_shuffle_epi32(p1, _MM_PERM_CDAB);
  s.c0 = _mm512_ternarylogic_epi32(hi1, s.c1, k0, 0x96);  // three-way xor
  s.c2 = _mm512_ternarylogic_epi32(hi0, s.c3, k1, 0x96);
  s.c1 = p1;
  s.c3 = p0;
}

// The 8 counters' 128 output bytes in stream order: counter by counter, words in order, little-endian.
inline void store_philox8x64(const Philox8x64& s, uint8_t* out128) {
  // Word 1 (3) into the high half of each lane next to word 0 (2): lane j = words {0, 1} ({2, 3}) of counter j.
  const __m512i w01 = _mm512_mask_shuffle_epi32(s.c0, 0xAAAA, s.c1, _MM_PERM_CDAB);
  const __m512i w23 = _mm512_mask_shuffle_epi32(s.c2, 0xAAAA, s.c3, _MM_PERM_CDAB);
  _mm512_storeu_si512(out128, _mm512_permutex2var_epi64(w01, _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11), w23));
  _mm512_storeu_si512(out128 + 64, _mm512_permutex2var_epi64(w01, _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15), w23));
}

// Philox4x32-10 for 16 consecutive counters (first_counter + i, mod 2^60: positions are mod 2^64);
// writes their 256 output bytes in stream order.
void philox16_bytes(uint64_t first_counter, uint32_t seed_lo, uint32_t seed_hi, uint8_t* out256) {
  const __m512i counter_mask = _mm512_set1_epi64((int64_t{1} << 60) - 1);
  const __m512i base = _mm512_set1_epi64(static_cast<int64_t>(first_counter));
  const __m512i ca = _mm512_and_si512(_mm512_add_epi64(base, _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7)), counter_mask);
  const __m512i cb = _mm512_and_si512(_mm512_add_epi64(base, _mm512_setr_epi64(8, 9, 10, 11, 12, 13, 14, 15)), counter_mask);
  Philox8x64 a{ca, _mm512_srli_epi64(ca, 32), _mm512_setzero_si512(), _mm512_setzero_si512()};
  Philox8x64 b{cb, _mm512_srli_epi64(cb, 32), _mm512_setzero_si512(), _mm512_setzero_si512()};
  uint32_t k0 = seed_lo, k1 = seed_hi;
  for (int round = 0; round < 10; ++round) {
    const __m512i key0 = _mm512_set1_epi32(static_cast<int>(k0)), key1 = _mm512_set1_epi32(static_cast<int>(k1));
    philox8x64_round<true>(a, key0, key1);
    philox8x64_round<false>(b, key0, key1);
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  store_philox8x64(a, out256);
  store_philox8x64(b, out256 + 128);
}

void philox_bytes(uint64_t seed, uint64_t first_counter, int64_t counters, uint8_t* out) {
  const uint32_t lo = static_cast<uint32_t>(seed), hi = static_cast<uint32_t>(seed >> 32);
  int64_t c = 0;
  for (; c + 16 <= counters; c += 16) philox16_bytes(first_counter + static_cast<uint64_t>(c), lo, hi, out + 16 * c);
  if (c < counters) {
    alignas(64) uint8_t tail[256];
    philox16_bytes(first_counter + static_cast<uint64_t>(c), lo, hi, tail);
    for (int64_t b = 0; b < 16 * (counters - c); ++b) out[16 * c + b] = tail[b];
  }
}

// FP8 RN satfinite of 16 values: clamp to the largest finite value, then round the FP32 mantissa
// (normal range) or scale by the subnormal quantum and round to an integer (cvtps uses RN-even).
template <bool kE4M3>
inline __m128i fp8_codes16(__m512 y) {
  constexpr int kMant = kE4M3 ? 3 : 2, kBias = kE4M3 ? 7 : 15;
  const __m512 a = _mm512_min_ps(abs_ps(y), _mm512_set1_ps(kE4M3 ? 448.0f : 57344.0f));
  const __m512i u = _mm512_castps_si512(a);
  __m512i normal = _mm512_add_epi32(
      u, _mm512_add_epi32(_mm512_set1_epi32((1 << (22 - kMant)) - 1),
                          _mm512_and_si512(_mm512_srli_epi32(u, 23 - kMant), _mm512_set1_epi32(1))));
  normal = _mm512_sub_epi32(_mm512_srli_epi32(normal, 23 - kMant), _mm512_set1_epi32((127 - kBias) << kMant));
  const __m512i subnormal = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(kE4M3 ? 0x1p9f : 0x1p16f)));
  __m512i code = _mm512_mask_mov_epi32(
      normal, _mm512_cmp_ps_mask(a, _mm512_set1_ps(kE4M3 ? 0x1p-6f : 0x1p-14f), _CMP_LT_OQ), subnormal);
  code = _mm512_mask_or_epi32(code, _mm512_movepi32_mask(_mm512_castps_si512(y)), code, _mm512_set1_epi32(0x80));
  return _mm512_cvtepi32_epi8(code);
}

template <bool kE4M3>
void fp8_encode_n_t(const float* x, int64_t n, float mult, uint8_t* out) {
  const __m512 m = _mm512_set1_ps(mult);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), fp8_codes16<kE4M3>(_mm512_mul_ps(_mm512_loadu_ps(x + i), m)));
  if (i < n) {
    __mmask16 tail = static_cast<__mmask16>((1u << (n - i)) - 1u);
    __m128i codes = fp8_codes16<kE4M3>(_mm512_mul_ps(_mm512_maskz_loadu_ps(tail, x + i), m));
    _mm_mask_storeu_epi8(out + i, tail, codes);
  }
}

void fp8_encode_n(const float* x, int64_t n, float mult, bool e4m3, uint8_t* out) {
  if (e4m3) fp8_encode_n_t<true>(x, n, mult, out);
  else fp8_encode_n_t<false>(x, n, mult, out);
}

void e2m1_decode16(const uint8_t* packed8, float factor, float* out16) {
  const __m512 values = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f,
                                       -2.0f, -3.0f, -4.0f, -6.0f);
  __m512i bytes = _mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(packed8)));
  // Each 64-bit lane becomes (low nibble, high nibble) as two 32-bit lanes.
  __m512i idx = _mm512_or_si512(_mm512_and_si512(bytes, _mm512_set1_epi64(0xF)),
                                _mm512_slli_epi64(_mm512_srli_epi64(bytes, 4), 32));
  _mm512_storeu_ps(out16, _mm512_mul_ps(_mm512_permutexvar_ps(idx, values), _mm512_set1_ps(factor)));
}

void decode_bytes16(const uint8_t* codes, const float* value_of_code, float factor, float* out16) {
  __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  _mm512_storeu_ps(out16, _mm512_mul_ps(_mm512_i32gather_ps(idx, value_of_code, 4), _mm512_set1_ps(factor)));
}

// ---- The NVFP4 1x16 RN hot path, 16 blocks (256 values) per step ----------------------------

// Lane j of the result: max |x| of block j (x[16j .. 16j+15]), for values that are not NaN. A tree
// of two-source permutes folds 16 registers into one: ~3 operations per block instead of a full
// horizontal reduction each. The first level takes the absolute values on the way (vrangeps:
// larger magnitude, sign cleared), then every level is a plain maximum of non-negative values.
inline __m512 block_maxima16(const float* x) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  // Pairwise maxima of neighbouring lanes of p (lanes 0-7) and q (lanes 8-15): the halves keep
  // block order, so after four levels lane j belongs to block j.
  __m512 level[8];
  for (int i = 0; i < 8; ++i) {
    const __m512 p = _mm512_loadu_ps(x + 32 * i), q = _mm512_loadu_ps(x + 32 * i + 16);
    level[i] = _mm512_range_ps(_mm512_permutex2var_ps(p, even, q), _mm512_permutex2var_ps(p, odd, q), 0x0B);
  }
  for (int width = 8; width > 1; width /= 2)
    for (int i = 0; i < width / 2; ++i)
      level[i] = _mm512_max_ps(_mm512_permutex2var_ps(level[2 * i], even, level[2 * i + 1]),
                               _mm512_permutex2var_ps(level[2 * i], odd, level[2 * i + 1]));
  return level[0];
}

// E4M3 RN satfinite of 16 non-negative scales (e4m3_encode_nonnegative, lane by lane).
inline __m512i e4m3_codes_nonnegative(__m512 a) {
  a = _mm512_min_ps(a, _mm512_set1_ps(448.0f));
  const __m512i u = _mm512_castps_si512(a);
  __m512i normal = _mm512_add_epi32(
      u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFFF), _mm512_and_si512(_mm512_srli_epi32(u, 20), _mm512_set1_epi32(1))));
  normal = _mm512_sub_epi32(_mm512_srli_epi32(normal, 20), _mm512_set1_epi32(120 << 3));
  const __m512i subnormal = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(512.0f)));
  return _mm512_mask_mov_epi32(normal, _mm512_cmp_ps_mask(a, _mm512_set1_ps(0x1p-6f), _CMP_LT_OQ), subnormal);
}

// E2M1 RN codes of 16 finite-or-infinite (never NaN) values by table lookup instead of seven
// compares. After clamping |y| to [1/8, 8] (which changes no code), bits >> 21 is the exponent
// and two mantissa bits, and every rounding threshold t is a multiple of 2^21 in bit space:
//   |y| >= t  <=>  bits >> 21 >= t_bits >> 21        (thresholds 0.75, 1.75, 3.5: ties round up)
//   |y| >  t  <=>  (bits - 1) >> 21 >= t_bits >> 21  (thresholds 0.25, 1.25, 2.5, 5: ties round down)
// so the magnitude index is a sum of two lookups; the 25 possible keys are distinct modulo 32,
// which is all a two-register permute looks at.
struct E2M1KeyTables {
  alignas(64) int32_t ties_down[32];  // thresholds 0.25, 1.25, 2.5, 5 passed, by key (bits - 1) >> 21
  alignas(64) int32_t ties_up[32];    // thresholds 0.75, 1.75, 3.5 passed, by key bits >> 21
};

constexpr E2M1KeyTables make_e2m1_key_tables() {
  E2M1KeyTables t{};
  // Threshold keys: 0.25 -> 500, 0.75 -> 506, 1.25 -> 509, 1.75 -> 511, 2.5 -> 513, 3.5 -> 515,
  // 5 -> 517. Keys 495..520 occur; slots 9..15 (keys 521..527) hold key 495 (|y| = 1/8) and zeros.
  for (int key = 496; key <= 520; ++key) {
    t.ties_down[key % 32] = (key >= 500) + (key >= 509) + (key >= 513) + (key >= 517);
    t.ties_up[key % 32] = (key >= 506) + (key >= 511) + (key >= 515);
  }
  return t;
}
constexpr E2M1KeyTables kE2M1KeyTables = make_e2m1_key_tables();

struct E2M1Tables {
  __m512i ties_down_lo, ties_down_hi, ties_up_lo, ties_up_hi;
};

inline E2M1Tables load_e2m1_tables() {
  return {_mm512_load_si512(kE2M1KeyTables.ties_down), _mm512_load_si512(kE2M1KeyTables.ties_down + 16),
          _mm512_load_si512(kE2M1KeyTables.ties_up), _mm512_load_si512(kE2M1KeyTables.ties_up + 16)};
}

// The codes (one per 32-bit lane) of 4 consecutive blocks -> their 32 packed bytes, element 2i in
// the low nibble of byte i: saturating packs gather all 64 codes as bytes (lane L of the register:
// codes 4L..4L+3 of each block), one multiply-add forms each byte pair c0 + 16 * c1, and a word
// permute puts the pairs in block order. 7 operations instead of 4 per block.
inline void pack_nibbles4(__m512i a, __m512i b, __m512i c, __m512i d, uint8_t* out32) {
  const __m512i bytes = _mm512_packus_epi16(_mm512_packus_epi32(a, b), _mm512_packus_epi32(c, d));
  // Word 8L + w of pairs: pair 2L + (w & 1) of block w / 2.
  const __m512i pairs = _mm512_maddubs_epi16(bytes, _mm512_set1_epi16(0x1001));
  // Output word 8g + m (pair m of block g) is input word 8 (m / 2) + 2 g + (m & 1).
  const __m512i order = _mm512_set_epi16(31, 30, 23, 22, 15, 14, 7, 6, 29, 28, 21, 20, 13, 12, 5, 4,  //
                                         27, 26, 19, 18, 11, 10, 3, 2, 25, 24, 17, 16, 9, 8, 1, 0);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out32), _mm512_cvtepi16_epi8(_mm512_permutexvar_epi16(order, pairs)));
}

inline __m512i e2m1_codes_rn_finite(__m512 y, const E2M1Tables& t) {
  const __m512 a = _mm512_min_ps(_mm512_max_ps(abs_ps(y), _mm512_set1_ps(0.125f)), _mm512_set1_ps(8.0f));
  const __m512i bits = _mm512_castps_si512(a);
  const __m512i key_down = _mm512_srli_epi32(_mm512_sub_epi32(bits, _mm512_set1_epi32(1)), 21);
  const __m512i key_up = _mm512_srli_epi32(bits, 21);
  const __m512i mag = _mm512_add_epi32(_mm512_permutex2var_epi32(t.ties_down_lo, key_down, t.ties_down_hi),
                                       _mm512_permutex2var_epi32(t.ties_up_lo, key_up, t.ties_up_hi));
  // mag | (sign bit moved to bit 3): ternary logic A | (B & C) = 0xF8.
  return _mm512_ternarylogic_epi32(mag, _mm512_srli_epi32(_mm512_castps_si512(y), 28), _mm512_set1_epi32(8), 0xF8);
}

void e2m1_rn16(const float* x, float enc, uint8_t* packed8) {
  const __m512 y = _mm512_mul_ps(_mm512_loadu_ps(x), _mm512_set1_ps(enc));
  __m512i codes = e2m1_codes_rn_finite(y, load_e2m1_tables());
  // NaN (only possible after an overflowing RHT) encodes to +6, as e2m1_encode_rn does.
  codes = _mm512_mask_mov_epi32(codes, _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q), _mm512_set1_epi32(7));
  pack_nibbles(codes, packed8);
}

// E2M1 stochastic rounding of 16 values that are not NaN, by the same keys as the RN tables: after
// clamping |y| to [1/8, 8], bits >> 21 orders like |y| against every grid point (each has at most
// one mantissa bit), so one lookup gives lo (the largest grid point <= |y|, 7 when |y| >= 6), its
// value and 256 / (next grid point - lo). Then 256 * frac = (|y| - lo) * that is exact (see
// e2m1_encode_sr in format/codecs.h) and the reference's (r + 0.5) / 256 < frac is r + 0.5 < 256 * frac.
// Saturated lanes have factor 0, so they never round up (Inf * 0 = NaN compares false too).
struct E2M1SrKeyTables {
  alignas(64) int32_t lo[32];
  alignas(64) float lo_value[32];
  alignas(64) float scale256[32];
};

constexpr E2M1SrKeyTables make_e2m1_sr_key_tables() {
  constexpr float grid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  E2M1SrKeyTables t{};
  for (uint32_t key = 496; key <= 520; ++key) {  // |y| in [1/8, 8]
    int lo = 0;
    for (int g = 1; g < 8; ++g)
      if (key >= (std::bit_cast<uint32_t>(grid[g]) >> 21)) lo = g;
    t.lo[key % 32] = lo;
    t.lo_value[key % 32] = lo < 7 ? grid[lo] : 0.0f;
    t.scale256[key % 32] = lo < 7 ? 256.0f / (grid[lo + 1] - grid[lo]) : 0.0f;
  }
  return t;
}
constexpr E2M1SrKeyTables kE2M1SrKeyTables = make_e2m1_sr_key_tables();

struct E2M1SrTables {
  __m512i lo_a, lo_b;
  __m512 value_a, value_b, scale_a, scale_b;
};

inline E2M1SrTables load_e2m1_sr_tables() {
  const E2M1SrKeyTables& t = kE2M1SrKeyTables;
  return {_mm512_load_si512(t.lo), _mm512_load_si512(t.lo + 16), _mm512_load_ps(t.lo_value),
          _mm512_load_ps(t.lo_value + 16), _mm512_load_ps(t.scale256), _mm512_load_ps(t.scale256 + 16)};
}

// 16 random bytes -> the thresholds times 256, r + 0.5 (exact), one per lane.
inline __m512 sr_thresholds256(const uint8_t* r8) {
  const __m512i r = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r8)));
  return _mm512_add_ps(_mm512_cvtepi32_ps(r), _mm512_set1_ps(0.5f));
}

inline __m512i e2m1_codes_sr_not_nan(__m512 y, __m512 thr256, const E2M1SrTables& t) {
  const __m512 a = abs_ps(y);
  const __m512 clamped = _mm512_min_ps(_mm512_max_ps(a, _mm512_set1_ps(0.125f)), _mm512_set1_ps(8.0f));
  const __m512i key = _mm512_srli_epi32(_mm512_castps_si512(clamped), 21);
  const __m512i lo = _mm512_permutex2var_epi32(t.lo_a, key, t.lo_b);
  const __m512 frac256 = _mm512_mul_ps(_mm512_sub_ps(a, _mm512_permutex2var_ps(t.value_a, key, t.value_b)),
                                       _mm512_permutex2var_ps(t.scale_a, key, t.scale_b));
  const __m512i mag = _mm512_mask_add_epi32(lo, _mm512_cmp_ps_mask(thr256, frac256, _CMP_LT_OQ), lo, _mm512_set1_epi32(1));
  // mag | (sign bit moved to bit 3): ternary logic A | (B & C) = 0xF8.
  return _mm512_ternarylogic_epi32(mag, _mm512_srli_epi32(_mm512_castps_si512(y), 28), _mm512_set1_epi32(8), 0xF8);
}

void e2m1_sr16(const float* x, float enc, const uint8_t* r8, uint8_t* packed8) {
  const __m512 y = _mm512_mul_ps(_mm512_loadu_ps(x), _mm512_set1_ps(enc));
  __m512i codes = e2m1_codes_sr_not_nan(y, sr_thresholds256(r8), load_e2m1_sr_tables());
  // NaN (only after an overflowing RHT) saturates with its sign, as e2m1_encode_sr does.
  codes = _mm512_mask_or_epi32(codes, _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q), codes, _mm512_set1_epi32(7));
  pack_nibbles(codes, packed8);
}

// Defined after the shared kernels, whose sr_bytes they use.
bool nvfp4_blocks_fast(const Nvfp4Job& job, int64_t block_begin, int64_t block_end);
void nvfp4_transposed(const Nvfp4Job& job, const float* x, int64_t ld, int64_t panel_begin, int64_t panel_end);
void rht_amax_transposed(const float* x, int64_t ld, int64_t rows, int64_t cols, int64_t panel_begin,
                         int64_t panel_end, uint32_t* input_max_abs_bits, float* transformed_amax);
bool nvfp4_tiles_fast(const Nvfp4Job& job, int64_t tile_begin, int64_t tile_end);
constexpr auto* kNvfp4TransposedKernel = &nvfp4_transposed;
constexpr auto* kRhtAmaxTransposedKernel = &rht_amax_transposed;

#include "kernels/cpu/common/transpose8x8_avx.inc"
#include "kernels/cpu/quantize/quantize_kernels_impl.inc"

// ---- The NVFP4 1x16 hot paths, 16 blocks (256 values) per step ------------------------------
// Round to nearest or stochastic, with or without the RHT (when Job::rht_finite: no NaN can occur,
// so the transform, the block maxima and the encoders skip their NaN handling). Per 16 blocks: the
// block maxima in one register, the 16 scale bytes and element multipliers at once, then the codes
// block by block. SR bytes are drawn for kSrBatchElements values at a time.
template <bool kRht, bool kSr>
void nvfp4_blocks_t(const Nvfp4Job& job, int64_t block_begin, int64_t block_end) {
  const E2M1Tables rn_tables = load_e2m1_tables();
  const E2M1SrTables sr_tables = load_e2m1_sr_tables();
  const __m512 c = _mm512_set1_ps(job.encode_times_rcp6);
  alignas(64) float enc[16];
  alignas(64) float transformed[kRht ? 256 : 16];
  alignas(64) uint8_t random[kSr ? kSrBufferBytes : 64];
  const int64_t batch = kSr ? kSrBatchElements / 16 : block_end - block_begin;
  for (int64_t b0 = block_begin; b0 < block_end; b0 += batch) {
    const int64_t b1 = min_i64(b0 + batch, block_end);
    const uint8_t* r = nullptr;
    if constexpr (kSr) r = sr_bytes(job.seed, job.offset + static_cast<uint64_t>(b0 * 16), (b1 - b0) * 16, random);
    // Codes of block `i` (values v, element multiplier e), one per lane.
    auto codes_of = [&](const float* v, float e, int64_t i) {
      const __m512 y = _mm512_mul_ps(_mm512_loadu_ps(v), _mm512_set1_ps(e));
      if constexpr (kSr) return e2m1_codes_sr_not_nan(y, sr_thresholds256(r + (i - b0) * 16), sr_tables);
      else return e2m1_codes_rn_finite(y, rn_tables);
    };
    int64_t i = b0;
    for (; i + 16 <= b1; i += 16) {
      const float* v = job.x + (i - job.x_first_block) * 16;
      for (int line = 0; line < 16; ++line) _mm_prefetch(reinterpret_cast<const char*>(v + kPrefetchFloats + 16 * line), _MM_HINT_T0);
      if constexpr (kRht) {
        for (int j = 0; j < 16; ++j) _mm512_store_ps(transformed + 16 * j, rht16_bf16_finite(_mm512_loadu_ps(v + 16 * j)));
        v = transformed;
      }
      // Scales of 16 blocks at once: sdec = b * (S_enc * 1/6), its E4M3 byte, then the element
      // multiplier min(1 / (decode(s) * S_dec), FLT_MAX) looked up per byte.
      const __m512i s = e4m3_codes_nonnegative(_mm512_mul_ps(block_maxima16(v), c));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(job.scales + i), _mm512_cvtepi32_epi8(s));
      _mm512_store_ps(enc, _mm512_i32gather_ps(s, job.enc_of_scale, 4));
      for (int j = 0; j < 16; j += 4)
        pack_nibbles4(codes_of(v + 16 * j, enc[j], i + j), codes_of(v + 16 * j + 16, enc[j + 1], i + j + 1),
                      codes_of(v + 16 * j + 32, enc[j + 2], i + j + 2), codes_of(v + 16 * j + 48, enc[j + 3], i + j + 3),
                      job.codes + (i + j) * 8);
    }
    for (; i < b1; ++i) {
      const float* v = job.x + (i - job.x_first_block) * 16;
      if constexpr (kRht) {
        _mm512_store_ps(transformed, rht16_bf16_finite(_mm512_loadu_ps(v)));
        v = transformed;
      }
      const uint8_t s = e4m3_encode_nonnegative(absmax16(v) * job.encode_times_rcp6);
      job.scales[i] = s;
      pack_nibbles(codes_of(v, job.enc_of_scale[s], i), job.codes + i * 8);
    }
  }
}

bool nvfp4_blocks_fast(const Nvfp4Job& job, int64_t block_begin, int64_t block_end) {
  if (job.four_over_six || (job.rht && !job.rht_finite)) return false;
  if (job.rht) {
    if (job.stochastic) nvfp4_blocks_t<true, true>(job, block_begin, block_end);
    else nvfp4_blocks_t<true, false>(job, block_begin, block_end);
  } else {
    if (job.stochastic) nvfp4_blocks_t<false, true>(job, block_begin, block_end);
    else nvfp4_blocks_t<false, false>(job, block_begin, block_end);
  }
  return true;
}

// ---- NVFP4 16x16 tiles (the weights), round to nearest, no RHT --------------------------------
// A tile's 16 rows (one 16-value block each) in 16 registers: the tile amax as a lane-wise maximum
// of their magnitudes, then one reduction, one scale byte and one element multiplier for all 16
// blocks (what nvfp4_tiles computes block by block through absmax16, nvfp4_block and e2m1_rn16,
// out of line, a vzeroupper each). The caller has checked that x is finite.
bool nvfp4_tiles_fast(const Nvfp4Job& job, int64_t tile_begin, int64_t tile_end) {
  if (job.rht || job.stochastic || job.four_over_six) return false;
  const E2M1Tables tables = load_e2m1_tables();
  const int64_t block_cols = job.cols / 16;
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    const int64_t row0 = (t / block_cols) * 16, bc = t % block_cols;
    const int rows = static_cast<int>(min_i64(16, job.rows - row0));  // the last tile may be short
    const float* x = job.x + row0 * job.cols + bc * 16;
    __m512 v[16];
    __m512 magnitude = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) {
      v[r] = r < rows ? _mm512_loadu_ps(x + r * job.cols) : _mm512_setzero_ps();
      magnitude = _mm512_range_ps(magnitude, v[r], 0x0B);  // the larger magnitude, sign cleared
    }
    const uint8_t s = e4m3_encode_nonnegative(absmax_of(magnitude) * job.encode_times_rcp6);
    const __m512 enc = _mm512_set1_ps(job.enc_of_scale[s]);
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) {
      if (r >= rows) break;
      const int64_t first = (row0 + r) * job.cols + bc * 16;
      job.scales[(row0 + r) * block_cols + bc] = s;
      pack_nibbles(e2m1_codes_rn_finite(_mm512_mul_ps(v[r], enc), tables), job.codes + first / 2);
    }
  }
  return true;
}

// ---- NVFP4 1x16 blocks of x^T, read straight from x ------------------------------------------
// A 16x16 tile of x (16 tokens x 16 columns) transposed in registers is 16 blocks of x^T, one per
// column, laid out exactly as the row-wise path above holds them (v + 16 j), so the same per-block
// code (RHT, block maxima, scale bytes, codes) gives the same bytes. Panels of 16 token blocks x 16
// columns: SR bytes come per column for 256 consecutive positions (16 Philox counters at a time), and
// consecutive panels walk along rows of x, whose pages stay in the TLB.
constexpr int64_t kPanelTokenBlocks = 16;

#include "kernels/cpu/common/transpose16x16_avx512.inc"



// rht16_bf16_finite applied down the columns of 16 rows: lane c of every row is one block (16
// tokens of column c). Each butterfly stage pairs row i with row i^h, the low row taking a + b and
// the high one a - b, which are exactly the roundings walsh_hadamard16's FMAs perform lane-wise
// (see there), so every element gets the row-wise transform's bits without a transpose.
// Forced inline and unrolled, so that the 16 rows stay in registers (see transpose16x16).
[[gnu::always_inline]] inline void rht16_bf16_finite_columns(__m512 r[16]) {
  const float signs[16] = {1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1};  // rht_signs()
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = _mm512_mul_ps(r[i], _mm512_set1_ps(signs[i]));
#pragma GCC unroll 4
  for (int h = 1; h < 16; h *= 2)
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i)
      if (!(i & h)) {
        const __m512 a = r[i], b = r[i + h];
        r[i] = _mm512_add_ps(a, b);
        r[i + h] = _mm512_sub_ps(a, b);
      }
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = round_to_bf16_not_nan(_mm512_mul_ps(r[i], _mm512_set1_ps(0.25f)));
}

// Visits the tiles of panels [panel_begin, panel_end) batch by batch (256 tokens), and within a batch
// token block by token block across its column groups: the 16 rows of x being read then advance
// sequentially, streams the prefetchers follow. (Panel by panel, each load jumped a row stride of
// several KB, which no prefetcher covers; the amax pass was load-miss bound.) before_batch(g0, g1,
// tb0, tb1) runs before each batch, tile(group, tb) for each tile.
// A batch spans at most kBatchGroups column groups (512 columns), which bounds the SR buffer.
constexpr int64_t kBatchGroups = 32;
constexpr int64_t kTilePrefetchFloats = 64;

template <class BeforeBatch, class Tile>
void for_tiles(int64_t rows, int64_t cols, int64_t panel_begin, int64_t panel_end, BeforeBatch before_batch, Tile tile) {
  const int64_t groups = cols / 16, token_blocks = rows / 16;
  for (int64_t panel = panel_begin; panel < panel_end;) {
    const int64_t g0 = panel % groups;
    const int64_t g1 = min_i64(min_i64(groups, g0 + kBatchGroups), g0 + (panel_end - panel));
    const int64_t tb0 = panel / groups * kPanelTokenBlocks, tb1 = min_i64(token_blocks, tb0 + kPanelTokenBlocks);
    before_batch(g0, g1, tb0, tb1);
    for (int64_t tb = tb0; tb < tb1; ++tb)
      for (int64_t g = g0; g < g1; ++g) tile(g, tb);
    panel += g1 - g0;
  }
}

template <bool kRht, bool kSr>
void nvfp4_transposed_t(const Nvfp4Job& job, const float* x, int64_t ld, int64_t panel_begin, int64_t panel_end) {
  const int64_t token_blocks = job.cols / 16;  // blocks per row of x^T
  const E2M1Tables rn_tables = load_e2m1_tables();
  const E2M1SrTables sr_tables = load_e2m1_sr_tables();
  const __m512 c = _mm512_set1_ps(job.encode_times_rcp6);
  alignas(64) float enc[16];
  alignas(16) uint8_t scale_bytes[16];
  // SR bytes of the current batch: per column, its (up to) 256 consecutive positions. Plain arrays
  // (no std::vector code in an ISA file: see architecture.md).
  constexpr int64_t kColumnBytes = kPanelTokenBlocks * 16 + 32;
  alignas(64) static thread_local uint8_t random[kSr ? kBatchGroups * 16 * kColumnBytes : 1];
  static thread_local const uint8_t* column_random[kBatchGroups * 16];
  int64_t batch_g0 = 0, batch_tb0 = 0;
  auto before_batch = [&](int64_t g0, int64_t g1, int64_t tb0, int64_t tb1) {
    batch_g0 = g0;
    batch_tb0 = tb0;
    if constexpr (kSr) {
      const int64_t columns = (g1 - g0) * 16;
      for (int64_t col = 0; col < columns; ++col)
        column_random[col] = sr_bytes(job.seed, job.offset + static_cast<uint64_t>(((g0 * 16 + col) * token_blocks + tb0) * 16),
                                      (tb1 - tb0) * 16, random + col * kColumnBytes);
    }
  };
  auto tile = [&](int64_t g, int64_t tb) {
    const int64_t c0 = g * 16;
    // The RHT down the columns before the transpose: the same bits as rht16_bf16_finite on each
    // block after it, without its lane permutes.
    __m512 t[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      t[i] = _mm512_loadu_ps(x + (tb * 16 + i) * ld + c0);
      _mm_prefetch(reinterpret_cast<const char*>(x + (tb * 16 + i) * ld + c0 + kTilePrefetchFloats), _MM_HINT_T0);
    }
    if constexpr (kRht) rht16_bf16_finite_columns(t);
    // Before the transpose lane j of every row is block j: its maximum |value| is a lane-wise max
    // over the 16 rows (block_maxima16's value, without its lane permutes).
    __m512 maxima = _mm512_range_ps(t[0], t[1], 0x0B);
#pragma GCC unroll 16
    for (int i = 2; i < 16; ++i) maxima = _mm512_range_ps(maxima, t[i], 0x0B);
    transpose16x16_ps(t);
    const __m512i s = e4m3_codes_nonnegative(_mm512_mul_ps(maxima, c));
    _mm_store_si128(reinterpret_cast<__m128i*>(scale_bytes), _mm512_cvtepi32_epi8(s));
    _mm512_store_ps(enc, _mm512_i32gather_ps(s, job.enc_of_scale, 4));
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) {
      const int64_t block = (c0 + j) * token_blocks + tb;
      job.scales[block] = scale_bytes[j];
      const __m512 y = _mm512_mul_ps(t[j], _mm512_set1_ps(enc[j]));
      __m512i codes;
      if constexpr (kSr) {
        const uint8_t* r = column_random[(g - batch_g0) * 16 + j] + (tb - batch_tb0) * 16;
        codes = e2m1_codes_sr_not_nan(y, sr_thresholds256(r), sr_tables);
      } else {
        codes = e2m1_codes_rn_finite(y, rn_tables);
      }
      pack_nibbles(codes, job.codes + block * 8);
    }
  };
  for_tiles(job.cols, job.rows, panel_begin, panel_end, before_batch, tile);
}

void nvfp4_transposed(const Nvfp4Job& job, const float* x, int64_t ld, int64_t panel_begin, int64_t panel_end) {
  if (job.rht) {
    if (job.stochastic) nvfp4_transposed_t<true, true>(job, x, ld, panel_begin, panel_end);
    else nvfp4_transposed_t<true, false>(job, x, ld, panel_begin, panel_end);
  } else {
    if (job.stochastic) nvfp4_transposed_t<false, true>(job, x, ld, panel_begin, panel_end);
    else nvfp4_transposed_t<false, false>(job, x, ld, panel_begin, panel_end);
  }
}

void rht_amax_transposed(const float* x, int64_t ld, int64_t rows, int64_t cols, int64_t panel_begin,
                         int64_t panel_end, uint32_t* input_max_abs_bits, float* transformed_amax) {
  const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF);
  __m512i in_max = _mm512_setzero_si512();
  __m512 t_max = _mm512_setzero_ps();
  for_tiles(rows, cols, panel_begin, panel_end, [](int64_t, int64_t, int64_t, int64_t) {}, [&](int64_t g, int64_t tb) {
    __m512 t[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      t[i] = _mm512_loadu_ps(x + (tb * 16 + i) * ld + g * 16);
      in_max = _mm512_max_epu32(in_max, _mm512_and_si512(_mm512_castps_si512(t[i]), magnitude));
    }
    // Garbage when the input holds huge or non-finite values; the caller discards it then.
    rht16_bf16_finite_columns(t);
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) t_max = _mm512_max_ps(t_max, abs_ps(t[i]));
  });
  *input_max_abs_bits = static_cast<uint32_t>(_mm512_reduce_max_epu32(in_max));
  *transformed_amax = _mm512_reduce_max_ps(t_max);
}

}  // namespace
}  // namespace nibble::cpu::kernels::avx512

namespace nibble::cpu::kernels {
const Kernels& avx512_kernels() { return avx512::kKernels; }
}  // namespace nibble::cpu::kernels
