// The NVFP4/MX/FP8 quantize chain as __host__ __device__ functions: a port of the scalar
// reference (format/codecs.h, format/quantize_ref.cpp, format/hadamard.cpp, format/philox.h) that
// nvcc and g++ both compile. The device kernels call these; test_cuda_host.cpp runs the very same
// functions on the CPU against the reference, so the port itself is checked without a GPU and only
// the compiler's floating-point semantics remain for the GPU tests.
//
// Bit-identity rules: every FP32 operation is written through nb_mul/nb_div/nb_add/nb_sub, which
// are the IEEE round-to-nearest intrinsics on the device (nvcc contracts a*b+c into an FMA by
// default, which would change results) and plain operators on the host (g++ in ISO C++ mode does not
// contract). Codecs use integer bit manipulation instead of frexp/ldexp so they need no libm.
#pragma once
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define NIBBLE_HD __host__ __device__ __forceinline__
#else
#define NIBBLE_HD inline
#endif
// Full unrolling of fixed 16-element loops in device code (the host compilers do not know the pragma);
// NIBBLE_UNROLL_BY(n): a runtime-bounded loop unrolled n times (independent loads issued together).
#if defined(__CUDA_ARCH__)
#define NIBBLE_UNROLL _Pragma("unroll")
#define NIBBLE_PRAGMA(x) _Pragma(#x)
#define NIBBLE_UNROLL_BY(n) NIBBLE_PRAGMA(unroll n)
#else
#define NIBBLE_UNROLL
#define NIBBLE_UNROLL_BY(n)
#endif

namespace nibble::cuda::dm {

// ------------------------------------------------------------------ exact FP32 arithmetic --------
NIBBLE_HD float nb_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
NIBBLE_HD float nb_div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
NIBBLE_HD float nb_add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
NIBBLE_HD float nb_sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
NIBBLE_HD float nb_sqrt(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}
NIBBLE_HD double nb_add_d(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
NIBBLE_HD double nb_mul_d(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
NIBBLE_HD float nb_fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
NIBBLE_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}
NIBBLE_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}
NIBBLE_HD float abs_f(float x) { return bits_float(float_bits(x) & 0x7FFFFFFFu); }
NIBBLE_HD bool is_nan_f(float x) { return (float_bits(x) & 0x7FFFFFFFu) > 0x7F800000u; }
// std::max(m, v) / std::min(v, FLT_MAX) exactly as the reference writes them (no NaN reaches these).
NIBBLE_HD float max_f(float a, float b) { return a < b ? b : a; }
NIBBLE_HD float min_f(float a, float b) { return b < a ? b : a; }
// Round an FP32 holding an exact small integer multiple to the nearest integer, ties to even. Used
// where the reference calls nearbyint() on a value whose fraction is an exact binary fraction.
NIBBLE_HD uint32_t rint_to_u32(float a) {
#if defined(__CUDA_ARCH__)
  return __float2uint_rn(a);
#else
  // a < 2^22 here: adding 1.5*2^23 forces rounding at the units place, ties to even.
  float shifted = a + 12582912.0f;
  return float_bits(shifted) - 0x4B400000u;
#endif
}

// ------------------------------------------------------------------ E2M1 ---------------------------
NIBBLE_HD float e2m1_value(uint8_t code) {
  // Doubled magnitudes {0,1,2,3,4,6,8,12}: decode without a table so device code needs no constant memory.
  const uint32_t m = code & 7u;
  const uint32_t twice = m < 5u ? m : (m == 5u ? 6u : (m == 6u ? 8u : 12u));
  const float v = static_cast<float>(twice) * 0.5f;
  return (code & 8u) ? -v : v;
}
// The code's magnitude is the number of midpoints a is past (ties to even: past 0.25, 1.25, 2.5 and
// 5 strictly, at or past 0.75, 1.75 and 3.5). The midpoints increase, so the comparisons add up
// without branches; a NaN passes none (code 0, as the reference's first test).
NIBBLE_HD uint8_t e2m1_magnitude_rn(float a) {
  return static_cast<uint8_t>((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) +
                              (a > 5.0f));
}
NIBBLE_HD uint8_t e2m1_encode_rn(float x) {
  if (is_nan_f(x)) return 7;
  const uint8_t sign = (float_bits(x) >> 31) ? 8 : 0;
  return sign | e2m1_magnitude_rn(abs_f(x));
}
// Stochastic rounding: up iff u < frac (the fractional distance); the kernels pass u = sr_threshold(r).
NIBBLE_HD uint8_t e2m1_encode_sr(float x, float u) {
  const uint8_t sign = (float_bits(x) >> 31) ? 8 : 0;
  const float a = abs_f(x);
  if (!(a < 6.0f)) return sign | 7;
  // lo: the largest code whose value is <= a, i.e. how many of 0.5, 1, 1.5, 2, 3, 4 a reaches (they
  // increase). The gap to the next value is 0.5, 1 or 2, a power of two, so the reference's division
  // by it is the multiplication by its exact reciprocal, rounded the same.
  const uint8_t lo = static_cast<uint8_t>((a >= 0.5f) + (a >= 1.0f) + (a >= 1.5f) + (a >= 2.0f) + (a >= 3.0f) +
                                          (a >= 4.0f));
  const float inverse_gap = lo < 4 ? 2.0f : (lo < 6 ? 1.0f : 0.5f);
  const float frac = nb_mul(nb_sub(a, e2m1_value(lo)), inverse_gap);
  return sign | static_cast<uint8_t>(u < frac ? lo + 1 : lo);
}

// ------------------------------------------------------------------ FP8 -----------------------------
// RN-even, satfinite, for E4M3FN (kExp 4, kMant 3, max 448 = 0x7E) and E5M2 (5, 2, max 57344 = 0x7B).
// Normal range: round the FP32 mantissa to kMant bits on the bit pattern (carry into the exponent is
// the correct binade change); subnormal range: the value times 2^(subnormal quantum) is an exact
// binary fraction whose nearest integer is the code (its top value is the smallest normal's code).
template <int kExp, int kMant>
NIBBLE_HD uint8_t fp8_encode_rn_satfinite(float x) {
  constexpr int kBias = (1 << (kExp - 1)) - 1;
  constexpr bool kE4M3 = kExp == 4;
  constexpr uint32_t kMaxBits = kE4M3 ? 0x43E00000u /*448*/ : 0x47600000u /*57344*/;
  constexpr uint8_t kMaxCode = kE4M3 ? 0x7E : 0x7B;
  constexpr uint32_t kMinNormalExpField = 127 + 1 - kBias;       // FP32 exponent field of 2^(1-bias)
  constexpr float kSubnormalScale = kE4M3 ? 512.0f : 65536.0f;   // 1 / 2^(1-bias-kMant)
  const uint32_t u = float_bits(x);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7F;  // NaN (sign dropped, as NVIDIA's conversion does)
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  if (a >= kMaxBits) return sign | kMaxCode;
  if ((a >> 23) < kMinNormalExpField) {
    return sign | static_cast<uint8_t>(rint_to_u32(nb_mul(bits_float(a), kSubnormalScale)));
  }
  constexpr int kDrop = 23 - kMant;
  const uint32_t rounded = (a + ((1u << (kDrop - 1)) - 1u) + ((a >> kDrop) & 1u)) >> kDrop;
  const uint32_t code = rounded - (static_cast<uint32_t>(127 - kBias) << kMant);
  return sign | static_cast<uint8_t>(code > kMaxCode ? kMaxCode : code);
}
NIBBLE_HD uint8_t e4m3_encode_rn(float x) { return fp8_encode_rn_satfinite<4, 3>(x); }
NIBBLE_HD uint8_t e5m2_encode_rn(float x) { return fp8_encode_rn_satfinite<5, 2>(x); }

NIBBLE_HD float e4m3_decode(uint8_t c) {
  const uint32_t e = (c >> 3) & 0xFu, m = c & 7u;
  if (e == 0xF && m == 7) return bits_float(0x7FC00000u);
  const float v = e == 0 ? static_cast<float>(m) * 0x1.0p-9f : bits_float(((e + 120u) << 23) | (m << 20));
  return (c & 0x80u) ? -v : v;
}
NIBBLE_HD float e5m2_decode(uint8_t c) {
  const uint32_t e = (c >> 2) & 0x1Fu, m = c & 3u;
  float v;
  if (e == 0x1F) v = m ? bits_float(0x7FC00000u) : bits_float(0x7F800000u);
  else if (e == 0) v = static_cast<float>(m) * 0x1.0p-16f;
  else v = bits_float(((e + 112u) << 23) | (m << 21));
  return (c & 0x80u) ? -v : v;
}

// ------------------------------------------------------------------ E8M0 ----------------------------
NIBBLE_HD float e8m0_decode(uint8_t b) {
  if (b == 0xFF) return bits_float(0x7FC00000u);
  if (b == 0) return bits_float(0x00400000u);
  return bits_float(static_cast<uint32_t>(b) << 23);
}
NIBBLE_HD uint8_t e8m0_encode_ceil(float v) {
  if (is_nan_f(v)) return 0xFF;
  const uint32_t u = float_bits(v);
  if ((u & 0x7FFFFFFFu) == 0x7F800000u) return 0xFE;
  if (v == 0.0f) return 0;
  uint32_t exponent = (u >> 23) & 0xFFu;
  const uint32_t mantissa = u & 0x7FFFFFu;
  if (mantissa > 0 && exponent != 0xFE && !(exponent == 0 && mantissa <= 0x400000u)) ++exponent;
  return static_cast<uint8_t>(exponent);
}
// 2^(127-b) exactly (subnormal FP32 for b = 254).
NIBBLE_HD float e8m0_decode_reciprocal(uint8_t b) {
  const int e = 127 - static_cast<int>(b);
  if (e >= -126) return bits_float(static_cast<uint32_t>(e + 127) << 23);
  return bits_float(1u << (22 - (-127 - e)));
}

// ------------------------------------------------------------------ BF16 ----------------------------
NIBBLE_HD uint16_t bf16_bits_rn(float x) {
  const uint32_t u = float_bits(x);
  if (is_nan_f(x)) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
NIBBLE_HD float bf16_bits_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }
NIBBLE_HD float round_to_bf16(float x) { return bf16_bits_to_float(bf16_bits_rn(x)); }

// ------------------------------------------------------------------ Philox4x32-10 -------------------
struct Philox4 {
  uint32_t v[4];
};
NIBBLE_HD uint32_t mulhi_u32(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}
NIBBLE_HD Philox4 philox4x32_10(uint64_t block, uint64_t seed) {
  uint32_t c0 = static_cast<uint32_t>(block), c1 = static_cast<uint32_t>(block >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = mulhi_u32(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = mulhi_u32(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}
// A uniform in [0, 1) from 24 bits of a word (benchmark data; stochastic rounding uses sr_threshold).
NIBBLE_HD float philox_word_to_uniform(uint32_t w) { return static_cast<float>(w >> 8) * 0x1.0p-24f; }

// Stochastic rounding's random bits, as format/philox.h defines them: stream position p takes byte
// p & 15 of the Philox output for counter p >> 4 (words in order, each little-endian). Byte b of an
// output, by selects rather than an indexed load, so device code keeps the words in registers.
NIBBLE_HD uint8_t philox_output_byte(const Philox4& w, uint32_t b) {
  const uint32_t word = (b & 8u) ? ((b & 4u) ? w.v[3] : w.v[2]) : ((b & 4u) ? w.v[1] : w.v[0]);
  return static_cast<uint8_t>(word >> (8u * (b & 3u)));
}
// The SR threshold of a random byte, (r + 0.5) / 256: exact, as sr_threshold in format/philox.h.
NIBBLE_HD float sr_threshold(uint8_t r) { return nb_mul(nb_add(static_cast<float>(r), 0.5f), 0x1.0p-8f); }

// Random bytes of consecutive stream positions; one Philox call serves 16 positions.
struct PhiloxStream {
  uint64_t seed;
  uint64_t cached_counter = ~0ull;  // counters are < 2^60: never a real one
  Philox4 words{};
  NIBBLE_HD explicit PhiloxStream(uint64_t s) : seed(s) {}
  NIBBLE_HD uint8_t byte(uint64_t position) {
    const uint64_t counter = position >> 4;
    if (counter != cached_counter) {
      words = philox4x32_10(counter, seed);
      cached_counter = counter;
    }
    return philox_output_byte(words, static_cast<uint32_t>(position & 15));
  }
};

// The 16 random bytes of positions first .. first + 15 (mod 2^64): the tail of one Philox output and,
// unless first is a multiple of 16, the head of the next.
NIBBLE_HD void sr_bytes16(uint64_t seed, uint64_t first, uint8_t* out16) {
  const uint32_t skip = static_cast<uint32_t>(first & 15);
  const Philox4 a = philox4x32_10(first >> 4, seed);
  const Philox4 b = skip != 0 ? philox4x32_10((first + 16) >> 4, seed) : a;
  NIBBLE_UNROLL
  for (uint32_t k = 0; k < 16; ++k) {
    const uint32_t p = skip + k;
    out16[k] = p < 16 ? philox_output_byte(a, p) : philox_output_byte(b, p - 16);
  }
}

// ------------------------------------------------------------------ RHT (16-point) ------------------
NIBBLE_HD float rht_sign(int i) {
  // TE's sign vector [1,1,1,-1,1,-1,-1,-1,-1,-1,-1,1,-1,1,-1,-1] as a bit mask (bit i set = -1).
  return ((0xD7E8u >> i) & 1u) ? -1.0f : 1.0f;
}
NIBBLE_HD void walsh_hadamard16(float* v) {
  for (int h = 1; h < 16; h <<= 1)
    for (int i = 0; i < 16; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        const float a = v[j], b = v[j + h];
        v[j] = nb_add(a, b);
        v[j + h] = nb_sub(a, b);
      }
}
NIBBLE_HD void rht16_forward(float* v) {
  for (int i = 0; i < 16; ++i) v[i] = nb_mul(v[i], rht_sign(i));
  walsh_hadamard16(v);
  for (int i = 0; i < 16; ++i) v[i] = nb_mul(v[i], 0.25f);
}
NIBBLE_HD void rht16_inverse(float* v) {
  walsh_hadamard16(v);
  for (int i = 0; i < 16; ++i) v[i] = nb_mul(v[i], nb_mul(0.25f, rht_sign(i)));
}
// What the reference's rht_rows(..., round_bf16 = true) does to one block.
NIBBLE_HD void rht16_forward_bf16(float* v) {
  rht16_forward(v);
  for (int i = 0; i < 16; ++i) v[i] = round_to_bf16(v[i]);
}

// ------------------------------------------------------------------ NVFP4 chain ---------------------
struct GlobalScale {
  float encode;     // S_enc
  float decode;     // S_dec = 1 / S_enc
  float amax;       // the tensor amax (the Four Over Six error uses it, as TE does)
  float numerator;  // 6 * the E4M3 ceiling: 2688, or 1536 with Four Over Six and e4m3_max 256
};
// nibble::nvfp4_global_numerator (quantized_tensor.h): 6 * 448, or 6 * e4m3_max with Four Over Six.
NIBBLE_HD float nvfp4_global_numerator(bool four_over_six, int four_over_six_e4m3_max) {
  return four_over_six ? nb_mul(6.0f, static_cast<float>(four_over_six_e4m3_max)) : 2688.0f;
}
NIBBLE_HD GlobalScale nvfp4_global_scale(float amax, float numerator) {
  float enc = min_f(nb_div(numerator, amax), FLT_MAX);
  if (amax == 0.0f || enc == 0.0f) enc = 1.0f;
  return {enc, nb_div(1.0f, enc), amax, numerator};
}

// Element encoders: map the 16 scaled values x*enc of a block to E2M1 codes (one per element).
// The reference's RN and its Philox SR are here; Blackwell adds hardware-conversion encoders in
// nvfp4_kernels.cuh. Four Over Six calls the encoder twice on the same block, so an SR encoder must
// draw the same random bytes both times, as the reference does (it indexes the stream by element).
struct ReferenceRn {
  NIBBLE_HD void operator()(const float* scaled, uint8_t* codes) const {
    for (int k = 0; k < 16; ++k) codes[k] = e2m1_encode_rn(scaled[k]);
  }
};
struct ReferenceSr {
  uint64_t seed;
  uint64_t first_index;  // stream position of element 0 of the block
  NIBBLE_HD void operator()(const float* scaled, uint8_t* codes) const {
    uint8_t r[16];
    sr_bytes16(seed, first_index, r);
    NIBBLE_UNROLL
    for (int k = 0; k < 16; ++k) codes[k] = e2m1_encode_sr(scaled[k], sr_threshold(r[k]));
  }
};

// Steps 4-5 of the chain for scale byte s: codes of x * min(1 / (e4m3(s) * S_dec), FLT_MAX).
template <class Encoder>
NIBBLE_HD void nvfp4_encode_with_scale(const float* x, uint8_t s, GlobalScale g, const Encoder& encode,
                                       uint8_t* codes) {
  const float enc = min_f(nb_div(1.0f, nb_mul(e4m3_decode(s), g.decode)), FLT_MAX);
  float scaled[16];
  for (int k = 0; k < 16; ++k) scaled[k] = nb_mul(x[k], enc);
  encode(scaled, codes);
}

// Four Over Six (spec section 4; ref::four_over_six_*, TE's rule): off, or on with its error measure.
enum class FourOverSix : uint8_t { off, mae, mse };

// The reference's scale bytes of both candidates, in TE's order: base = (b / 6) * S_enc,
// map4 = base * 1.5, each clamped to 448 and cast to E4M3.
struct FourOverSixScales {
  uint8_t map6, map4;
};
NIBBLE_HD FourOverSixScales four_over_six_scales(float block_amax, GlobalScale g) {
  const float base = nb_mul(nb_div(block_amax, 6.0f), g.encode);
  const float map4 = nb_mul(base, 1.5f);
  return {e4m3_encode_rn(min_f(base, 448.0f)), e4m3_encode_rn(min_f(map4, 448.0f))};
}
// The error of a candidate in the original domain: sum in index order of |d_k| (MAE) or d_k^2
// (MSE), d_k = ((e2m1(code_k) * e4m3(s)) * amax) / numerator - x_k.
NIBBLE_HD float four_over_six_error(const float* x, uint8_t s, const uint8_t* codes, GlobalScale g, FourOverSix mode) {
  const float sf = e4m3_decode(s);
  float err = 0.0f;
  for (int k = 0; k < 16; ++k) {
    float val = nb_mul(e2m1_value(codes[k]), sf);
    val = nb_mul(val, g.amax);
    val = nb_div(val, g.numerator);
    const float diff = nb_sub(val, x[k]);
    err = mode == FourOverSix::mse ? nb_add(err, nb_mul(diff, diff)) : nb_add(err, abs_f(diff));
  }
  return err;
}
// Both candidates of one row of 16 values, codes unpacked (one per element).
struct FourOverSixRow {
  FourOverSixScales scales;
  float error6, error4;
  uint8_t codes6[16], codes4[16];
};
template <class Encoder>
NIBBLE_HD void four_over_six_row(const float* x, float block_amax, GlobalScale g, FourOverSix mode,
                                 const Encoder& encode, FourOverSixRow& out) {
  out.scales = four_over_six_scales(block_amax, g);
  nvfp4_encode_with_scale(x, out.scales.map6, g, encode, out.codes6);
  nvfp4_encode_with_scale(x, out.scales.map4, g, encode, out.codes4);
  out.error6 = four_over_six_error(x, out.scales.map6, out.codes6, g, mode);
  out.error4 = four_over_six_error(x, out.scales.map4, out.codes4, g, mode);
}
// A 16x16 tile's error from its 16 row errors in TE's tree order (rows past the end count 0):
// a_i = r_i + r_{i+8}, b_i = a_i + a_{i+4}, c_i = b_i + b_{i+2}, c_0 + c_1. The kernel gets the same
// sum, bitwise, from an xor butterfly over the tile's 16 lanes (offsets 8, 4, 2, 1): lane i adds
// lane i^h's partial, and FP32 addition is commutative, so every lane holds this tree's value.
NIBBLE_HD float four_over_six_tile_error(const float* r) {
  float a[8], b[4];
  for (int i = 0; i < 8; ++i) a[i] = nb_add(r[i], r[i + 8]);
  for (int i = 0; i < 4; ++i) b[i] = nb_add(a[i], a[i + 4]);
  return nb_add(nb_add(b[0], b[2]), nb_add(b[1], b[3]));
}
// TE's choice: map to 4 only when it errs strictly less (ties and NaN keep 6).
NIBBLE_HD bool four_over_six_picks_map4(float error4, float error6) { return error4 < error6; }

// One 1x16 block of 16 values (already transformed when RHT is on): the reference's
// nvfp4_quantize_block (block max to 6, spec section 3), or with Four Over Six the per-block
// choice of ref::four_over_six_candidates. Codes unpacked, one per element; returns the scale byte.
// (16x16 tiles with Four Over Six choose per tile: four_over_six_row + four_over_six_tile_error.)
template <class Encoder>
NIBBLE_HD uint8_t nvfp4_quantize_block16(const float* x, float block_amax, GlobalScale g, FourOverSix four_over_six,
                                         const Encoder& encode, uint8_t* codes) {
  if (four_over_six == FourOverSix::off) {
    const uint8_t s = e4m3_encode_rn(nb_mul(block_amax, nb_mul(g.encode, 1.0f / 6.0f)));
    nvfp4_encode_with_scale(x, s, g, encode, codes);
    return s;
  }
  FourOverSixRow c;
  four_over_six_row(x, block_amax, g, four_over_six, encode, c);
  const bool map4 = four_over_six_picks_map4(c.error4, c.error6);
  for (int k = 0; k < 16; ++k) codes[k] = map4 ? c.codes4[k] : c.codes6[k];
  return map4 ? c.scales.map4 : c.scales.map6;
}
NIBBLE_HD float block_amax16(const float* x) {
  float m = 0.0f;
  for (int k = 0; k < 16; ++k) m = max_f(m, abs_f(x[k]));
  return m;
}
// FP8 per-tensor scale (TE current scaling, margin 0): returns the encode scale.
NIBBLE_HD float fp8_tensor_scale(float amax, bool e4m3) {
  float scale = nb_div(e4m3 ? 448.0f : 57344.0f, amax);
  if (amax == 0.0f || !(scale > 0.0f)) scale = 1.0f;
  return min_f(scale, FLT_MAX);
}

// ------------------------------------------------------------------ 128x4 scale swizzle -------------
// cuBLASLt's VEC16_UE4M3 / VEC32_UE8M0 scale layout (spec section 7): scale (r, c) of a tensor with
// `scale_cols` scale columns lives at this byte offset; the buffer is padded to rows % 128 and
// scale_cols % 4 with zeros.
NIBBLE_HD int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }
NIBBLE_HD int64_t swizzled_scale_offset(int64_t r, int64_t c, int64_t scale_cols) {
  const int64_t col_tiles = (scale_cols + 3) / 4;
  return ((r / 128 * col_tiles + c / 4) * 32 + r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4;
}
NIBBLE_HD int64_t swizzled_scale_bytes(int64_t rows, int64_t scale_cols) {
  return round_up(rows, 128) * round_up(scale_cols, 4);
}
// The inverse: which (row, col) a byte offset of the swizzled buffer holds (may lie in the padding).
struct ScaleIndex {
  int64_t row, col;
};
NIBBLE_HD ScaleIndex swizzled_scale_position(int64_t offset, int64_t scale_cols) {
  const int64_t col_tiles = (scale_cols + 3) / 4;
  const int64_t tile = offset / 512, in_tile = offset % 512;
  const int64_t row_in_32 = in_tile / 16, quad = (in_tile % 16) / 4, col_in_4 = in_tile % 4;
  return {(tile / col_tiles) * 128 + quad * 32 + row_in_32, (tile % col_tiles) * 4 + col_in_4};
}

}  // namespace nibble::cuda::dm
