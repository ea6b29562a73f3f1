// Portable variant of the quantize kernels: plain C++ on whole blocks, for CPUs without AVX2 (and
// as the baseline the SIMD variants are measured against). Compiled with the project's baseline flags.
#pragma GCC optimize("fp-contract=off")  // the reference multiplies and then adds, never fused
#include <bit>
#include <cstdint>

#include "kernels/cpu/quantize/quantize_kernels.h"

namespace nibble::cpu::kernels::scalar {
namespace {

#include "kernels/cpu/quantize/quantize_local_codecs.inc"

uint32_t max_abs_bits(const float* x, int64_t n) {
  uint32_t m0 = 0, m1 = 0, m2 = 0, m3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    uint32_t a0 = std::bit_cast<uint32_t>(x[i]) & 0x7FFFFFFFu, a1 = std::bit_cast<uint32_t>(x[i + 1]) & 0x7FFFFFFFu;
    uint32_t a2 = std::bit_cast<uint32_t>(x[i + 2]) & 0x7FFFFFFFu, a3 = std::bit_cast<uint32_t>(x[i + 3]) & 0x7FFFFFFFu;
    m0 = a0 > m0 ? a0 : m0;
    m1 = a1 > m1 ? a1 : m1;
    m2 = a2 > m2 ? a2 : m2;
    m3 = a3 > m3 ? a3 : m3;
  }
  for (; i < n; ++i) {
    uint32_t a = std::bit_cast<uint32_t>(x[i]) & 0x7FFFFFFFu;
    m0 = a > m0 ? a : m0;
  }
  m0 = m1 > m0 ? m1 : m0;
  m2 = m3 > m2 ? m3 : m2;
  return m2 > m0 ? m2 : m0;
}

float abs_of(float v) { return std::bit_cast<float>(std::bit_cast<uint32_t>(v) & 0x7FFFFFFFu); }

float absmax16(const float* x) {
  float m = 0.0f;
  for (int k = 0; k < 16; ++k) {
    float a = abs_of(x[k]);
    m = a > m ? a : m;
  }
  return m;
}

float absmax16_ignore_nan(const float* x) { return absmax16(x); }  // a > m is false for NaN

// Magnitude index of |y| on the E2M1 grid, RN-even, saturating: the spec's thresholds.
uint32_t e2m1_code_rn(float y) {
  if (y != y) return 7;
  float a = abs_of(y);
  uint32_t mag = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
  return mag | ((std::bit_cast<uint32_t>(y) >> 28) & 8u);
}

// Stochastic rounding with the random byte r8, as the reference: up iff (r8 + 0.5) / 256 < frac.
uint32_t e2m1_code_sr(float y, uint8_t r8) {
  static constexpr float kGrid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const uint32_t sign = (std::bit_cast<uint32_t>(y) >> 28) & 8u;
  float a = abs_of(y);
  if (!(a < 6.0f)) return sign | 7;
  uint32_t lo = (a >= 0.5f) + (a >= 1.0f) + (a >= 1.5f) + (a >= 2.0f) + (a >= 3.0f) + (a >= 4.0f);
  float frac = (a - kGrid[lo]) / (kGrid[lo + 1] - kGrid[lo]);
  return sign | (sr_threshold256(r8) * 0x1.0p-8f < frac ? lo + 1 : lo);
}

void e2m1_rn16(const float* x, float enc, uint8_t* packed8) {
  for (int k = 0; k < 8; ++k)
    packed8[k] = static_cast<uint8_t>(e2m1_code_rn(x[2 * k] * enc) | (e2m1_code_rn(x[2 * k + 1] * enc) << 4));
}

void e2m1_sr16(const float* x, float enc, const uint8_t* r8, uint8_t* packed8) {
  for (int k = 0; k < 8; ++k)
    packed8[k] = static_cast<uint8_t>(e2m1_code_sr(x[2 * k] * enc, r8[2 * k]) |
                                      (e2m1_code_sr(x[2 * k + 1] * enc, r8[2 * k + 1]) << 4));
}

constexpr float kRhtSign[16] = {1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1};

void walsh_hadamard16(float* v) {
  for (int h = 1; h < 16; h <<= 1)
    for (int i = 0; i < 16; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        float a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
}

void rht16_bf16(const float* x, float* out) {
  for (int k = 0; k < 16; ++k) out[k] = x[k] * kRhtSign[k];
  walsh_hadamard16(out);
  for (int k = 0; k < 16; ++k) out[k] = round_to_bf16_scalar(out[k] * 0.25f);
}

void rht16_inverse(float* v) {
  walsh_hadamard16(v);
  for (int k = 0; k < 16; ++k) v[k] *= 0.25f * kRhtSign[k];
}

float wht_absmax(const float* x, int64_t n) {
  float m = 0.0f, v[16];
  for (int64_t i = 0; i < n; i += 16) {
    for (int k = 0; k < 16; ++k) v[k] = x[i + k] * kRhtSign[k];
    walsh_hadamard16(v);
    for (int k = 0; k < 16; ++k) {
      const float a = abs_of(v[k]);
      m = a > m ? a : m;  // false for NaN: ignored
    }
  }
  return m;
}

// Philox4x32-10 on one counter (format/philox.h restated; see the note in the .inc).
void philox_block(uint64_t counter, uint64_t seed, uint32_t out[4]) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = 0xD2511F53ull * c0, p1 = 0xCD9E8D57ull * c2;
    uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0, n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

// Counters first_counter, +1, ... (mod 2^60: positions are mod 2^64), 16 bytes each, every word
// little-endian.
void philox_bytes(uint64_t seed, uint64_t first_counter, int64_t counters, uint8_t* out) {
  uint32_t words[4];
  for (int64_t c = 0; c < counters; ++c) {
    philox_block((first_counter + static_cast<uint64_t>(c)) & ((uint64_t{1} << 60) - 1), seed, words);
    for (int b = 0; b < 16; ++b) out[16 * c + b] = static_cast<uint8_t>(words[b >> 2] >> (8 * (b & 3)));
  }
}

// FP8 RN satfinite (E4M3 or E5M2) by rounding the FP32 mantissa; see fp8_encode_rn_satfinite.
template <bool kE4M3>
uint8_t fp8_code(float y) {
  constexpr int kMant = kE4M3 ? 3 : 2, kBias = kE4M3 ? 7 : 15;
  constexpr float kMax = kE4M3 ? 448.0f : 57344.0f;
  constexpr float kMinNormal = kE4M3 ? 0x1p-6f : 0x1p-14f;
  constexpr float kSubnormalQuanta = kE4M3 ? 0x1p9f : 0x1p16f;  // 1 / (smallest subnormal)
  const uint32_t sign = (std::bit_cast<uint32_t>(y) >> 24) & 0x80u;
  float a = abs_of(y);
  a = a < kMax ? a : kMax;
  uint32_t code;
  if (a < kMinNormal) {
    code = static_cast<uint32_t>(static_cast<int>((a * kSubnormalQuanta + 0x1.8p23f) - 0x1.8p23f));
  } else {
    uint32_t u = std::bit_cast<uint32_t>(a);
    u += (1u << (22 - kMant)) - 1u + ((u >> (23 - kMant)) & 1u);
    code = (u >> (23 - kMant)) - (static_cast<uint32_t>(127 - kBias) << kMant);
  }
  return static_cast<uint8_t>(sign | code);
}

void fp8_encode_n(const float* x, int64_t n, float mult, bool e4m3, uint8_t* out) {
  if (e4m3)
    for (int64_t i = 0; i < n; ++i) out[i] = fp8_code<true>(x[i] * mult);
  else
    for (int64_t i = 0; i < n; ++i) out[i] = fp8_code<false>(x[i] * mult);
}

void e2m1_decode16(const uint8_t* packed8, float factor, float* out16);
void decode_bytes16(const uint8_t* codes, const float* value_of_code, float factor, float* out16) {
  for (int k = 0; k < 16; ++k) out16[k] = value_of_code[codes[k]] * factor;
}

void transpose8x8(const float* src, int64_t src_stride, float* dst, int64_t dst_stride) {
  for (int c = 0; c < 8; ++c)
    for (int r = 0; r < 8; ++r) dst[c * dst_stride + r] = src[r * src_stride + c];
}

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

void e2m1_decode16(const uint8_t* packed8, float factor, float* out16) {
  for (int k = 0; k < 8; ++k) {
    out16[2 * k] = kE2M1Value[packed8[k] & 0xF] * factor;
    out16[2 * k + 1] = kE2M1Value[packed8[k] >> 4] * factor;
  }
}

}  // namespace
}  // namespace nibble::cpu::kernels::scalar

namespace nibble::cpu::kernels {
const Kernels& scalar_kernels() { return scalar::kKernels; }
}  // namespace nibble::cpu::kernels
