// AVX2 variant of the quantize kernels: one NVFP4 block of 16 FP32 values is two ymm registers.
// Compiled with -mavx2 -mfma (CMakeLists.txt picks the flags from the file name); only reached
// when active_isa() allows AVX2.
#pragma GCC optimize("fp-contract=off")  // -mfma must not fuse the reference's separate mul and add
#include <immintrin.h>

#include <bit>
#include <cstdint>

#include "kernels/cpu/quantize/quantize_kernels.h"

namespace nibble::cpu::kernels::avx2 {
namespace {

#include "kernels/cpu/quantize/quantize_local_codecs.inc"

inline __m256 abs_ps(__m256 v) {
  return _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7FFFFFFF)));
}

inline uint32_t hmax_epu32(__m256i m) {
  __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  h = _mm_max_epu32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
  h = _mm_max_epu32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(h));
}

uint32_t max_abs_bits(const float* x, int64_t n) {
  const __m256i mask = _mm256_set1_epi32(0x7FFFFFFF);
  __m256i m0 = _mm256_setzero_si256(), m1 = m0, m2 = m0, m3 = m0;
  auto load = [&](int64_t i) {
    return _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), mask);
  };
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    m0 = _mm256_max_epu32(m0, load(i));
    m1 = _mm256_max_epu32(m1, load(i + 8));
    m2 = _mm256_max_epu32(m2, load(i + 16));
    m3 = _mm256_max_epu32(m3, load(i + 24));
  }
  for (; i + 8 <= n; i += 8) m0 = _mm256_max_epu32(m0, load(i));
  uint32_t m = hmax_epu32(_mm256_max_epu32(_mm256_max_epu32(m0, m1), _mm256_max_epu32(m2, m3)));
  for (; i < n; ++i) {
    uint32_t a = std::bit_cast<uint32_t>(x[i]) & 0x7FFFFFFFu;
    m = a > m ? a : m;
  }
  return m;
}

// Finite, non-negative values: the integer maximum of the bit patterns is the float maximum.
inline float absmax_of(__m256 a0, __m256 a1) {
  __m256i m = _mm256_max_epu32(_mm256_castps_si256(abs_ps(a0)), _mm256_castps_si256(abs_ps(a1)));
  return std::bit_cast<float>(hmax_epu32(m));
}

float absmax16(const float* x) { return absmax_of(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8)); }

float absmax16_ignore_nan(const float* x) {
  __m256 a0 = _mm256_loadu_ps(x), a1 = _mm256_loadu_ps(x + 8);
  a0 = _mm256_and_ps(a0, _mm256_cmp_ps(a0, a0, _CMP_ORD_Q));
  a1 = _mm256_and_ps(a1, _mm256_cmp_ps(a1, a1, _CMP_ORD_Q));
  return absmax_of(a0, a1);
}

// A compare mask (all ones = -1) subtracted from the count adds one per passed threshold.
inline __m256i count_if(__m256i count, __m256 passed) { return _mm256_sub_epi32(count, _mm256_castps_si256(passed)); }

// E2M1 RN codes (sign | magnitude index) of 8 values, by the spec's thresholds.
inline __m256i e2m1_codes_rn(__m256 y) {
  const __m256 a = abs_ps(y);
  __m256i mag = count_if(_mm256_setzero_si256(), _mm256_cmp_ps(a, _mm256_set1_ps(0.25f), _CMP_GT_OQ));
  mag = count_if(mag, _mm256_cmp_ps(a, _mm256_set1_ps(0.75f), _CMP_GE_OQ));
  mag = count_if(mag, _mm256_cmp_ps(a, _mm256_set1_ps(1.25f), _CMP_GT_OQ));
  mag = count_if(mag, _mm256_cmp_ps(a, _mm256_set1_ps(1.75f), _CMP_GE_OQ));
  mag = count_if(mag, _mm256_cmp_ps(a, _mm256_set1_ps(2.5f), _CMP_GT_OQ));
  mag = count_if(mag, _mm256_cmp_ps(a, _mm256_set1_ps(3.5f), _CMP_GE_OQ));
  mag = count_if(mag, _mm256_cmp_ps(a, _mm256_set1_ps(5.0f), _CMP_GT_OQ));
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(y), 28), _mm256_set1_epi32(8));
  // NaN (only possible after an overflowing RHT) encodes to +6, as e2m1_encode_rn does.
  return _mm256_blendv_epi8(_mm256_or_si256(mag, sign), _mm256_set1_epi32(7),
                            _mm256_castps_si256(_mm256_cmp_ps(y, y, _CMP_UNORD_Q)));
}

// 16 codes (8 per register, one per 32-bit lane) -> 8 bytes, element 2i in the low nibble of byte i.
inline void pack_nibbles(__m256i lo8, __m256i hi8, uint8_t* out8) {
  // Byte 0 of each 64-bit lane becomes code(2i) | code(2i+1) << 4.
  const __m256i pairs_lo = _mm256_or_si256(lo8, _mm256_srli_epi64(lo8, 28));
  const __m256i pairs_hi = _mm256_or_si256(hi8, _mm256_srli_epi64(hi8, 28));
  // Gather those bytes so that OR-ing the two 128-bit halves yields bytes 0..7 in order.
  const __m256i pick_lo = _mm256_setr_epi8(0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                           -1, -1, 0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i pick_hi = _mm256_setr_epi8(-1, -1, -1, -1, 0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                           -1, -1, -1, -1, -1, -1, 0, 8, -1, -1, -1, -1, -1, -1, -1, -1);
  __m256i s = _mm256_or_si256(_mm256_shuffle_epi8(pairs_lo, pick_lo), _mm256_shuffle_epi8(pairs_hi, pick_hi));
  __m128i bytes = _mm_or_si128(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out8), bytes);
}

void e2m1_rn16(const float* x, float enc, uint8_t* packed8) {
  const __m256 e = _mm256_set1_ps(enc);
  pack_nibbles(e2m1_codes_rn(_mm256_mul_ps(_mm256_loadu_ps(x), e)),
               e2m1_codes_rn(_mm256_mul_ps(_mm256_loadu_ps(x + 8), e)), packed8);
}

// SR codes of 8 values; thr256: the thresholds times 256, r + 0.5 (see e2m1_encode_sr in
// format/codecs.h: 256 * frac is exact as (a - lo) * (256 / (hi - lo)), so the comparison
// r + 0.5 < 256 frac is the reference's (r + 0.5) / 256 < frac).
inline __m256i e2m1_codes_sr(__m256 y, __m256 thr256) {
  const __m256 grid = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
  const __m256 scale256 = _mm256_setr_ps(512.0f, 512.0f, 512.0f, 512.0f, 256.0f, 256.0f, 128.0f, 0.0f);
  const __m256 a = abs_ps(y);
  // lo = index of the largest grid value <= a, from a's bits: for a >= 1 the grid holds two values
  // per binade (1, 1.5 | 2, 3 | 4, 6), so the index is 2 * (exponent - 127) + 2 + the mantissa's top
  // bit = (bits >> 22) - 252; [0.5, 1) is index 1 and below 0.5 the difference is negative: 0.
  // Capped at 6 (a >= 6 and NaN become 7 below). Six integer operations instead of six compares and
  // six subtractions.
  const __m256i bits = _mm256_castps_si256(a);
  const __m256i from_exponent = _mm256_sub_epi32(_mm256_srli_epi32(bits, 22), _mm256_set1_epi32(252));
  const __m256i at_least_half = _mm256_srli_epi32(_mm256_cmpgt_epi32(bits, _mm256_set1_epi32(0x3EFFFFFF)), 31);
  const __m256i lo = _mm256_min_epi32(_mm256_max_epi32(from_exponent, at_least_half), _mm256_set1_epi32(6));
  const __m256 frac256 =
      _mm256_mul_ps(_mm256_sub_ps(a, _mm256_permutevar8x32_ps(grid, lo)), _mm256_permutevar8x32_ps(scale256, lo));
  __m256i mag = count_if(lo, _mm256_cmp_ps(thr256, frac256, _CMP_LT_OQ));
  mag = _mm256_blendv_epi8(mag, _mm256_set1_epi32(7), _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(6.0f), _CMP_NLT_UQ)));
  return _mm256_or_si256(mag, _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(y), 28), _mm256_set1_epi32(8)));
}

// 8 random bytes -> thresholds r + 0.5 (exact).
inline __m256 sr_thresholds256(const uint8_t* r8) {
  const __m256i r = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(r8)));
  return _mm256_add_ps(_mm256_cvtepi32_ps(r), _mm256_set1_ps(0.5f));
}

void e2m1_sr16(const float* x, float enc, const uint8_t* r8, uint8_t* packed8) {
  const __m256 e = _mm256_set1_ps(enc);
  pack_nibbles(e2m1_codes_sr(_mm256_mul_ps(_mm256_loadu_ps(x), e), sr_thresholds256(r8)),
               e2m1_codes_sr(_mm256_mul_ps(_mm256_loadu_ps(x + 8), e), sr_thresholds256(r8 + 8)), packed8);
}

// Sylvester butterfly on 16 values in two registers; stage h pairs j with j^h, the low lane gets
// a+b and the high lane a-b, exactly as format/hadamard.cpp computes them. Within a register a
// stage is one permute and one FMA, partner + v * (+-1): the product is exact (a sign flip), so the
// FMA's single rounding is that of b + a (= a + b) or a + (-b) (= a - b), signed zeros included.
inline void walsh_hadamard16(__m256& lo, __m256& hi) {
  const __m256 s1 = _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1);
  const __m256 s2 = _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1);
  const __m256 s4 = _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1);
  lo = _mm256_fmadd_ps(lo, s1, _mm256_permute_ps(lo, _MM_SHUFFLE(2, 3, 0, 1)));
  hi = _mm256_fmadd_ps(hi, s1, _mm256_permute_ps(hi, _MM_SHUFFLE(2, 3, 0, 1)));
  lo = _mm256_fmadd_ps(lo, s2, _mm256_permute_ps(lo, _MM_SHUFFLE(1, 0, 3, 2)));
  hi = _mm256_fmadd_ps(hi, s2, _mm256_permute_ps(hi, _MM_SHUFFLE(1, 0, 3, 2)));
  lo = _mm256_fmadd_ps(lo, s4, _mm256_permute2f128_ps(lo, lo, 0x01));
  hi = _mm256_fmadd_ps(hi, s4, _mm256_permute2f128_ps(hi, hi, 0x01));
  __m256 sum = _mm256_add_ps(lo, hi), diff = _mm256_sub_ps(lo, hi);
  lo = sum;
  hi = diff;
}

inline __m256 rht_signs_lo() { return _mm256_setr_ps(1, 1, 1, -1, 1, -1, -1, -1); }
inline __m256 rht_signs_hi() { return _mm256_setr_ps(-1, -1, -1, 1, -1, 1, -1, -1); }

#include "kernels/cpu/common/bf16_round_avx2.inc"

void rht16_bf16(const float* x, float* out) {
  __m256 lo = _mm256_mul_ps(_mm256_loadu_ps(x), rht_signs_lo());
  __m256 hi = _mm256_mul_ps(_mm256_loadu_ps(x + 8), rht_signs_hi());
  walsh_hadamard16(lo, hi);
  const __m256 quarter = _mm256_set1_ps(0.25f);
  _mm256_storeu_ps(out, round_to_bf16(_mm256_mul_ps(lo, quarter)));
  _mm256_storeu_ps(out + 8, round_to_bf16(_mm256_mul_ps(hi, quarter)));
}

void rht16_inverse(float* v) {
  __m256 lo = _mm256_loadu_ps(v), hi = _mm256_loadu_ps(v + 8);
  walsh_hadamard16(lo, hi);
  const __m256 quarter = _mm256_set1_ps(0.25f);
  _mm256_storeu_ps(v, _mm256_mul_ps(lo, _mm256_mul_ps(rht_signs_lo(), quarter)));
  _mm256_storeu_ps(v + 8, _mm256_mul_ps(hi, _mm256_mul_ps(rht_signs_hi(), quarter)));
}

float wht_absmax(const float* x, int64_t n) {
  __m256 m = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    __m256 lo = _mm256_mul_ps(_mm256_loadu_ps(x + i), rht_signs_lo());
    __m256 hi = _mm256_mul_ps(_mm256_loadu_ps(x + i + 8), rht_signs_hi());
    walsh_hadamard16(lo, hi);
    // max_ps returns its second operand when either is NaN: NaN values are skipped.
    m = _mm256_max_ps(abs_ps(lo), m);
    m = _mm256_max_ps(abs_ps(hi), m);
  }
  return std::bit_cast<float>(hmax_epu32(_mm256_castps_si256(m)));  // non-negative: bit order is float order
}

inline void mul_hi_lo(__m256i a, __m256i m, __m256i& hi, __m256i& lo) {
  __m256i even = _mm256_mul_epu32(a, m);
  __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}

// Philox4x32-10 for 8 consecutive counters (lane i: first_counter + i, mod 2^60); writes their
// 128 output bytes in stream order (counter by counter, words in order, little-endian).
void philox8_bytes(uint64_t first_counter, uint64_t seed, uint8_t* out128) {
  const __m256i base_lo = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(first_counter)));
  __m256i c0 = _mm256_add_epi32(base_lo, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  // Lanes whose low word wrapped carry one into the high word (unsigned c0 < base_lo).
  const __m256i bias = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  __m256i wrapped = _mm256_cmpgt_epi32(_mm256_xor_si256(base_lo, bias), _mm256_xor_si256(c0, bias));
  __m256i c1 = _mm256_sub_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(first_counter >> 32))), wrapped);
  c1 = _mm256_and_si256(c1, _mm256_set1_epi32(0x0FFFFFFF));  // counters are < 2^60
  __m256i c2 = _mm256_setzero_si256(), c3 = _mm256_setzero_si256();
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(0xD2511F53u)), m1 = _mm256_set1_epi32(static_cast<int>(0xCD9E8D57u));
  for (int round = 0; round < 10; ++round) {
    __m256i hi0, lo0, hi1, lo1;
    mul_hi_lo(c0, m0, hi0, lo0);
    mul_hi_lo(c2, m1, hi1, lo1);
    c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(static_cast<int>(k0)));
    c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(static_cast<int>(k1)));
    c1 = lo1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  // Transpose the 4 x 8 words so each counter's four words are adjacent: o_m holds counter 4L + m
  // in its 128-bit lane L.
  const __m256i t0 = _mm256_unpacklo_epi32(c0, c1), t1 = _mm256_unpackhi_epi32(c0, c1);
  const __m256i t2 = _mm256_unpacklo_epi32(c2, c3), t3 = _mm256_unpackhi_epi32(c2, c3);
  const __m256i o0 = _mm256_unpacklo_epi64(t0, t2), o1 = _mm256_unpackhi_epi64(t0, t2);
  const __m256i o2 = _mm256_unpacklo_epi64(t1, t3), o3 = _mm256_unpackhi_epi64(t1, t3);
  __m256i* out = reinterpret_cast<__m256i*>(out128);
  _mm256_storeu_si256(out + 0, _mm256_permute2x128_si256(o0, o1, 0x20));  // counters 0, 1
  _mm256_storeu_si256(out + 1, _mm256_permute2x128_si256(o2, o3, 0x20));  // 2, 3
  _mm256_storeu_si256(out + 2, _mm256_permute2x128_si256(o0, o1, 0x31));  // 4, 5
  _mm256_storeu_si256(out + 3, _mm256_permute2x128_si256(o2, o3, 0x31));  // 6, 7
}

void philox_bytes(uint64_t seed, uint64_t first_counter, int64_t counters, uint8_t* out) {
  int64_t c = 0;
  for (; c + 8 <= counters; c += 8) philox8_bytes(first_counter + static_cast<uint64_t>(c), seed, out + 16 * c);
  if (c < counters) {
    alignas(32) uint8_t tail[128];
    philox8_bytes(first_counter + static_cast<uint64_t>(c), seed, tail);
    for (int64_t b = 0; b < 16 * (counters - c); ++b) out[16 * c + b] = tail[b];
  }
}

// FP8 RN satfinite of 8 values: clamp to the largest finite value, then round the FP32 mantissa
// (normal range) or scale by the subnormal quantum and round to an integer (cvtps uses RN-even).
template <bool kE4M3>
inline __m256i fp8_codes8(__m256 y) {
  constexpr int kMant = kE4M3 ? 3 : 2, kBias = kE4M3 ? 7 : 15;
  const __m256 a = _mm256_min_ps(abs_ps(y), _mm256_set1_ps(kE4M3 ? 448.0f : 57344.0f));
  const __m256i u = _mm256_castps_si256(a);
  __m256i normal = _mm256_add_epi32(
      u, _mm256_add_epi32(_mm256_set1_epi32((1 << (22 - kMant)) - 1),
                          _mm256_and_si256(_mm256_srli_epi32(u, 23 - kMant), _mm256_set1_epi32(1))));
  normal = _mm256_sub_epi32(_mm256_srli_epi32(normal, 23 - kMant), _mm256_set1_epi32((127 - kBias) << kMant));
  const __m256i subnormal = _mm256_cvtps_epi32(_mm256_mul_ps(a, _mm256_set1_ps(kE4M3 ? 0x1p9f : 0x1p16f)));
  const __m256 is_subnormal = _mm256_cmp_ps(a, _mm256_set1_ps(kE4M3 ? 0x1p-6f : 0x1p-14f), _CMP_LT_OQ);
  __m256i code = _mm256_blendv_epi8(normal, subnormal, _mm256_castps_si256(is_subnormal));
  return _mm256_or_si256(code, _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(y), 24), _mm256_set1_epi32(0x80)));
}

// Low byte of each of 8 32-bit lanes -> 8 consecutive bytes.
inline __m128i narrow_to_bytes(__m256i v) {
  const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  __m256i s = _mm256_shuffle_epi8(v, pick);
  return _mm_unpacklo_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}

template <bool kE4M3>
void fp8_encode_n_t(const float* x, int64_t n, float mult, uint8_t* out) {
  const __m256 m = _mm256_set1_ps(mult);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i),
                     narrow_to_bytes(fp8_codes8<kE4M3>(_mm256_mul_ps(_mm256_loadu_ps(x + i), m))));
  if (i < n) {
    alignas(32) float tail[8] = {};
    alignas(16) uint8_t codes[16];
    for (int64_t k = i; k < n; ++k) tail[k - i] = x[k];
    _mm_storel_epi64(reinterpret_cast<__m128i*>(codes), narrow_to_bytes(fp8_codes8<kE4M3>(_mm256_mul_ps(_mm256_load_ps(tail), m))));
    for (int64_t k = i; k < n; ++k) out[k] = codes[k - i];
  }
}

void fp8_encode_n(const float* x, int64_t n, float mult, bool e4m3, uint8_t* out) {
  if (e4m3) fp8_encode_n_t<true>(x, n, mult, out);
  else fp8_encode_n_t<false>(x, n, mult, out);
}

// 4 packed bytes -> 8 values.
inline __m256 e2m1_decode8(const uint8_t* packed4, __m256 factor) {
  const __m256 magnitudes = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
  int32_t word;
  __builtin_memcpy(&word, packed4, 4);
  __m256i bytes = _mm256_cvtepu8_epi64(_mm_cvtsi32_si128(word));
  // Each 64-bit lane becomes (low nibble, high nibble) as two 32-bit lanes.
  __m256i idx = _mm256_or_si256(_mm256_and_si256(bytes, _mm256_set1_epi64x(0xF)),
                                _mm256_slli_epi64(_mm256_srli_epi64(bytes, 4), 32));
  __m256 v = _mm256_permutevar8x32_ps(magnitudes, idx);  // uses the low 3 bits of each index
  v = _mm256_xor_ps(v, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(idx, _mm256_set1_epi32(8)), 28)));
  return _mm256_mul_ps(v, factor);
}

void e2m1_decode16(const uint8_t* packed8, float factor, float* out16) {
  const __m256 f = _mm256_set1_ps(factor);
  _mm256_storeu_ps(out16, e2m1_decode8(packed8, f));
  _mm256_storeu_ps(out16 + 8, e2m1_decode8(packed8 + 4, f));
}

void decode_bytes16(const uint8_t* codes, const float* value_of_code, float factor, float* out16) {
  const __m256 f = _mm256_set1_ps(factor);
  __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes));
  __m256i idx0 = _mm256_cvtepu8_epi32(bytes), idx1 = _mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8));
  _mm256_storeu_ps(out16, _mm256_mul_ps(_mm256_i32gather_ps(value_of_code, idx0, 4), f));
  _mm256_storeu_ps(out16 + 8, _mm256_mul_ps(_mm256_i32gather_ps(value_of_code, idx1, 4), f));
}

#include "kernels/cpu/common/transpose8x8_avx.inc"
// The NVFP4 1x16 RN hot path: one block at a time. Everything else takes the generic path.
// No direct x^T kernels on this ISA: quantize_transposed takes its strip path.
constexpr void (*kNvfp4TransposedKernel)(const Nvfp4Job&, const float*, int64_t, int64_t, int64_t) = nullptr;
constexpr void (*kRhtAmaxTransposedKernel)(const float*, int64_t, int64_t, int64_t, int64_t, int64_t, uint32_t*,
                                           float*) = nullptr;

// No 16x16-tile hot path on this ISA: nvfp4_tiles runs block by block.
bool nvfp4_tiles_fast(const Nvfp4Job&, int64_t, int64_t) { return false; }

bool nvfp4_blocks_fast(const Nvfp4Job& job, int64_t block_begin, int64_t block_end) {
  if (job.rht || job.stochastic || job.four_over_six) return false;
  for (int64_t i = block_begin; i < block_end; ++i) {
    const float* v = job.x + (i - job.x_first_block) * 16;
    uint8_t s = e4m3_encode_nonnegative(absmax16(v) * job.encode_times_rcp6);
    job.scales[i] = s;
    e2m1_rn16(v, job.enc_of_scale[s], job.codes + i * 8);
  }
  return true;
}

#include "kernels/cpu/quantize/quantize_kernels_impl.inc"

}  // namespace
}  // namespace nibble::cpu::kernels::avx2

namespace nibble::cpu::kernels {
const Kernels& avx2_kernels() { return avx2::kKernels; }
}  // namespace nibble::cpu::kernels
