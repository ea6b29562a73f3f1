// AVX-512 (F/BW/VL/DQ) variant of the quantize kernels: one NVFP4 block of 16 FP32 values is one
// zmm register. Compiled with the AVX-512 flags (CMakeLists.txt picks them from the file name);
// only reached when active_isa() says the CPU has them.
#pragma GCC optimize("fp-contract=off")  // -mfma must not fuse the reference's separate mul and add
// GCC 12 warns about the deliberately undefined pass-through operand inside its own AVX-512
// intrinsic headers once an optimize pragma is active (GCC bug 105593); the warning is noise.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <bit>
#include <cstdint>

#include "kernels/cpu/quantize_kernels.h"

namespace nibble::cpu::kernels::avx512 {
namespace {

#include "kernels/cpu/quantize_local_codecs.inc"

// Software prefetch distance for the quantize pass (8 KB ahead): on the 64M-value benchmark the
// hardware prefetcher alone left it ~50% slower. (The amax scan, a pure read, gains nothing.)
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

void e2m1_sr16(const float* x, float enc, const float* u, uint8_t* packed8) {
  const __m512 grid = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, 6.0f, 6.0f, 6.0f, 6.0f, 6.0f,
                                     6.0f, 6.0f, 6.0f);
  const __m512 y = _mm512_mul_ps(_mm512_loadu_ps(x), _mm512_set1_ps(enc));
  const __m512 a = abs_ps(y);
  const __m512i one = _mm512_set1_epi32(1);
  // lo = index of the largest grid value <= a.
  __m512i lo = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(a, _mm512_set1_ps(0.5f), _CMP_GE_OQ), one);
  lo = _mm512_mask_add_epi32(lo, _mm512_cmp_ps_mask(a, _mm512_set1_ps(1.0f), _CMP_GE_OQ), lo, one);
  lo = _mm512_mask_add_epi32(lo, _mm512_cmp_ps_mask(a, _mm512_set1_ps(1.5f), _CMP_GE_OQ), lo, one);
  lo = _mm512_mask_add_epi32(lo, _mm512_cmp_ps_mask(a, _mm512_set1_ps(2.0f), _CMP_GE_OQ), lo, one);
  lo = _mm512_mask_add_epi32(lo, _mm512_cmp_ps_mask(a, _mm512_set1_ps(3.0f), _CMP_GE_OQ), lo, one);
  lo = _mm512_mask_add_epi32(lo, _mm512_cmp_ps_mask(a, _mm512_set1_ps(4.0f), _CMP_GE_OQ), lo, one);
  const __m512 lo_v = _mm512_permutexvar_ps(lo, grid);
  const __m512 hi_v = _mm512_permutexvar_ps(_mm512_add_epi32(lo, one), grid);
  const __m512 frac = _mm512_div_ps(_mm512_sub_ps(a, lo_v), _mm512_sub_ps(hi_v, lo_v));
  __m512i mag = _mm512_mask_add_epi32(lo, _mm512_cmp_ps_mask(_mm512_loadu_ps(u), frac, _CMP_LT_OQ), lo, one);
  mag = _mm512_mask_mov_epi32(mag, _mm512_cmp_ps_mask(a, _mm512_set1_ps(6.0f), _CMP_NLT_UQ), _mm512_set1_epi32(7));
  pack_nibbles(_mm512_mask_or_epi32(mag, _mm512_movepi32_mask(_mm512_castps_si512(y)), mag, _mm512_set1_epi32(8)),
               packed8);
}

// Sylvester butterfly in register, stage h pairs lane j with j^h: the low lane gets a+b, the high
// lane a-b, exactly as format/hadamard.cpp computes them.
inline __m512 walsh_hadamard16(__m512 v) {
  const __m512i xor1 = _mm512_setr_epi32(1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  const __m512i xor2 = _mm512_setr_epi32(2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  const __m512i xor4 = _mm512_setr_epi32(4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
  const __m512i xor8 = _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  __m512 p = _mm512_permutexvar_ps(xor1, v);
  v = _mm512_mask_blend_ps(0xAAAA, _mm512_add_ps(v, p), _mm512_sub_ps(p, v));
  p = _mm512_permutexvar_ps(xor2, v);
  v = _mm512_mask_blend_ps(0xCCCC, _mm512_add_ps(v, p), _mm512_sub_ps(p, v));
  p = _mm512_permutexvar_ps(xor4, v);
  v = _mm512_mask_blend_ps(0xF0F0, _mm512_add_ps(v, p), _mm512_sub_ps(p, v));
  p = _mm512_permutexvar_ps(xor8, v);
  return _mm512_mask_blend_ps(0xFF00, _mm512_add_ps(v, p), _mm512_sub_ps(p, v));
}

inline __m512 rht_signs() {
  return _mm512_setr_ps(1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1);
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

// High and low 32 bits of the 32x32-bit products a*m, lane by lane.
inline void mul_hi_lo(__m512i a, __m512i m, __m512i& hi, __m512i& lo) {
  __m512i even = _mm512_mul_epu32(a, m);
  __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);
  hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
  lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
}

// Philox4x32-10 for 16 consecutive counters at once (lane i: counter first_counter + i); writes
// the 64 uniforms of stream positions 4*first_counter ... in order.
void philox16(uint64_t first_counter, uint64_t seed, float* out64) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i base_lo = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(first_counter)));
  __m512i c0 = _mm512_add_epi32(base_lo, lane);
  // Carry into the high word for lanes whose low word wrapped.
  __mmask16 wrapped = _mm512_cmplt_epu32_mask(c0, base_lo);
  __m512i c1 = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(first_counter >> 32)));
  c1 = _mm512_mask_add_epi32(c1, wrapped, c1, _mm512_set1_epi32(1));
  __m512i c2 = _mm512_setzero_si512(), c3 = _mm512_setzero_si512();
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(0xD2511F53u)), m1 = _mm512_set1_epi32(static_cast<int>(0xCD9E8D57u));
  for (int round = 0; round < 10; ++round) {
    __m512i hi0, lo0, hi1, lo1;
    mul_hi_lo(c0, m0, hi0, lo0);
    mul_hi_lo(c2, m1, hi1, lo1);
    c0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32(static_cast<int>(k0)));
    c2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32(static_cast<int>(k1)));
    c1 = lo1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  alignas(64) float words[4][16];
  const __m512 scale = _mm512_set1_ps(0x1.0p-24f);
  _mm512_store_ps(words[0], _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(c0, 8)), scale));
  _mm512_store_ps(words[1], _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(c1, 8)), scale));
  _mm512_store_ps(words[2], _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(c2, 8)), scale));
  _mm512_store_ps(words[3], _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(c3, 8)), scale));
  for (int c = 0; c < 16; ++c)
    for (int w = 0; w < 4; ++w) out64[4 * c + w] = words[w][c];
}

void philox_uniforms(uint64_t seed, uint64_t first_position, int64_t n, float* out) {
  alignas(64) float batch[64];
  uint64_t position = first_position;
  const uint64_t end = first_position + static_cast<uint64_t>(n);
  while (position < end) {
    const uint64_t counter = position >> 2;
    philox16(counter, seed, batch);
    const uint64_t batch_end = (counter + 16) * 4 < end ? (counter + 16) * 4 : end;
    for (uint64_t p = position; p < batch_end; ++p) out[p - first_position] = batch[p - counter * 4];
    position = batch_end;
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

// Lane j of the result: the largest |x| bit pattern of block j (x[16j .. 16j+15]). A tree of
// two-source permutes folds 16 registers into one: ~3 operations per block instead of a full
// horizontal reduction each. For finite values the integer maximum is the float maximum.
inline __m512i block_maxima16(const float* x) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  // Pairwise maxima of neighbouring lanes of p (lanes 0-7) and q (lanes 8-15): the halves keep
  // block order, so after four levels lane j belongs to block j.
  auto fold = [&](__m512i p, __m512i q) {
    return _mm512_max_epu32(_mm512_permutex2var_epi32(p, even, q), _mm512_permutex2var_epi32(p, odd, q));
  };
  __m512i level[16];
  for (int i = 0; i < 16; ++i) level[i] = _mm512_and_si512(_mm512_loadu_si512(x + 16 * i), abs_mask);
  for (int width = 16; width > 1; width /= 2)
    for (int i = 0; i < width / 2; ++i) level[i] = fold(level[2 * i], level[2 * i + 1]);
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

void nvfp4_rn_blocks(const float* x, int64_t block_begin, int64_t block_end, float encode_times_rcp6,
                     const float* enc_of_scale, uint8_t* codes, uint8_t* scales) {
  const E2M1Tables tables = load_e2m1_tables();
  const __m512 c = _mm512_set1_ps(encode_times_rcp6);
  alignas(64) float enc[16];
  int64_t i = block_begin;
  for (; i + 16 <= block_end; i += 16) {
    const float* v = x + i * 16;
    for (int line = 0; line < 16; ++line) _mm_prefetch(reinterpret_cast<const char*>(v + kPrefetchFloats + 16 * line), _MM_HINT_T0);
    // Scales of 16 blocks at once: sdec = b * (S_enc * 1/6), its E4M3 byte, then the element
    // multiplier min(1 / (decode(s) * S_dec), FLT_MAX) looked up per byte.
    const __m512 b = _mm512_castsi512_ps(block_maxima16(v));
    const __m512i s = e4m3_codes_nonnegative(_mm512_mul_ps(b, c));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(scales + i), _mm512_cvtepi32_epi8(s));
    _mm512_store_ps(enc, _mm512_i32gather_ps(s, enc_of_scale, 4));
    for (int j = 0; j < 16; ++j) {
      const __m512 y = _mm512_mul_ps(_mm512_loadu_ps(v + 16 * j), _mm512_set1_ps(enc[j]));
      pack_nibbles(e2m1_codes_rn_finite(y, tables), codes + (i + j) * 8);
    }
  }
  for (; i < block_end; ++i) {
    const float* v = x + i * 16;
    uint8_t s = e4m3_encode_nonnegative(absmax16(v) * encode_times_rcp6);
    scales[i] = s;
    pack_nibbles(e2m1_codes_rn_finite(_mm512_mul_ps(_mm512_loadu_ps(v), _mm512_set1_ps(enc_of_scale[s])), tables),
                 codes + i * 8);
  }
}

#include "kernels/cpu/quantize_transpose_avx.inc"
#include "kernels/cpu/quantize_kernels_impl.inc"

}  // namespace
}  // namespace nibble::cpu::kernels::avx512

namespace nibble::cpu::kernels {
const Kernels& avx512_kernels() { return avx512::kKernels; }
}  // namespace nibble::cpu::kernels
