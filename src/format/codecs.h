// Scalar codecs for the element and scale formats nibble uses. These are the spec in code
// (docs/nvfp4-spec.md section 1-2); every vectorised path is tested bit for bit against them,
// and they are tested exhaustively against NVIDIA's host conversions in cuda_fp4.h / cuda_fp8.h.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace nibble {

// ---------------------------------------------------------------- E2M1 (FP4) --------------
// Code layout s|e1 e0|m, bias 1. Codes 0..7: +{0, .5, 1, 1.5, 2, 3, 4, 6}; 8..15 negated.
inline constexpr float kE2M1Max = 6.0f;
inline constexpr float kE2M1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
// Doubled magnitudes are small integers: e2m1(code) == kE2M1TimesTwo[code] / 2 exactly.
inline constexpr int8_t kE2M1TimesTwo[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

inline float e2m1_decode(uint8_t code) { return kE2M1Values[code & 0xF]; }

// Magnitude index (0..7) of |a| rounded to nearest even on the E2M1 grid, saturating at 6.
// Thresholds from spec section 2: ties go to the even mantissa (1 at 1.25, 2 at 2.5, 4 at 5).
inline uint8_t e2m1_magnitude_rn(float a) {
  if (!(a > 0.25f)) return 0;  // also catches a == 0.25 (tie to 0) and NaN handled by caller
  if (a < 0.75f) return 1;
  if (a <= 1.25f) return 2;
  if (a < 1.75f) return 3;
  if (a <= 2.5f) return 4;
  if (a < 3.5f) return 5;
  if (a <= 5.0f) return 6;
  return 7;
}

// E2M1 round-to-nearest-even, satfinite. The sign is kept for every input (-0.1 -> code 8).
// NaN maps to +6 (code 7), like the hardware's satfinite conversion; callers reject NaN first.
inline uint8_t e2m1_encode_rn(float x) {
  if (std::isnan(x)) return 7;
  uint8_t sign = std::signbit(x) ? 8 : 0;
  return sign | e2m1_magnitude_rn(std::fabs(x));
}

// Stochastic rounding of |x| onto the E2M1 grid: up iff u < frac, frac = (|x| - lo) / (hi - lo) the
// fractional distance between the two neighbouring grid points lo <= |x| < hi; saturates at 6. With
// u uniform in [0, 1) that rounds up with probability frac. The quantizers pass u = sr_threshold(r)
// of 8 random bits r (format/philox.h), which keeps the bias under 1/512 of a grid step. frac is
// exact in FP32 (|x| - lo is exact by Sterbenz, hi - lo is 0.5, 1 or 2), which lets the fast paths
// compare 256 * frac, computed as (|x| - lo) * (256 / (hi - lo)), with r + 0.5 instead.
inline uint8_t e2m1_encode_sr(float x, float u) {
  uint8_t sign = std::signbit(x) ? 8 : 0;
  float a = std::fabs(x);
  if (!(a < kE2M1Max)) return sign | 7;  // saturate (and NaN -> 6)
  // Find lower grid point lo <= a < hi.
  uint8_t lo = 0;
  while (lo < 7 && kE2M1Values[lo + 1] <= a) ++lo;
  float lo_v = kE2M1Values[lo], hi_v = kE2M1Values[lo + 1];
  float frac = (a - lo_v) / (hi_v - lo_v);
  return sign | static_cast<uint8_t>(u < frac ? lo + 1 : lo);
}

// Two elements per byte: element 2i in the low nibble, 2i+1 in the high nibble.
inline uint8_t pack_e2m1(uint8_t lo, uint8_t hi) { return static_cast<uint8_t>((lo & 0xF) | (hi << 4)); }
inline uint8_t unpack_e2m1_lo(uint8_t b) { return b & 0xF; }
inline uint8_t unpack_e2m1_hi(uint8_t b) { return b >> 4; }

// ---------------------------------------------------------------- FP8 E4M3 / E5M2 ---------
inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE5M2Max = 57344.0f;

// Generic RN-even, satfinite encoder for a small float with `E` exponent and `M` mantissa bits.
// The quantum at |x| is a power of two, so |x| / quantum is exact and rint() does the rounding.
template <int E, int M, bool kE4M3FN>
inline uint8_t fp8_encode_rn_satfinite(float x) {
  constexpr int bias = (1 << (E - 1)) - 1;
  constexpr int min_exp = 1 - bias;  // exponent of the smallest normal
  constexpr float max_v = kE4M3FN ? kE4M3Max : kE5M2Max;
  constexpr uint8_t max_code = kE4M3FN ? 0x7E : 0x7B;
  constexpr uint8_t nan_code = 0x7F;  // E4M3FN: S.1111.111; E5M2: S.11111.11
  if (std::isnan(x)) return nan_code;  // NVIDIA's conversion drops the sign of NaN
  uint8_t sign = std::signbit(x) ? 0x80 : 0;
  float a = std::fabs(x);
  if (a >= max_v) return sign | max_code;  // satfinite (also +-inf)
  int e;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1) -> unbiased exponent e-1
  int exp = e - 1;
  if (a == 0.0f || exp < min_exp) exp = min_exp;
  float quantum = std::ldexp(1.0f, exp - M);
  float r = std::nearbyint(a / quantum) * quantum;  // default FP env rounds to nearest even
  if (r > max_v) return sign | max_code;
  if (r == 0.0f) return sign;
  int re;
  std::frexp(r, &re);
  int rexp = re - 1;
  uint32_t mant, bexp;
  if (rexp < min_exp) {  // subnormal
    bexp = 0;
    mant = static_cast<uint32_t>(r / std::ldexp(1.0f, min_exp - M));
  } else {
    bexp = static_cast<uint32_t>(rexp + bias);
    mant = static_cast<uint32_t>(r / std::ldexp(1.0f, rexp - M)) - (1u << M);
  }
  return static_cast<uint8_t>(sign | (bexp << M) | mant);
}

inline uint8_t e4m3_encode_rn(float x) { return fp8_encode_rn_satfinite<4, 3, true>(x); }
inline uint8_t e5m2_encode_rn(float x) { return fp8_encode_rn_satfinite<5, 2, false>(x); }

inline float e4m3_decode(uint8_t c) {
  uint32_t s = c >> 7, e = (c >> 3) & 0xF, m = c & 7;
  if (e == 0xF && m == 7) return std::numeric_limits<float>::quiet_NaN();
  float v = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(static_cast<float>(8 + m), static_cast<int>(e) - 10);
  return s ? -v : v;
}

inline float e5m2_decode(uint8_t c) {
  uint32_t s = c >> 7, e = (c >> 2) & 0x1F, m = c & 3;
  float v;
  if (e == 0x1F) v = m ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else if (e == 0) v = std::ldexp(static_cast<float>(m), -16);
  else v = std::ldexp(static_cast<float>(4 + m), static_cast<int>(e) - 17);
  return s ? -v : v;
}

// ---------------------------------------------------------------- E8M0 ---------------------
// A power of two 2^(b-127); 0xFF is NaN.
inline float e8m0_decode(uint8_t b) {
  if (b == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  if (b == 0) return std::bit_cast<float>(0x00400000u);  // 2^-127 is subnormal in FP32
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 23);
}

// Smallest power of two >= v (round towards +inf), as Transformer Engine computes MX scales so
// that no element of the block saturates. v >= 0.
inline uint8_t e8m0_encode_ceil(float v) {
  if (std::isnan(v)) return 0xFF;
  if (std::isinf(v)) return 0xFE;
  if (v == 0.0f) return 0;
  uint32_t u = std::bit_cast<uint32_t>(v);
  uint32_t exponent = (u >> 23) & 0xFF;
  uint32_t mantissa = u & 0x7FFFFF;
  // Subnormals up to 2^-127 already round to exponent 0 (2^-127); above it, ceil bumps the exponent.
  if (mantissa > 0 && exponent != 0xFE && !(exponent == 0 && mantissa <= 0x400000)) ++exponent;
  return static_cast<uint8_t>(exponent);
}

// 1 / e8m0_decode(b): also an exact power of two (2^(127-b)); finite for every b < 0xFF.
inline float e8m0_decode_reciprocal(uint8_t b) { return std::ldexp(1.0f, 127 - static_cast<int>(b)); }

// ---------------------------------------------------------------- BF16 ---------------------
struct bf16 {
  uint16_t bits;
};

// Round to nearest even; NaN keeps its sign and becomes quiet. Written without a branch so that
// loops over it (GEMM packing, attention operands) vectorise.
inline bf16 bf16_from_float_rn(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t nearest = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  return {static_cast<uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : nearest)};
}
inline float bf16_to_float(bf16 b) { return std::bit_cast<float>(static_cast<uint32_t>(b.bits) << 16); }
inline float round_to_bf16(float x) { return bf16_to_float(bf16_from_float_rn(x)); }

}  // namespace nibble
