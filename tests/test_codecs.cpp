// Codecs against NVIDIA's host conversions (cuda_fp4.h / cuda_fp8.h): every code, and a dense sweep
// of FP32 inputs including ties, subnormals, signed zeros and huge values.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <random>
#include <vector>

#include "format/codecs.h"
#include "format/philox.h"

#ifdef NIBBLE_HAVE_CUDA_HEADERS
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#endif

using namespace nibble;

namespace {
// Inputs: every float whose top 16 bits are any value (all exponents, signs, NaN/Inf, subnormals)
// with a few low-bit patterns, plus exact ties and neighbours of every grid value.
std::vector<float> sweep_inputs() {
  std::vector<float> v;
  for (uint32_t hi = 0; hi < 0x10000; ++hi)
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) v.push_back(std::bit_cast<float>(hi << 16 | lo));
  auto add_neighbours = [&](float g) {
    for (float s : {1.0f, -1.0f}) {
      float x = s * g;
      v.push_back(x);
      v.push_back(std::nextafter(x, 0.0f));
      v.push_back(std::nextafter(x, 1e30f * s));
    }
  };
  for (int c = 0; c < 8; ++c) {
    add_neighbours(kE2M1Values[c]);
    if (c < 7) add_neighbours(0.5f * (kE2M1Values[c] + kE2M1Values[c + 1]));
  }
  for (int c = 0; c < 0x7F; ++c) {
    float g = e4m3_decode(static_cast<uint8_t>(c)), n = e4m3_decode(static_cast<uint8_t>(c + 1));
    add_neighbours(g);
    if (c + 1 < 0x7F) add_neighbours(0.5f * (g + n));
  }
  for (float x : {464.0f, 463.99f, 480.0f, 57344.0f, 61440.0f, 1e30f, 3e38f}) add_neighbours(x);
  return v;
}
}  // namespace

TEST(E2M1, DecodeTableMatchesSpec) {
  const float want[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) {
    float w = (c & 8) ? -want[c & 7] : want[c & 7];
    EXPECT_EQ(std::bit_cast<uint32_t>(e2m1_decode(static_cast<uint8_t>(c))), std::bit_cast<uint32_t>(w)) << c;
    EXPECT_EQ(kE2M1TimesTwo[c], static_cast<int>(2 * w)) << c;
  }
}

TEST(E2M1, SpecThresholds) {
  EXPECT_EQ(e2m1_encode_rn(0.25f), 0);
  EXPECT_EQ(e2m1_encode_rn(0.2500001f), 1);
  EXPECT_EQ(e2m1_encode_rn(0.75f), 2);
  EXPECT_EQ(e2m1_encode_rn(1.25f), 2);
  EXPECT_EQ(e2m1_encode_rn(1.75f), 4);
  EXPECT_EQ(e2m1_encode_rn(2.5f), 4);
  EXPECT_EQ(e2m1_encode_rn(3.5f), 6);
  EXPECT_EQ(e2m1_encode_rn(5.0f), 6);
  EXPECT_EQ(e2m1_encode_rn(5.0001f), 7);
  EXPECT_EQ(e2m1_encode_rn(1e30f), 7);
  EXPECT_EQ(e2m1_encode_rn(-0.1f), 8);
  EXPECT_EQ(e2m1_encode_rn(-0.0f), 8);
}

TEST(E2M1, PackLowNibbleFirst) {
  uint8_t b = pack_e2m1(0x3, 0xC);
  EXPECT_EQ(b, 0xC3);
  EXPECT_EQ(unpack_e2m1_lo(b), 0x3);
  EXPECT_EQ(unpack_e2m1_hi(b), 0xC);
}

TEST(E2M1, StochasticRoundingIsBracketedAndUnbiased) {
  for (float a : {0.1f, 0.3f, 0.9f, 1.6f, 2.2f, 3.3f, 4.5f, 5.9f}) {
    double sum = 0;
    const int n = 200000;
    for (int i = 0; i < n; ++i)
      sum += e2m1_decode(e2m1_encode_sr(a, sr_threshold(philox_byte(7, static_cast<uint64_t>(i)))));
    // Each draw is one of two grid points at most 2 apart: std <= 1, so 6 sigma of the mean is 6/sqrt(n).
    EXPECT_NEAR(sum / n, a, 6.0 / std::sqrt(static_cast<double>(n))) << a;
  }
  EXPECT_EQ(e2m1_encode_sr(7.0f, 0.0f), 7);
  EXPECT_EQ(e2m1_encode_sr(-7.0f, 0.9f), 15);
  EXPECT_EQ(e2m1_encode_sr(2.0f, 0.999f), 4);  // on the grid: never moves
}

TEST(E2M1, StochasticRoundingWithEightRandomBitsIsUnbiasedTo1Over512) {
  // Exhaustive over the 256 values of the random byte: the mean of the SR result is within 1/512
  // of a grid step of the input, everywhere on a dense sweep of every grid interval (both signs)
  // and at random points. The threshold (r + 0.5) / 256 is what makes it 1/512: r / 256 would
  // round up too often by up to 1/256 of a step, which this bound catches (checked below).
  auto mean_over_bytes = [](float x, bool midpoint) {
    double sum = 0;
    for (int r = 0; r < 256; ++r) {
      const float u = midpoint ? sr_threshold(static_cast<uint8_t>(r)) : static_cast<float>(r) / 256.0f;
      sum += e2m1_decode(e2m1_encode_sr(x, u));
    }
    return sum / 256;
  };
  static constexpr float kGrid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  std::mt19937 rng(3);
  double worst = 0, worst_plain = 0;
  for (int g = 0; g < 7; ++g) {
    const float lo = kGrid[g], gap = kGrid[g + 1] - kGrid[g];
    std::vector<float> points;
    for (int s = 0; s < 2048; ++s) points.push_back(lo + gap * static_cast<float>(s) / 2048.0f);  // exact
    std::uniform_real_distribution<float> in(lo, kGrid[g + 1]);
    for (int s = 0; s < 2000; ++s) points.push_back(in(rng));
    for (float a : points)
      for (float x : {a, -a}) {
        const double bias = std::fabs(mean_over_bytes(x, true) - x) / gap;
        ASSERT_LE(bias, 1.0 / 512 + 1e-9) << x;
        worst = std::max(worst, bias);
        worst_plain = std::max(worst_plain, std::fabs(mean_over_bytes(x, false) - x) / gap);
      }
  }
  EXPECT_GT(worst, 1.0 / 600);       // the bound is tight, not loose
  EXPECT_GT(worst_plain, 1.0 / 300);  // and would reject the r / 256 threshold
  for (float x : {6.0f, 7.5f, 1e30f}) EXPECT_EQ(mean_over_bytes(x, true), 6.0) << x;  // saturates
}

TEST(Philox, StochasticRoundingBytes) {
  // Position p takes byte p % 16 of the output for counter p / 16, words in order, little-endian.
  const uint64_t seed = 0xFEDCBA9876543210ull;
  for (uint64_t counter : {0ull, 1ull, 0xFFFFFFFFull, 0x0FFFFFFFFFFFFFFFull}) {
    const auto w = philox4x32_10({static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0u, 0u},
                                 {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
    for (uint64_t b = 0; b < 16; ++b)
      EXPECT_EQ(philox_byte(seed, counter * 16 + b), static_cast<uint8_t>(w[b / 4] >> (8 * (b % 4)))) << counter << " " << b;
  }
  EXPECT_EQ(sr_threshold(0), 0.5f / 256);
  EXPECT_EQ(sr_threshold(255), 255.5f / 256);
}

TEST(BF16, RoundNearestEven) {
  EXPECT_EQ(bf16_from_float_rn(1.0f).bits, 0x3F80);
  EXPECT_EQ(bf16_from_float_rn(std::bit_cast<float>(0x3F808000u)).bits, 0x3F80);  // tie to even
  EXPECT_EQ(bf16_from_float_rn(std::bit_cast<float>(0x3F818000u)).bits, 0x3F82);  // tie to even (up)
  EXPECT_EQ(bf16_from_float_rn(std::bit_cast<float>(0x3F808001u)).bits, 0x3F81);
  EXPECT_TRUE(std::isnan(bf16_to_float(bf16_from_float_rn(std::nanf("")))));
  EXPECT_EQ(bf16_from_float_rn(3.4e38f).bits, 0x7F80);  // overflows to inf under RN, like __float2bfloat16
}

TEST(BF16, EveryFloatRoundsAsTheDefinitionSays) {
  // bf16_from_float_rn is written without a branch (so loops over it vectorise); every one of the
  // 2^32 inputs against the definition spelled out: NaN keeps its sign and top mantissa bits and
  // turns quiet, everything else rounds to nearest, ties to even (Inf stays Inf, overflow to Inf).
  uint64_t mismatches = 0;
  uint32_t first_bad = 0;
  for (uint64_t i = 0; i <= 0xFFFFFFFFull; ++i) {
    const uint32_t u = static_cast<uint32_t>(i);
    const float x = std::bit_cast<float>(u);
    uint16_t want;
    if (std::isnan(x)) {
      want = static_cast<uint16_t>((u >> 16) | 0x40);
    } else {
      const uint32_t lower = u & 0xFFFF, upper = u >> 16;
      want = static_cast<uint16_t>(lower > 0x8000 || (lower == 0x8000 && (upper & 1)) ? upper + 1 : upper);
    }
    if (bf16_from_float_rn(x).bits != want && mismatches++ == 0) first_bad = u;
  }
  EXPECT_EQ(mismatches, 0u) << "first at bits 0x" << std::hex << first_bad;
}

TEST(E8M0, CeilPowerOfTwo) {
  EXPECT_EQ(e8m0_encode_ceil(1.0f), 127);
  EXPECT_EQ(e8m0_encode_ceil(1.5f), 128);
  EXPECT_EQ(e8m0_encode_ceil(0.0f), 0);
  EXPECT_EQ(e8m0_decode(127), 1.0f);
  EXPECT_EQ(e8m0_decode(0), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan(e8m0_decode(0xFF)));
  for (int b = 0; b < 255; ++b) {
    EXPECT_EQ(e8m0_decode(static_cast<uint8_t>(b)) * e8m0_decode_reciprocal(static_cast<uint8_t>(b)), 1.0f) << b;
    EXPECT_EQ(e8m0_encode_ceil(e8m0_decode(static_cast<uint8_t>(b))), b) << b;
  }
}

TEST(Philox, KnownAnswer) {
  // Random123's kat_vectors for philox4x32_10: counter 0, key 0.
  auto r = philox4x32_10({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(r[0], 0x6627e8d5u);
  EXPECT_EQ(r[1], 0xe169c58du);
  EXPECT_EQ(r[2], 0xbc57ac4cu);
  EXPECT_EQ(r[3], 0x9b00dbd8u);
}

#ifdef NIBBLE_HAVE_CUDA_HEADERS
TEST(NvidiaHost, E2M1EncodeSweep) {
  int64_t n = 0;
  for (float x : sweep_inputs()) {
    if (std::isnan(x)) continue;  // NaN is rejected before encoding; satfinite maps it to 6 here
    uint8_t want = static_cast<uint8_t>(__nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest)) & 0xF;
    ASSERT_EQ(e2m1_encode_rn(x), want) << "x=" << x << " bits=0x" << std::hex << std::bit_cast<uint32_t>(x);
    ++n;
  }
  EXPECT_GT(n, 390000);
}

TEST(NvidiaHost, E2M1DecodeEveryCode) {
  for (int c = 0; c < 16; ++c) {
    __half_raw h = __nv_cvt_fp4_to_halfraw(static_cast<__nv_fp4_storage_t>(c), __NV_E2M1);
    __half hv(h);
    EXPECT_EQ(static_cast<float>(hv), e2m1_decode(static_cast<uint8_t>(c))) << c;
  }
}

TEST(NvidiaHost, E4M3EncodeSweep) {
  for (float x : sweep_inputs()) {
    uint8_t want = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
    ASSERT_EQ(e4m3_encode_rn(x), want) << "x=" << x << " bits=0x" << std::hex << std::bit_cast<uint32_t>(x);
  }
}

TEST(NvidiaHost, E5M2EncodeSweep) {
  for (float x : sweep_inputs()) {
    uint8_t want = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
    if (std::isnan(x)) {  // any NaN encoding is a NaN
      EXPECT_TRUE(std::isnan(e5m2_decode(e5m2_encode_rn(x))));
      continue;
    }
    ASSERT_EQ(e5m2_encode_rn(x), want) << "x=" << x << " bits=0x" << std::hex << std::bit_cast<uint32_t>(x);
  }
}

TEST(NvidiaHost, Fp8DecodeEveryCode) {
  for (int c = 0; c < 256; ++c) {
    for (auto kind : {__NV_E4M3, __NV_E5M2}) {
      __half hv(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(c), kind));
      float want = static_cast<float>(hv);
      float got = kind == __NV_E4M3 ? e4m3_decode(static_cast<uint8_t>(c)) : e5m2_decode(static_cast<uint8_t>(c));
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << c;
      } else {
        EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want)) << "code " << c;
      }
    }
  }
}

TEST(NvidiaHost, E8M0RoundUpSweep) {
  for (float x : sweep_inputs()) {
    if (std::isnan(x) || x < 0) continue;
    uint8_t want = __nv_cvt_float_to_e8m0(x, __NV_SATFINITE, cudaRoundPosInf);
    ASSERT_EQ(e8m0_encode_ceil(x), want) << "x=" << x << " bits=0x" << std::hex << std::bit_cast<uint32_t>(x);
  }
}

TEST(NvidiaHost, BF16RoundSweep) {
  for (float x : sweep_inputs()) {
    __nv_bfloat16 b = __float2bfloat16_rn(x);
    uint16_t want = std::bit_cast<__nv_bfloat16_raw>(b).x;
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(bf16_from_float_rn(x))));
      continue;
    }
    ASSERT_EQ(bf16_from_float_rn(x).bits, want) << "x=" << x;
  }
}
#else
TEST(NvidiaHost, Skipped) { GTEST_SKIP() << "cuda_fp4.h/cuda_fp8.h not found: install the CUDA toolkit headers to run the NVIDIA codec comparisons"; }
#endif
