// The scalar reference against the spec's worked examples and its edge cases.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "format/hadamard.h"
#include "format/quant_stats.h"
#include "format/quantize.h"

using namespace nibble;

namespace {
std::vector<uint8_t> bytes(const QuantizedTensor& q) { return q.codes; }
}

TEST(SpecExample, GridValuesScale7E) {
  std::vector<float> x = {0, .25f, .5f, .75f, 1, 1.25f, 1.5f, 1.75f, 2, 2.5f, 3, 3.5f, 4, 5, 6, -6};
  auto q = ref::quantize(x, 1, 16, {});
  EXPECT_EQ(q.scales[0], 0x7E);
  EXPECT_EQ(bytes(q), (std::vector<uint8_t>{0x00, 0x21, 0x22, 0x43, 0x44, 0x65, 0x66, 0xF7}));
}

TEST(SpecExample, TensorAmax10) {
  // The block sits in a tensor whose amax is 10 (a second block holds the 10).
  std::vector<float> x = {1.3f, -1, .7f, .2f, -.05f, .33f, .5f, -1.25f, .9f, 0, .61f, -.44f, 1.1f, .12f, -.8f, .25f};
  std::vector<float> t(x);
  t.resize(32, 0.0f);
  t[16] = 10.0f;
  auto q = ref::quantize(t, 1, 32, {});
  EXPECT_EQ(q.amax, 10.0f);
  EXPECT_EQ(q.scales[0], 0x67);
  EXPECT_EQ(std::vector<uint8_t>(q.codes.begin(), q.codes.begin() + 8),
            (std::vector<uint8_t>{0xE7, 0x25, 0x38, 0xF4, 0x06, 0xC5, 0x16, 0x2E}));
  std::vector<float> d(32);
  ref::dequantize(q, d);
  EXPECT_FLOAT_EQ(d[0], 1.3392857f);
}

TEST(SpecExample, UnderflowingScale) {
  std::vector<float> t(32, 0.0f);
  t[0] = 1e-3f;
  t[1] = -5e-4f;
  t[16] = 2688.0f;
  auto q = ref::quantize(t, 1, 32, {});
  EXPECT_EQ(q.scales[0], 0x00);
  EXPECT_EQ(q.codes[0], 0xF7);  // codes 7, 15
  std::vector<float> d(32);
  ref::dequantize(q, d);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(d[i], 0.0f);
}

TEST(SpecExample, AllZeroTensor) {
  std::vector<float> x(64, 0.0f);
  auto q = ref::quantize(x, 2, 32, {});
  EXPECT_EQ(q.decode_scale, 1.0f);
  for (auto b : q.codes) EXPECT_EQ(b, 0);
  for (auto s : q.scales) EXPECT_EQ(s, 0);
  std::vector<float> d(64);
  ref::dequantize(q, d);
  for (float v : d) EXPECT_EQ(v, 0.0f);
}

TEST(SpecExample, ScaleOrderOfOperations) {
  // amax 96, block amax 36: b * (S_enc * (1/6)) gives 0x73; (b/6)*S_enc would give 0x72.
  auto g = ref::nvfp4_global_scale(96.0f, false);
  EXPECT_EQ(e4m3_encode_rn(36.0f * (g.encode * (1.0f / 6.0f))), 0x73);
  std::vector<float> t(32, 0.0f);
  t[0] = 36.0f;
  t[16] = 96.0f;
  auto q = ref::quantize(t, 1, 32, {});
  EXPECT_EQ(q.scales[0], 0x73);
}

TEST(Saturation, ScaleSaturatesAt448) {
  EXPECT_EQ(e4m3_encode_rn(464.0f), 0x7E);
  EXPECT_EQ(e4m3_encode_rn(1e9f), 0x7E);
}

TEST(Validation, RefusesBadShapesAndNonFinite) {
  std::vector<float> x(40, 1.0f);
  EXPECT_THROW(ref::quantize(x, 2, 20, {}), UsageError);
  x[17] = NAN;
  try {
    ref::quantize(x, 1, 40, {.format = Format::fp8_e4m3});
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("[0, 17]"), std::string::npos) << e.what();
  }
  std::vector<float> y(32, 1.0f);
  EXPECT_THROW(ref::quantize(y, 1, 32, {.format = Format::mxfp8, .rht = true}), UsageError);
  EXPECT_THROW(ref::quantize(y, 1, 32, {.format = Format::fp8_e5m2, .rounding = Rounding::stochastic}), UsageError);
}

TEST(Tiles16x16, TransposedCopyIsExactTranspose) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  const int64_t rows = 48, cols = 64;
  std::vector<float> x(rows * cols);
  for (auto& v : x) v = nd(rng) * (rng() % 7 == 0 ? 30.0f : 1.0f);
  QuantOptions o{.tile_16x16 = true};
  auto q = ref::quantize(x, rows, cols, o);
  auto t = ref::quantize_transposed(x, rows, cols, o);
  ASSERT_EQ(t.rows, cols);
  ASSERT_EQ(t.cols, rows);
  auto code = [](const QuantizedTensor& z, int64_t r, int64_t c) {
    uint8_t b = z.codes[(r * z.cols + c) / 2];
    return (c & 1) ? b >> 4 : b & 0xF;
  };
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      ASSERT_EQ(code(q, r, c), code(t, c, r));
      ASSERT_EQ(q.scales[r * (cols / 16) + c / 16], t.scales[c * (rows / 16) + r / 16]);
    }
  // Dequantized transposed == transposed dequantized, exactly.
  std::vector<float> dq(rows * cols), dt(rows * cols);
  ref::dequantize(q, dq);
  ref::dequantize(t, dt);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(dq[r * cols + c], dt[c * rows + r]);
}

TEST(Tiles16x16, OneScalePerTile) {
  std::vector<float> x(32 * 32);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i)) * (i == 5 * 32 + 3 ? 100.f : 1.f);
  auto q = ref::quantize(x, 32, 32, {.tile_16x16 = true});
  auto g = ref::nvfp4_global_scale(q.amax, false);
  for (int tr = 0; tr < 2; ++tr)
    for (int tc = 0; tc < 2; ++tc) {
      float tile_amax = 0;
      for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) tile_amax = std::max(tile_amax, std::fabs(x[(tr * 16 + r) * 32 + tc * 16 + c]));
      uint8_t want = e4m3_encode_rn(tile_amax * (g.encode * (1.0f / 6.0f)));
      for (int r = 0; r < 16; ++r) EXPECT_EQ(q.scales[(tr * 16 + r) * 2 + tc], want) << tr << "," << tc << "," << r;
    }
  EXPECT_EQ(q.scales[0], 0x7E);  // the tile holding the tensor amax maps it to 448
}

TEST(Rht, OrthogonalInvertibleAndCheckVector) {
  float ones[16];
  std::fill(ones, ones + 16, 1.0f);
  rht16_forward(ones);
  const float want[16] = {-1, 0, 1, 0, 1, 0, -1, 0, 1, 2, 1, 0, 1, 0, 1, -2};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(ones[i], want[i]) << i;
  // Rows of H (images of unit vectors) are orthonormal.
  float h[16][16];
  for (int i = 0; i < 16; ++i) {
    std::fill(h[i], h[i] + 16, 0.0f);
    h[i][i] = 1.0f;
    rht16_forward(h[i]);
  }
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float dot = 0;
      for (int k = 0; k < 16; ++k) dot += h[i][k] * h[j][k];
      EXPECT_EQ(dot, i == j ? 1.0f : 0.0f);
    }
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  float v[16], w[16];
  for (int i = 0; i < 16; ++i) v[i] = w[i] = nd(rng);
  rht16_forward(w);
  rht16_inverse(w);
  for (int i = 0; i < 16; ++i) EXPECT_NEAR(w[i], v[i], 4e-7f * (1 + std::fabs(v[i])));
}

TEST(Rht, QuantizeWithRhtRoundTripsAndSpreadsOutliers) {
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  const int64_t rows = 8, cols = 256;
  std::vector<float> x(rows * cols);
  for (auto& v : x) v = nd(rng);
  for (int i = 0; i < rows * cols; i += 97) x[i] *= 50.0f;  // outliers
  auto plain = ref::quantize(x, rows, cols, {});
  auto rht = ref::quantize(x, rows, cols, {.rht = true});
  std::vector<float> d(x.size());
  ref::dequantize(rht, d);
  auto sp = quant_stats(x, plain), sr = quant_stats(x, rht);
  // A lone outlier forces its block's scale up and flushes its 15 neighbours; the transform
  // spreads the outlier over the block, so far fewer values are lost.
  EXPECT_LT(sr.flushed_to_zero * 2, sp.flushed_to_zero);
  EXPECT_LT(sr.rel_rms_error, 0.2);
  double err = 0, ref2 = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    err += (d[i] - x[i]) * (d[i] - x[i]);
    ref2 += x[i] * x[i];
  }
  EXPECT_NEAR(std::sqrt(err / ref2), sr.rel_rms_error, 0.01);  // inverse RHT lands back in x's domain
}

TEST(StochasticRounding, UnbiasedAndBetterOnAverage) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  const int64_t rows = 4, cols = 64;
  std::vector<float> x(rows * cols);
  for (auto& v : x) v = nd(rng);
  const int draws = 400;
  std::vector<double> mean(x.size(), 0.0);
  std::vector<float> d(x.size());
  for (int s = 0; s < draws; ++s) {
    auto q = ref::quantize(x, rows, cols, {.rounding = Rounding::stochastic, .seed = 11, .offset = static_cast<uint64_t>(s) * 1000003});
    ref::dequantize(q, d);
    for (size_t i = 0; i < x.size(); ++i) mean[i] += d[i] / draws;
  }
  auto rn = ref::quantize(x, rows, cols, {});
  std::vector<float> drn(x.size());
  ref::dequantize(rn, drn);
  double err_sr = 0, err_rn = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    err_sr += (mean[i] - x[i]) * (mean[i] - x[i]);
    err_rn += (drn[i] - x[i]) * (drn[i] - x[i]);
    // Per element: the grid gap at this scale bounds the spread; 6-sigma bound on the mean of draws.
    double step = e4m3_decode(rn.scales[i / 16]) * rn.decode_scale;  // value of one E2M1 unit
    if (std::fabs(x[i]) / step > 6.0) continue;  // the block scale rounded down: saturates, by design
    double gap = 2.0 * step;  // the widest grid gap (4 to 6); an SR draw's spread is at most gap/2
    EXPECT_NEAR(mean[i], x[i], 6.0 * gap / 2.0 / std::sqrt(static_cast<double>(draws)) + 1e-7) << i;
  }
  EXPECT_LT(err_sr, err_rn / 4);
  // Same seed and offset: the same bits.
  auto a = ref::quantize(x, rows, cols, {.rounding = Rounding::stochastic, .seed = 9, .offset = 42});
  auto b = ref::quantize(x, rows, cols, {.rounding = Rounding::stochastic, .seed = 9, .offset = 42});
  EXPECT_EQ(a.codes, b.codes);
}

TEST(FourOverSix, NeverWorseThanSixPerBlock) {
  std::mt19937 rng(8);
  std::normal_distribution<float> nd;
  std::vector<float> x(16 * 64);
  for (auto& v : x) v = nd(rng);
  auto q6 = ref::quantize(x, 16, 64, {});
  auto q46 = ref::quantize(x, 16, 64, {.four_over_six = true});
  EXPECT_LT(quant_stats(x, q46).rel_rms_error, quant_stats(x, q6).rel_rms_error);
  EXPECT_EQ(q46.decode_scale, 1.0f / (1536.0f / q46.amax));
}

TEST(Mx, Mxfp4AndMxfp8) {
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[i] = (i - 32) * 0.37f;
  auto q4 = ref::quantize(x, 1, 64, {.format = Format::mxfp4});
  ASSERT_EQ(q4.scales.size(), 2u);
  // Block 0 amax = 32*0.37 = 11.84 -> /6 = 1.97 -> ceil pow2 = 2 -> E8M0 128.
  EXPECT_EQ(q4.scales[0], 128);
  auto q8 = ref::quantize(x, 1, 64, {.format = Format::mxfp8});
  std::vector<float> d(64);
  ref::dequantize(q8, d);
  for (int i = 0; i < 64; ++i) EXPECT_NEAR(d[i], x[i], std::fabs(x[i]) / 16 + 1e-6);
}

TEST(Fp8, PerTensorCurrentScaling) {
  std::vector<float> x = {1.0f, -2.0f, 0.5f, 3.0f};
  auto q = ref::quantize(x, 2, 2, {.format = Format::fp8_e4m3});
  EXPECT_EQ(q.codes[3], 0x7E);  // amax maps to 448
  std::vector<float> d(4);
  ref::dequantize(q, d);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(d[i], x[i], std::fabs(x[i]) / 16);
  auto z = ref::quantize(std::vector<float>(4, 0.0f), 2, 2, {.format = Format::fp8_e5m2});
  EXPECT_EQ(z.decode_scale, 1.0f);
}

TEST(Stats, CountsFlushAndSaturation) {
  std::vector<float> t(32, 0.0f);
  t[0] = 1e-3f;
  t[16] = 2688.0f;
  auto q = ref::quantize(t, 1, 32, {});
  auto s = quant_stats(t, q);
  EXPECT_EQ(s.flushed_to_zero, 1);
  EXPECT_EQ(s.count, 32);
  EXPECT_GT(s.rel_rms_error, 0.0);
}
