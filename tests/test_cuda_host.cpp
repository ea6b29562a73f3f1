// The CUDA backend's host-checkable parts, run without a GPU: the device code's math
// (kernels/cuda/device_math.h, compiled here by g++) against the scalar reference, a host replay
// of the quantize kernel's block logic against ref::quantize, the 128x4 scale swizzle against the
// spec's formula, and the GEMM path choice. The GPU tests (test_cuda_quantize, test_cuda_gemm) then
// only have the compiler's device floating-point semantics left to check.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "format/codecs.h"
#include "format/hadamard.h"
#include "format/philox.h"
#include "format/quantize.h"
#include "kernels/cpu/gemm/gemm.h"
#include "support/random.h"
#include "kernels/cuda/device_math.h"
#if defined(NIBBLE_HAVE_CUDA)
#include "kernels/cuda/context.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/quantize.h"
#endif

using namespace nibble;
namespace dm = nibble::cuda::dm;

namespace {

// Float bit patterns worth testing for an 8-bit codec: every pattern with the low 9 mantissa bits
// cleared (all exponents and 14 mantissa bits) plus, around each representable FP8 value's
// midpoints, the midpoint and its neighbours -- where rounding decisions happen.
std::vector<float> codec_sweep() {
  std::vector<float> v;
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 1u << 9) v.push_back(std::bit_cast<float>(static_cast<uint32_t>(u)));
  for (int c = 0; c < 255; ++c) {
    for (float (*decode)(uint8_t) : {&e4m3_decode, &e5m2_decode}) {
      const float lo = decode(static_cast<uint8_t>(c)), hi = decode(static_cast<uint8_t>(c + 1));
      if (!std::isfinite(lo) || !std::isfinite(hi) || std::signbit(lo) != std::signbit(hi)) continue;
      const float mid = (lo + hi) / 2;  // exact: neighbours differ by one quantum
      for (float m : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f), -mid}) v.push_back(m);
    }
  }
  return v;
}

// Normal values with outliers, tiny values and zeros.
std::vector<float> random_tensor(int64_t n, uint32_t seed, float scale = 3.0f) {
  return nibble_test::floats_with_outliers(static_cast<size_t>(n), seed, scale);
}

}  // namespace

// ------------------------------------------------------------------ codecs -------------------------
TEST(CudaDeviceMath, Fp8EncodersMatchReference) {
  for (float x : codec_sweep()) {
    ASSERT_EQ(dm::e4m3_encode_rn(x), e4m3_encode_rn(x)) << "e4m3 of " << x << " bits " << std::bit_cast<uint32_t>(x);
    ASSERT_EQ(dm::e5m2_encode_rn(x), e5m2_encode_rn(x)) << "e5m2 of " << x << " bits " << std::bit_cast<uint32_t>(x);
  }
}

TEST(CudaDeviceMath, DecodersMatchReferenceOnEveryCode) {
  for (int c = 0; c < 256; ++c) {
    const auto b = static_cast<uint8_t>(c);
    EXPECT_EQ(std::bit_cast<uint32_t>(dm::e4m3_decode(b)), std::bit_cast<uint32_t>(e4m3_decode(b))) << c;
    EXPECT_EQ(std::bit_cast<uint32_t>(dm::e5m2_decode(b)), std::bit_cast<uint32_t>(e5m2_decode(b))) << c;
    if (b != 0xFF) {
      EXPECT_EQ(dm::e8m0_decode(b), e8m0_decode(b)) << c;
      EXPECT_EQ(dm::e8m0_decode_reciprocal(b), e8m0_decode_reciprocal(b)) << c;
    }
  }
  for (int c = 0; c < 16; ++c)
    EXPECT_EQ(std::bit_cast<uint32_t>(dm::e2m1_value(static_cast<uint8_t>(c))),
              std::bit_cast<uint32_t>(e2m1_decode(static_cast<uint8_t>(c))));
}

TEST(CudaDeviceMath, E2M1AndE8M0AndBf16MatchReference) {
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 1u << 11) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(u));
    ASSERT_EQ(dm::e2m1_encode_rn(x), e2m1_encode_rn(x)) << x;
    ASSERT_EQ(dm::bf16_bits_rn(x), bf16_from_float_rn(x).bits) << x;
    if (!std::signbit(x)) {
      ASSERT_EQ(dm::e8m0_encode_ceil(x), e8m0_encode_ceil(x)) << x;
    }
    if (std::isfinite(x)) {
      for (float uniform : {0.0f, 0.3f, 0.5f, 0.99999994f}) {
        ASSERT_EQ(dm::e2m1_encode_sr(x, uniform), e2m1_encode_sr(x, uniform)) << x;
      }
    }
  }
  // The E2M1 decision points themselves and their neighbours.
  for (float t : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f})
    for (float x : {t, std::nextafter(t, 0.0f), std::nextafter(t, 10.0f), -t}) {
      EXPECT_EQ(dm::e2m1_encode_rn(x), e2m1_encode_rn(x)) << x;
      EXPECT_EQ(dm::e2m1_encode_sr(x, 0.5f), e2m1_encode_sr(x, 0.5f)) << x;
    }
  // Stochastic rounding's own break points (the E2M1 values, where the gap changes) and their
  // neighbours, at thresholds on both sides of the fraction there.
  for (float t : {0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f})
    for (float x : {t, std::nextafter(t, 0.0f), std::nextafter(t, 10.0f), -t})
      for (float uniform : {0.0f, 1e-7f, 0.25f, 0.5f, 0.75f, 0.99999994f})
        EXPECT_EQ(dm::e2m1_encode_sr(x, uniform), e2m1_encode_sr(x, uniform)) << x << " " << uniform;
}

TEST(CudaDeviceMath, PhiloxMatchesReference) {
  for (uint64_t seed : {0ull, 1ull, 0x123456789ABCDEFull})
    for (uint64_t index : {0ull, 1ull, 2ull, 3ull, 4ull, 5ull, 15ull, 16ull, 17ull, 1000001ull, 0xFFFFFFFFFull,
                           0x1000000000ull - 7, ~0ull - 20, ~0ull - 3}) {
      dm::PhiloxStream stream(seed);
      for (uint64_t k = 0; k < 40; ++k)  // across counters, from the cached one within a counter
        ASSERT_EQ(stream.byte(index + k), philox_byte(seed, index + k)) << seed << " " << index << " + " << k;
      uint8_t block[16];
      dm::sr_bytes16(seed, index, block);  // wraps past 2^64 for the last indices, as positions do
      for (uint64_t k = 0; k < 16; ++k) ASSERT_EQ(block[k], philox_byte(seed, index + k)) << seed << " " << index << " + " << k;
    }
  for (int r = 0; r < 256; ++r)
    ASSERT_EQ(dm::sr_threshold(static_cast<uint8_t>(r)), sr_threshold(static_cast<uint8_t>(r)));
}

TEST(CudaDeviceMath, RhtMatchesReference) {
  auto x = random_tensor(16 * 64, 7);
  for (size_t b = 0; b < x.size(); b += 16) {
    float ref[16], dev[16];
    std::memcpy(ref, &x[b], sizeof ref);
    std::memcpy(dev, &x[b], sizeof dev);
    rht16_forward(ref);
    dm::rht16_forward(dev);
    for (int k = 0; k < 16; ++k) ASSERT_EQ(std::bit_cast<uint32_t>(dev[k]), std::bit_cast<uint32_t>(ref[k]));
    rht16_inverse(ref);
    dm::rht16_inverse(dev);
    for (int k = 0; k < 16; ++k) ASSERT_EQ(std::bit_cast<uint32_t>(dev[k]), std::bit_cast<uint32_t>(ref[k]));
  }
  float ones[16];
  for (float& v : ones) v = 1.0f;
  dm::rht16_forward(ones);
  const float expected[16] = {-1, 0, 1, 0, 1, 0, -1, 0, 1, 2, 1, 0, 1, 0, 1, -2};  // spec section 4
  for (int k = 0; k < 16; ++k) EXPECT_EQ(ones[k], expected[k]);
}

// ------------------------------------------------------------------ the kernels' block logic -------
namespace {
dm::FourOverSix four_over_six_of(const QuantOptions& o) {
  if (!o.four_over_six) return dm::FourOverSix::off;
  return o.four_over_six_error == FourOverSixError::mse ? dm::FourOverSix::mse : dm::FourOverSix::mae;
}

// The kernel's xor butterfly over a tile's 16 lanes (__shfl_xor_sync with offsets 8, 4, 2, 1),
// replayed lane by lane: returns what lane 0 holds (the test checks every lane agrees).
float butterfly_sum16(const float* row_errors, bool* all_lanes_equal) {
  float lane[16];
  for (int i = 0; i < 16; ++i) lane[i] = row_errors[i];
  for (int offset = 8; offset > 0; offset >>= 1) {
    float next[16];
    for (int i = 0; i < 16; ++i) next[i] = dm::nb_add(lane[i], lane[i ^ offset]);
    for (int i = 0; i < 16; ++i) lane[i] = next[i];
  }
  *all_lanes_equal = true;
  for (int i = 1; i < 16; ++i) *all_lanes_equal = *all_lanes_equal && std::bit_cast<uint32_t>(lane[i]) == std::bit_cast<uint32_t>(lane[0]);
  return lane[0];
}

// What nvfp4_tile_kernel computes, replayed on the host with the same device_math functions:
// row-wise 1x16 / 16x16 (tile amax over up to 16 rows), optional RHT, RN or Philox SR, 4/6 (per
// block, or per tile from the butterfly sum of the row errors, rows past the end counting 0).
QuantizedTensor replay_nvfp4_kernel(const std::vector<float>& x, int64_t rows, int64_t cols, const QuantOptions& o) {
  QuantizedTensor q;
  q.rows = rows;
  q.cols = cols;
  q.codes.assign(static_cast<size_t>(rows * cols / 2), 0);
  q.scales.assign(static_cast<size_t>(rows * cols / 16), 0);
  std::vector<float> t(x);
  if (o.rht)
    for (size_t b = 0; b < t.size(); b += 16) dm::rht16_forward_bf16(&t[b]);
  float amax = 0.0f;
  for (size_t b = 0; b < t.size(); b += 16) amax = dm::max_f(amax, dm::block_amax16(&t[b]));
  q.amax = amax;
  const dm::GlobalScale g =
      dm::nvfp4_global_scale(amax, dm::nvfp4_global_numerator(o.four_over_six, o.four_over_six_e4m3_max));
  q.decode_scale = g.decode;
  const dm::FourOverSix fos = four_over_six_of(o);
  const int64_t cb = cols / 16;
  auto store = [&](int64_t r, int64_t b, uint8_t s, const uint8_t* codes) {
    q.scales[r * cb + b] = s;
    for (int k = 0; k < 8; ++k)
      q.codes[(r * cols + b * 16) / 2 + k] = static_cast<uint8_t>(codes[2 * k] | (codes[2 * k + 1] << 4));
  };
  for (int64_t r0 = 0; r0 < rows; r0 += 16)
    for (int64_t b = 0; b < cb; ++b) {
      float tile_amax = 0.0f;
      for (int64_t r = r0; r < std::min(rows, r0 + 16); ++r)
        tile_amax = dm::max_f(tile_amax, dm::block_amax16(&t[r * cols + b * 16]));
      if (o.tile_16x16 && fos != dm::FourOverSix::off) {
        dm::FourOverSixRow c[16];
        float error4[16] = {}, error6[16] = {};
        for (int64_t r = r0; r < std::min(rows, r0 + 16); ++r) {
          const uint64_t first = o.offset + static_cast<uint64_t>(r * cols + b * 16);
          if (o.rounding == Rounding::stochastic)
            dm::four_over_six_row(&t[r * cols + b * 16], tile_amax, g, fos, dm::ReferenceSr{o.seed, first}, c[r - r0]);
          else
            dm::four_over_six_row(&t[r * cols + b * 16], tile_amax, g, fos, dm::ReferenceRn{}, c[r - r0]);
          error4[r - r0] = c[r - r0].error4;
          error6[r - r0] = c[r - r0].error6;
        }
        bool same4 = false, same6 = false;
        const float sum4 = butterfly_sum16(error4, &same4), sum6 = butterfly_sum16(error6, &same6);
        EXPECT_TRUE(same4 && same6);
        EXPECT_EQ(sum4, dm::four_over_six_tile_error(error4));
        EXPECT_EQ(sum6, dm::four_over_six_tile_error(error6));
        const bool map4 = dm::four_over_six_picks_map4(sum4, sum6);
        for (int64_t r = r0; r < std::min(rows, r0 + 16); ++r) {
          const dm::FourOverSixRow& cr = c[r - r0];
          store(r, b, map4 ? cr.scales.map4 : cr.scales.map6, map4 ? cr.codes4 : cr.codes6);
        }
        continue;
      }
      for (int64_t r = r0; r < std::min(rows, r0 + 16); ++r) {
        const float* v = &t[r * cols + b * 16];
        const float block_amax = o.tile_16x16 ? tile_amax : dm::block_amax16(v);
        uint8_t codes[16];
        const uint64_t first = o.offset + static_cast<uint64_t>(r * cols + b * 16);
        const uint8_t s = o.rounding == Rounding::stochastic
                              ? dm::nvfp4_quantize_block16(v, block_amax, g, fos, dm::ReferenceSr{o.seed, first}, codes)
                              : dm::nvfp4_quantize_block16(v, block_amax, g, fos, dm::ReferenceRn{}, codes);
        store(r, b, s, codes);
      }
    }
  return q;
}
}  // namespace

TEST(CudaDeviceMath, Nvfp4KernelLogicMatchesReference) {
  struct Case {
    int64_t rows, cols;
    QuantOptions opt;
  };
  QuantOptions rn, tile, sr, rht_sr, fos, tile_fos_sr;
  tile.tile_16x16 = true;
  sr.rounding = Rounding::stochastic;
  sr.seed = 42;
  sr.offset = 3;  // not a multiple of 16: each NVFP4 block takes bytes of two Philox outputs
  rht_sr = sr;
  rht_sr.rht = true;
  fos.four_over_six = true;
  tile_fos_sr = sr;
  tile_fos_sr.tile_16x16 = true;
  tile_fos_sr.four_over_six = true;
  const Case cases[] = {{3, 64, rn},     {32, 48, tile},   {20, 32, tile},  {5, 96, sr},
                        {4, 64, rht_sr}, {7, 128, fos},    {33, 32, tile_fos_sr}};
  uint32_t seed = 1;
  for (const Case& c : cases) {
    const auto x = random_tensor(c.rows * c.cols, seed++);
    const QuantizedTensor expected = ref::quantize(x, c.rows, c.cols, c.opt);
    const QuantizedTensor got = replay_nvfp4_kernel(x, c.rows, c.cols, c.opt);
    EXPECT_EQ(got.amax, expected.amax);
    EXPECT_EQ(got.decode_scale, expected.decode_scale);
    EXPECT_EQ(got.scales, expected.scales) << c.rows << "x" << c.cols;
    EXPECT_EQ(got.codes, expected.codes) << c.rows << "x" << c.cols;
  }
}

TEST(CudaDeviceMath, FourOverSixKernelLogicMatchesReference) {
  // Every Four Over Six option (error measure, ceiling, 1x16 / 16x16, RN / SR, RHT) on fresh
  // random tensors, including a short last tile; and the device functions one by one.
  std::mt19937 pick(77);
  uint32_t seed = 100;
  for (FourOverSixError e : {FourOverSixError::mae, FourOverSixError::mse})
    for (int ceiling : {448, 256})
      for (bool tile16 : {false, true})
        for (bool sr : {false, true})
          for (bool rht : {false, true})
            for (auto [rows, cols] : {std::pair<int64_t, int64_t>{48, 64}, {21, 32}}) {
              QuantOptions o;
              o.tile_16x16 = tile16;
              o.rounding = sr ? Rounding::stochastic : Rounding::nearest;
              o.seed = pick();
              o.offset = pick() % 100;
              o.rht = rht;
              o.four_over_six = true;
              o.four_over_six_error = e;
              o.four_over_six_e4m3_max = ceiling;
              SCOPED_TRACE(std::string(to_string(e)) + " " + std::to_string(ceiling) + (tile16 ? " 16x16" : " 1x16") +
                           (sr ? " sr" : " rn") + (rht ? " rht" : "") + " [" + std::to_string(rows) + "x" +
                           std::to_string(cols) + "] seed " + std::to_string(seed));
              const auto x = random_tensor(rows * cols, seed++, pick() % 2 ? 3.0f : 1e-3f);
              const QuantizedTensor expected = ref::quantize(x, rows, cols, o);
              const QuantizedTensor got = replay_nvfp4_kernel(x, rows, cols, o);
              EXPECT_EQ(got.amax, expected.amax);
              EXPECT_EQ(got.decode_scale, expected.decode_scale);
              ASSERT_EQ(got.scales, expected.scales);
              ASSERT_EQ(got.codes, expected.codes);
            }
  // The device functions against the reference's, one block at a time.
  const auto x = random_tensor(16 * 64, 5);
  for (int ceiling : {448, 256}) {
    const float numerator = dm::nvfp4_global_numerator(true, ceiling);
    EXPECT_EQ(numerator, nvfp4_global_numerator(true, ceiling));
    float amax = 0.0f;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    const dm::GlobalScale g = dm::nvfp4_global_scale(amax, numerator);
    const ref::Nvfp4GlobalScale rg = ref::nvfp4_global_scale(amax, numerator);
    ASSERT_EQ(g.encode, rg.encode);
    ASSERT_EQ(g.decode, rg.decode);
    for (int b = 0; b < 64; ++b) {
      const float* v = &x[b * 16];
      const float block_amax = dm::block_amax16(v);
      for (FourOverSixError e : {FourOverSixError::mae, FourOverSixError::mse}) {
        const auto want = ref::four_over_six_candidates(v, block_amax, rg, e, Rounding::nearest, 0, 0);
        dm::FourOverSixRow got;
        dm::four_over_six_row(v, block_amax, g, e == FourOverSixError::mse ? dm::FourOverSix::mse : dm::FourOverSix::mae,
                              dm::ReferenceRn{}, got);
        ASSERT_EQ(got.scales.map6, want.scales.map6);
        ASSERT_EQ(got.scales.map4, want.scales.map4);
        ASSERT_EQ(std::bit_cast<uint32_t>(got.error6), std::bit_cast<uint32_t>(want.error6));
        ASSERT_EQ(std::bit_cast<uint32_t>(got.error4), std::bit_cast<uint32_t>(want.error4));
        for (int k = 0; k < 16; ++k) {
          ASSERT_EQ(got.codes6[k], want.codes6[k]);
          ASSERT_EQ(got.codes4[k], want.codes4[k]);
        }
      }
    }
  }
  float r[16];
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int trial = 0; trial < 1000; ++trial) {
    for (float& v : r) v = std::ldexp(u(rng), static_cast<int>(rng() % 40) - 20);
    bool same = false;
    ASSERT_EQ(std::bit_cast<uint32_t>(butterfly_sum16(r, &same)), std::bit_cast<uint32_t>(ref::four_over_six_tile_error(r)));
    ASSERT_TRUE(same);
  }
}

TEST(CudaDeviceMath, MxAndFp8LogicMatchesReference) {
  const int64_t rows = 6, cols = 64;
  const auto x = random_tensor(rows * cols, 99);
  QuantOptions mx_sr;  // mx_kernel's SR: a PhiloxStream over the elements' positions
  mx_sr.format = Format::mxfp4;
  mx_sr.rounding = Rounding::stochastic;
  mx_sr.seed = 5;
  mx_sr.offset = 9;
  for (const QuantOptions& o : {QuantOptions{.format = Format::mxfp4}, QuantOptions{.format = Format::mxfp8}, mx_sr}) {
    const Format f = o.format;
    const QuantizedTensor expected = ref::quantize(x, rows, cols, o);
    dm::PhiloxStream stream(o.seed);
    for (int64_t blk = 0; blk < rows * cols / 32; ++blk) {
      float b = 0.0f;
      for (int k = 0; k < 32; ++k) b = dm::max_f(b, dm::abs_f(x[blk * 32 + k]));
      const uint8_t e = dm::e8m0_encode_ceil(dm::nb_mul(b, f == Format::mxfp4 ? 1.0f / 6.0f : 1.0f / 448.0f));
      ASSERT_EQ(e, expected.scales[blk]);
      const float inv = dm::e8m0_decode_reciprocal(e);
      for (int k = 0; k < 32; ++k) {
        const int64_t i = blk * 32 + k;
        const float v = dm::nb_mul(x[i], inv);
        const uint8_t code =
            f == Format::mxfp8 ? dm::e4m3_encode_rn(v)
            : o.rounding == Rounding::stochastic
                ? dm::e2m1_encode_sr(v, dm::sr_threshold(stream.byte(o.offset + static_cast<uint64_t>(i))))
                : dm::e2m1_encode_rn(v);
        const uint8_t want = f == Format::mxfp4 ? ((expected.codes[i / 2] >> (4 * (i & 1))) & 0xF) : expected.codes[i];
        ASSERT_EQ(code, want) << i;
      }
    }
  }
  for (Format f : {Format::fp8_e4m3, Format::fp8_e5m2}) {
    QuantOptions o;
    o.format = f;
    const QuantizedTensor expected = ref::quantize(x, rows, cols, o);
    const float scale = dm::fp8_tensor_scale(expected.amax, f == Format::fp8_e4m3);
    EXPECT_EQ(dm::nb_div(1.0f, scale), expected.decode_scale);
    for (size_t i = 0; i < x.size(); ++i) {
      const float v = dm::nb_mul(x[i], scale);
      ASSERT_EQ(f == Format::fp8_e4m3 ? dm::e4m3_encode_rn(v) : dm::e5m2_encode_rn(v), expected.codes[i]);
    }
  }
}

// ------------------------------------------------------------------ 128x4 swizzle ------------------
TEST(CudaScaleSwizzle, MatchesSpecFormulaAndIsABijection) {
  // Spec section 7, written out independently of device_math.h.
  auto spec = [](int64_t r, int64_t c, int64_t C) {
    const int64_t ceil_c4 = (C + 3) / 4;
    return ((r / 128 * ceil_c4 + c / 4) * 32 + r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4;
  };
  for (auto [rows, scale_cols] : {std::pair<int64_t, int64_t>{128, 4}, {1, 1}, {130, 5}, {256, 12}, {300, 33}}) {
    const int64_t padded_rows = (rows + 127) / 128 * 128, padded_cols = (scale_cols + 3) / 4 * 4;
    const int64_t total = dm::swizzled_scale_bytes(rows, scale_cols);
    ASSERT_EQ(total, padded_rows * padded_cols);
    std::set<int64_t> seen;
    for (int64_t r = 0; r < padded_rows; ++r)
      for (int64_t c = 0; c < padded_cols; ++c) {
        const int64_t off = dm::swizzled_scale_offset(r, c, scale_cols);
        ASSERT_EQ(off, spec(r, c, scale_cols));
        ASSERT_GE(off, 0);
        ASSERT_LT(off, total);
        ASSERT_TRUE(seen.insert(off).second) << "two scales at offset " << off;
        const dm::ScaleIndex back = dm::swizzled_scale_position(off, scale_cols);
        ASSERT_EQ(back.row, r);
        ASSERT_EQ(back.col, c);
      }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), total);
  }
  // A few hand-computed entries: (r, c) = (32, 0) is the second 4-byte group of the first 16 bytes.
  EXPECT_EQ(dm::swizzled_scale_offset(0, 0, 8), 0);
  EXPECT_EQ(dm::swizzled_scale_offset(32, 0, 8), 4);
  EXPECT_EQ(dm::swizzled_scale_offset(1, 0, 8), 16);
  EXPECT_EQ(dm::swizzled_scale_offset(0, 4, 8), 512);
  EXPECT_EQ(dm::swizzled_scale_offset(128, 0, 8), 1024);
}

// ------------------------------------------------------------------ dispatch decisions -------------
#if defined(NIBBLE_HAVE_CUDA)
TEST(CudaDispatch, GemmPathByComputeCapability) {
  using cuda::GemmPath;
  const cuda::GemmShape big{8192, 8192, 8192, 8192};
  EXPECT_EQ(cuda::choose_gemm_path(Format::nvfp4, Format::nvfp4, big, 9, 0), GemmPath::emulated_bf16);   // H100/H200
  EXPECT_EQ(cuda::choose_gemm_path(Format::nvfp4, Format::nvfp4, big, 10, 0), GemmPath::native_nvfp4);   // B200
  EXPECT_EQ(cuda::choose_gemm_path(Format::nvfp4, Format::nvfp4, big, 10, 3), GemmPath::native_nvfp4);   // B300
  EXPECT_EQ(cuda::choose_gemm_path(Format::nvfp4, Format::nvfp4, {64, 64, 48, 64}, 10, 0), GemmPath::emulated_bf16);
  EXPECT_EQ(cuda::choose_gemm_path(Format::fp8_e4m3, Format::fp8_e4m3, big, 9, 0), GemmPath::fp8_cublaslt);
  EXPECT_EQ(cuda::choose_gemm_path(Format::fp8_e4m3, Format::fp8_e5m2, big, 8, 9), GemmPath::fp8_cublaslt);
  EXPECT_EQ(cuda::choose_gemm_path(Format::fp8_e5m2, Format::fp8_e5m2, big, 9, 0), GemmPath::emulated_bf16);
  EXPECT_EQ(cuda::choose_gemm_path(Format::fp8_e4m3, Format::fp8_e4m3, big, 8, 0), GemmPath::emulated_bf16);  // A100
  EXPECT_EQ(cuda::choose_gemm_path(Format::mxfp8, Format::mxfp8, big, 10, 0), GemmPath::emulated_bf16);
  EXPECT_TRUE(cuda::runs_sm100a_kernels(10, 0));
  EXPECT_TRUE(cuda::runs_sm100a_kernels(10, 3));
  EXPECT_FALSE(cuda::runs_sm100a_kernels(9, 0));
  EXPECT_FALSE(cuda::runs_sm100a_kernels(12, 0));
}

TEST(CudaDispatch, RowScaledRefusalsAreTheReferences) {
  // cuda::validate_shape runs on the host before any launch: the reference's row-scaled refusals
  // (TE's: no RHT, SR, 16x16 tiles, Four Over Six; nvfp4 only) with the reference's message.
  const std::vector<float> x(32 * 64, 1.0f);
  for (QuantOptions o : {QuantOptions{.rht = true}, QuantOptions{.rounding = Rounding::stochastic},
                         QuantOptions{.tile_16x16 = true}, QuantOptions{.four_over_six = true},
                         QuantOptions{.format = Format::mxfp4}, QuantOptions{}}) {
    o.row_scaled = true;
    std::string ref_message = "(accepted)", cuda_message = "(accepted)";
    try {
      ref::quantize(x, 32, 64, o);
    } catch (const UsageError& e) {
      ref_message = e.what();
    }
    try {
      cuda::validate_shape(32, 64, o);
    } catch (const UsageError& e) {
      cuda_message = e.what();
    }
    EXPECT_EQ(cuda_message, ref_message);
  }
}

TEST(CudaDispatch, GemmOperandChecksNameTheProblem) {
  EXPECT_NO_THROW(cuda::check_gemm_operands(Format::nvfp4, 32, 64, Format::nvfp4, 16, 64, 16));
  EXPECT_NO_THROW(cuda::check_gemm_operands(Format::fp8_e4m3, 32, 64, Format::fp8_e5m2, 16, 64, 16));
  try {
    cuda::check_gemm_operands(Format::nvfp4, 32, 64, Format::nvfp4, 16, 48, 16);
    FAIL() << "K mismatch accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("disagree on K"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cuda::check_gemm_operands(Format::nvfp4, 32, 64, Format::mxfp4, 16, 64, 16), UsageError);
  EXPECT_THROW(cuda::check_gemm_operands(Format::nvfp4, 32, 64, Format::nvfp4, 16, 64, 8), UsageError);
  EXPECT_NO_THROW(cuda::check_gemm_operands(Format::nvfp4, 32, 64, Format::nvfp4, 16, 64, 16, true, true));
  // One transformed operand: refused with the CPU gemm's message.
  for (bool a_rht : {false, true}) {
    QuantizedTensor a, b;
    a.format = b.format = Format::nvfp4;
    a.block = b.block = BlockShape::row_1x16;
    a.rows = b.rows = 16;
    a.cols = b.cols = 64;
    a.rht = a_rht;
    b.rht = !a_rht;
    std::string cpu_message, cuda_message;
    std::vector<float> c(16 * 16);
    try {
      cpu::gemm(a, b, c.data(), 16);
    } catch (const UsageError& e) {
      cpu_message = e.what();
    }
    try {
      cuda::check_gemm_operands(Format::nvfp4, 16, 64, Format::nvfp4, 16, 64, 16, a_rht, !a_rht);
    } catch (const UsageError& e) {
      cuda_message = e.what();
    }
    EXPECT_NE(cuda_message.find("random Hadamard transform"), std::string::npos) << cuda_message;
    EXPECT_EQ(cuda_message, cpu_message);
  }
}

TEST(CudaDispatch, NoDeviceIsAClearMessageNotACrash) {
  const cuda::DeviceAvailability a = cuda::probe_devices();
  if (a.available) GTEST_SKIP() << "a CUDA device is present (" << a.device_count << "); nothing to check here";
  EXPECT_NE(a.reason.find("no CUDA device found"), std::string::npos) << a.reason;
  try {
    cuda::default_context();
    FAIL() << "a context was created without a device";
  } catch (const cuda::CudaError& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device found"), std::string::npos) << e.what();
  }
}
#endif
