// The scalar reference against the spec's worked examples and its edge cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <string>
#include <cmath>
#include <random>
#include <vector>

#include "format/hadamard.h"
#include "format/quant_stats.h"
#include "format/quantize.h"
#include "support/random.h"

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
  auto g = ref::nvfp4_global_scale(96.0f, kNvfp4GlobalScaleNumerator);
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
  } catch (const NumericalError& e) {  // a UsageError of its own type: non-finite input
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
  auto g = ref::nvfp4_global_scale(q.amax, kNvfp4GlobalScaleNumerator);
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
  const int64_t rows = 8, cols = 256;
  std::vector<float> x = nibble_test::normal_floats(rows * cols, 2);
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
  const int64_t rows = 4, cols = 64;
  const std::vector<float> x = nibble_test::normal_floats(rows * cols, 5);
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
  const std::vector<float> x = nibble_test::normal_floats(16 * 64, 8);
  auto q6 = ref::quantize(x, 16, 64, {});
  auto q46 = ref::quantize(x, 16, 64, {.four_over_six = true, .four_over_six_error = FourOverSixError::mse});
  EXPECT_LT(quant_stats(x, q46).rel_rms_error, quant_stats(x, q6).rel_rms_error);
  // TE's default ceiling: the numerator stays 448 * 6 = 2688.
  EXPECT_EQ(q46.decode_scale, 1.0f / (2688.0f / q46.amax));
  EXPECT_EQ(q46.four_over_six_e4m3_max, 448);
  EXPECT_EQ(q46.four_over_six_error, FourOverSixError::mse);
}

// The hand-worked examples below put the tensor amax at 6 * e4m3_max (2688, or 1536 for 256), so
// S_enc = S_dec = 1: a block (or tile) whose maximum is 6 gets map6 scale 1.0 (0x38) and map4 scale
// 1.5 (0x3C), element multipliers 1 and 0.6666667 (slightly above 2/3), and every error term is
// exact: val = (code * scale * amax) / (6 * e4m3_max) = code * scale.
namespace {
// [rows, 32]: the first 16 columns hold `rows16` (each padded with zeros to 16), the second block
// of row 0 holds the tensor amax `amax` (its own block: both candidates are 448, a tie, so 6).
std::vector<float> four_over_six_case(const std::vector<std::vector<float>>& rows16, int64_t rows, float amax) {
  std::vector<float> x(static_cast<size_t>(rows * 32), 0.0f);
  for (size_t r = 0; r < rows16.size(); ++r)
    for (size_t k = 0; k < rows16[r].size(); ++k) x[r * 32 + k] = rows16[r][k];
  x[16] = amax;
  return x;
}
uint8_t code_at(const QuantizedTensor& q, int64_t r, int64_t c) {
  const uint8_t b = q.codes[static_cast<size_t>((r * q.cols + c) / 2)];
  return (c & 1) ? b >> 4 : b & 0xF;
}
}  // namespace

TEST(FourOverSix, HandWorkedBlockErrorsMaeVsMse) {
  // x = [6, 5, 1, 1, 1, 0...]. map6 (scale 1): 6 -> 6, 5 -> 4 (the tie goes to even), 1 -> 1:
  //   errors 0, 1, 0, 0, 0: MAE 1, MSE 1.
  // map4 (scale 1.5, x * 0.6666667): 6 -> 4 (= 6), 5 -> 3.33 -> 3 (= 4.5), 1 -> 0.67 -> 0.5 (= 0.75):
  //   errors 0, 0.5, 0.25, 0.25, 0.25: MAE 1.25, MSE 0.4375.
  // MAE keeps 6 (1 < 1.25), MSE takes 4 (0.4375 < 1).
  const auto x = four_over_six_case({{6, 5, 1, 1, 1}}, 1, 2688.0f);
  const auto g = ref::nvfp4_global_scale(2688.0f, 2688.0f);
  ASSERT_EQ(g.encode, 1.0f);
  const auto c = ref::four_over_six_candidates(x.data(), 6.0f, g, FourOverSixError::mae, Rounding::nearest, 0, 0);
  EXPECT_EQ(c.scales.map6, 0x38);
  EXPECT_EQ(c.scales.map4, 0x3C);
  EXPECT_EQ(c.error6, 1.0f);
  EXPECT_EQ(c.error4, 1.25f);
  EXPECT_EQ(ref::four_over_six_error(x.data(), c.codes6, 0x38, g, FourOverSixError::mse), 1.0f);
  EXPECT_EQ(ref::four_over_six_error(x.data(), c.codes4, 0x3C, g, FourOverSixError::mse), 0.4375f);
  const uint8_t codes4[5] = {6, 5, 1, 1, 1}, codes6[5] = {7, 6, 2, 2, 2};
  for (int k = 0; k < 5; ++k) {
    EXPECT_EQ(c.codes4[k], codes4[k]) << k;
    EXPECT_EQ(c.codes6[k], codes6[k]) << k;
  }
  auto mae = ref::quantize(x, 1, 32, {.four_over_six = true});
  auto mse = ref::quantize(x, 1, 32, {.four_over_six = true, .four_over_six_error = FourOverSixError::mse});
  EXPECT_EQ(mae.scales[0], 0x38);
  EXPECT_EQ(mse.scales[0], 0x3C);
  for (int k = 0; k < 5; ++k) {
    EXPECT_EQ(code_at(mae, 0, k), codes6[k]) << k;
    EXPECT_EQ(code_at(mse, 0, k), codes4[k]) << k;
  }
  EXPECT_EQ(mae.scales[1], 0x7E);  // the amax block
}

TEST(FourOverSix, TiesKeepSix) {
  // [6, 3]: both candidates are exact (3 * 0.6666667 -> 2, times 1.5 = 3): errors 0 and 0, so 6.
  const auto x = four_over_six_case({{6, 3}}, 1, 2688.0f);
  for (FourOverSixError e : {FourOverSixError::mae, FourOverSixError::mse}) {
    auto q = ref::quantize(x, 1, 32, {.four_over_six = true, .four_over_six_error = e});
    EXPECT_EQ(q.scales[0], 0x38);
    EXPECT_EQ(code_at(q, 0, 1), 5);  // 3
  }
  // [6, 4.5]: map6 errs 0.5 (4.5 -> 4), map4 is exact (4.5 -> 3 at scale 1.5): 4.
  auto q = ref::quantize(four_over_six_case({{6, 4.5f}}, 1, 2688.0f), 1, 32, {.four_over_six = true});
  EXPECT_EQ(q.scales[0], 0x3C);
}

TEST(FourOverSix, TileChoosesOnceFromTheSummedRowErrors) {
  // A 16x16 tile (amax 6) whose rows, chosen one by one, would disagree:
  //   [6, 4.5]  map6 error 0.5, map4 error 0     (alone: 4)
  //   [6, 1]    map6 error 0,   map4 error 0.25  (alone: 6; 1 -> 0.67 -> 0.5, times 1.5 = 0.75)
  // The other 14 rows are zero (error 0 both ways). MAE sums: map6 0.5, map4 0.25 -> the whole
  // tile takes 4. With a second [6, 1] row: 0.5 vs 0.5, a tie -> 6. With a third: 0.5 vs 0.75 -> 6.
  struct Case {
    int ones_rows;
    uint8_t want;
  };
  for (const Case c : {Case{1, 0x3C}, Case{2, 0x38}, Case{3, 0x38}}) {
    SCOPED_TRACE(c.ones_rows);
    std::vector<std::vector<float>> rows = {{6, 4.5f}};
    for (int i = 0; i < c.ones_rows; ++i) rows.push_back({6, 1});
    const auto x = four_over_six_case(rows, 16, 2688.0f);
    const QuantOptions o{.tile_16x16 = true, .four_over_six = true};
    auto q = ref::quantize(x, 16, 32, o);
    for (int r = 0; r < 16; ++r) EXPECT_EQ(q.scales[r * 2], c.want) << "row " << r;  // one scale for the tile
    const bool map4 = c.want == 0x3C;
    EXPECT_EQ(code_at(q, 0, 1), map4 ? 5 : 6);  // 4.5: 3 * 1.5, or 4
    EXPECT_EQ(code_at(q, 1, 1), map4 ? 1 : 2);  // 1: 0.5 * 1.5, or 1
    // Row by row (1x16 blocks) the rows do disagree.
    auto rowwise = ref::quantize(x, 16, 32, {.four_over_six = true});
    EXPECT_EQ(rowwise.scales[0], 0x3C);
    EXPECT_EQ(rowwise.scales[2], 0x38);
    // The column-wise copy is the exact transpose.
    auto t = ref::quantize_transposed(x, 16, 32, o);
    for (int64_t r = 0; r < 16; ++r)
      for (int64_t k = 0; k < 32; ++k) {
        ASSERT_EQ(code_at(q, r, k), code_at(t, k, r));
        ASSERT_EQ(q.scales[r * 2 + k / 16], t.scales[k * 1 + r / 16]);
      }
  }
}

TEST(FourOverSix, TileErrorTreeOrder) {
  // TE's _sum_4over6_2d_error adds the 16 row errors as a tree, not one after the other. With
  // r = [1, 2^-24 x 15]: sequentially every 2^-24 is lost against 1 (1 + 2^-24 ties to 1). In the
  // tree, a_0 = r_0 + r_8 = 1, a_1..7 = 2^-23; b_0 = a_0 + a_4 = 1 + 2^-23, b_1..3 = 2^-22;
  // c_0 = b_0 + b_2 = 1 + 3 * 2^-23, c_1 = b_1 + b_3 = 2^-21; c_0 + c_1 = 1 + 7 * 2^-23, all exact.
  float r[16] = {};
  r[0] = 1.0f;
  for (int i = 1; i < 16; ++i) r[i] = std::ldexp(1.0f, -24);
  float sequential = 0.0f;
  for (float v : r) sequential += v;
  EXPECT_EQ(sequential, 1.0f);
  EXPECT_EQ(ref::four_over_six_tile_error(r), 1.0f + 7.0f * std::ldexp(1.0f, -23));
}

TEST(FourOverSix, E4m3CeilingSetsTheNumerator) {
  // The same hand-worked block [6, 5, 1, 1, 1] in a tensor with amax 1536: with ceiling 256,
  // S_enc = 1536 / 1536 = 1 and MSE picks map4 as above.
  const auto x = four_over_six_case({{6, 5, 1, 1, 1}}, 1, 1536.0f);
  auto q256 = ref::quantize(x, 1, 32,
                            {.four_over_six = true, .four_over_six_error = FourOverSixError::mse, .four_over_six_e4m3_max = 256});
  EXPECT_EQ(q256.decode_scale, 1.0f);
  EXPECT_EQ(q256.four_over_six_e4m3_max, 256);
  EXPECT_EQ(q256.scales[0], 0x3C);
  // The amax block: (1536 / 6) * 1 = 256 -> 0x78 (map6, exact: error 0 on 1536) vs 384 -> 0x7C
  // (1536 * (1/384) = 4, exact too): a tie, so 6.
  EXPECT_EQ(q256.scales[1], 0x78);
  // With TE's default ceiling 448 the same tensor has S_enc = 2688 / 1536 = 1.75: different bytes.
  auto q448 = ref::quantize(x, 1, 32, {.four_over_six = true, .four_over_six_error = FourOverSixError::mse});
  EXPECT_EQ(q448.decode_scale, 1.0f / 1.75f);
  EXPECT_EQ(q448.scales[1], 0x7E);  // (1536 / 6) * 1.75 = 448
  EXPECT_NE(q448.scales[0], q256.scales[0]);
  // Without four_over_six the ceiling is ignored: always 2688.
  auto plain = ref::quantize(x, 1, 32, {.four_over_six_e4m3_max = 256});
  EXPECT_EQ(plain.decode_scale, 1.0f / 1.75f);
  EXPECT_EQ(plain.four_over_six_e4m3_max, 448);
  // Dequantized values use the tensor's own numerator.
  std::vector<float> d(32);
  ref::dequantize(q256, d);
  EXPECT_EQ(d[0], 6.0f);
  EXPECT_EQ(d[1], 4.5f);
  EXPECT_EQ(d[16], 1536.0f);
}

TEST(FourOverSix, ScalesFollowTeOrderOfOperations) {
  // amax 96, block amax 36 (spec section 3's example): the plain chain's b * (S_enc * (1/6)) gives
  // 0x73, TE's Four Over Six base (b / 6) * S_enc = 6 * 28 = 168 exactly, a tie -> 160 (0x72);
  // map4 = 252 -> 256 (0x78).
  const auto g = ref::nvfp4_global_scale(96.0f, 2688.0f);
  const auto s = ref::four_over_six_scales(36.0f, g);
  EXPECT_EQ(s.map6, 0x72);
  EXPECT_EQ(s.map4, 0x78);
  // Both clamp to 448 (0x7E) for a block at the tensor amax: 448 and 672.
  const auto top = ref::four_over_six_scales(96.0f, g);
  EXPECT_EQ(top.map6, 0x7E);
  EXPECT_EQ(top.map4, 0x7E);
}

TEST(FourOverSix, TilesHaveOneScaleAndTheirTransposeIsExact) {
  // Heavy-tailed tiles (6 wins) and tiles of magnitudes in [0.5, 1] (4's grid point 0.75 of the
  // tile max sits in the middle there, so 4 often wins), in a checkerboard.
  std::mt19937 rng(21);
  std::student_t_distribution<float> heavy(2.0f);
  std::uniform_real_distribution<float> upper(0.5f, 1.0f);
  const int64_t rows = 48, cols = 80;
  std::vector<float> x(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      x[r * cols + c] = (r / 16 + c / 16) % 2 ? heavy(rng) : upper(rng) * (rng() & 1 ? 1.0f : -1.0f);
  for (FourOverSixError e : {FourOverSixError::mae, FourOverSixError::mse})
    for (int ceiling : {448, 256})
      for (Rounding rounding : {Rounding::nearest, Rounding::stochastic}) {
        const QuantOptions o{.tile_16x16 = true, .rounding = rounding, .seed = 5, .offset = 3, .four_over_six = true,
                             .four_over_six_error = e, .four_over_six_e4m3_max = ceiling};
        auto q = ref::quantize(x, rows, cols, o);
        auto t = ref::quantize_transposed(x, rows, cols, o);
        int map4_tiles = 0;
        for (int64_t tr = 0; tr < rows / 16; ++tr)
          for (int64_t tc = 0; tc < cols / 16; ++tc) {
            const uint8_t s = q.scales[(tr * 16) * (cols / 16) + tc];
            for (int r = 0; r < 16; ++r) ASSERT_EQ(q.scales[(tr * 16 + r) * (cols / 16) + tc], s);
            // Is it the map4 byte of the tile's amax?
            float b = 0.0f;
            for (int r = 0; r < 16; ++r)
              for (int k = 0; k < 16; ++k) b = std::max(b, std::fabs(x[(tr * 16 + r) * cols + tc * 16 + k]));
            const auto both = ref::four_over_six_scales(b, ref::nvfp4_global_scale(q.amax, nvfp4_global_numerator(o)));
            ASSERT_TRUE(s == both.map6 || s == both.map4);
            map4_tiles += s == both.map4 && both.map4 != both.map6;
          }
        EXPECT_GT(map4_tiles, 0);  // the test sees both choices
        EXPECT_LT(map4_tiles, (rows / 16) * (cols / 16));
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) {
            ASSERT_EQ(code_at(q, r, c), code_at(t, c, r));
            ASSERT_EQ(q.scales[r * (cols / 16) + c / 16], t.scales[c * (rows / 16) + r / 16]);
          }
        std::vector<float> dq(x.size()), dt(x.size());
        ref::dequantize(q, dq);
        ref::dequantize(t, dt);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(dq[r * cols + c], dt[c * rows + r]);
      }
}

TEST(FourOverSix, RefusesOtherCeilings) {
  std::vector<float> x(32, 1.0f);
  for (int bad : {0, 255, 300, 447, 449, 512}) {
    try {
      ref::quantize(x, 1, 32, {.four_over_six = true, .four_over_six_e4m3_max = bad});
      FAIL() << bad;
    } catch (const UsageError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(std::to_string(bad)), std::string::npos) << m;
      EXPECT_NE(m.find("448"), std::string::npos) << m;
      EXPECT_NE(m.find("256"), std::string::npos) << m;
    }
  }
  EXPECT_THROW(parse_four_over_six_e4m3_max("300", "--x"), UsageError);
  EXPECT_EQ(parse_four_over_six_e4m3_max("256", "--x"), 256);
  EXPECT_EQ(parse_four_over_six_error("mse", "--x"), FourOverSixError::mse);
  try {
    parse_four_over_six_error("rmse", "nvfp4.four_over_six_error");
    FAIL();
  } catch (const UsageError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("nvfp4.four_over_six_error 'rmse'"), std::string::npos) << m;
    EXPECT_NE(m.find("mae"), std::string::npos) << m;
    EXPECT_NE(m.find("mse"), std::string::npos) << m;
  }
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

// Row-scaled NVFP4 (spec section 4, TE's row_scaled_nvfp4): each row is section 3's chain with the
// row's own amax, i.e. exactly the per-tensor quantization of that row as a tensor of its own.
TEST(RowScaled, EachRowIsThePerTensorQuantizationOfThatRowAlone) {
  std::mt19937_64 rng(4242);
  std::normal_distribution<float> normal;
  const int64_t rows = 9, cols = 64;
  std::vector<float> x(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) x[r * cols + c] = r == 4 ? 0.0f : normal(rng) * std::exp2(float(8 * r - 30));
  const QuantizedTensor q = ref::quantize(x, rows, cols, QuantOptions{.row_scaled = true});
  ASSERT_TRUE(q.row_scaled);
  ASSERT_EQ(q.row_amax.size(), size_t(rows));
  float tensor_amax = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    SCOPED_TRACE("row " + std::to_string(r));
    const std::vector<float> row(x.begin() + r * cols, x.begin() + (r + 1) * cols);
    const QuantizedTensor alone = ref::quantize(row, 1, cols, {});
    EXPECT_EQ(std::vector<uint8_t>(q.codes.begin() + r * cols / 2, q.codes.begin() + (r + 1) * cols / 2), alone.codes);
    EXPECT_EQ(std::vector<uint8_t>(q.scales.begin() + r * cols / 16, q.scales.begin() + (r + 1) * cols / 16), alone.scales);
    EXPECT_EQ(std::bit_cast<uint32_t>(q.row_amax[r]), std::bit_cast<uint32_t>(alone.amax));
    EXPECT_EQ(std::bit_cast<uint32_t>(q.row_decode_scale[r]), std::bit_cast<uint32_t>(alone.decode_scale));
    tensor_amax = std::max(tensor_amax, alone.amax);
  }
  EXPECT_EQ(q.amax, tensor_amax);
  // The all-zero row: amax 0, S_enc 1 (section 3), every byte 0, dequantized to 0 (never NaN).
  EXPECT_EQ(q.row_amax[4], 0.0f);
  EXPECT_EQ(q.row_decode_scale[4], 1.0f);
  std::vector<float> back(x.size());
  ref::dequantize(q, back);
  for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(back[4 * cols + c], 0.0f);
  // Dequantization applies each row's own factor: row r is the per-tensor dequantization of row r.
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> row(x.begin() + r * cols, x.begin() + (r + 1) * cols);
    std::vector<float> alone_back(cols);
    ref::dequantize(ref::quantize(row, 1, cols, {}), alone_back);
    for (int64_t c = 0; c < cols; ++c)
      ASSERT_EQ(std::bit_cast<uint32_t>(back[r * cols + c]), std::bit_cast<uint32_t>(alone_back[c])) << r << "," << c;
  }
}

TEST(RowScaled, TransposedCopyHasOneScalePerColumnOfX) {
  // wgrad's X^T under TE's row_scaled_activation: its rows are the columns of X.
  std::mt19937_64 rng(4243);
  std::normal_distribution<float> normal;
  const int64_t rows = 32, cols = 5 * 16;
  std::vector<float> x(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) x[r * cols + c] = normal(rng) * std::exp2(float(c % 7 * 5 - 15));
  const QuantizedTensor t = ref::quantize_transposed(x, rows, cols, QuantOptions{.row_scaled = true});
  ASSERT_EQ(t.rows, cols);
  ASSERT_EQ(t.row_amax.size(), size_t(cols));
  for (int64_t c = 0; c < cols; ++c) {
    float column_amax = 0.0f;
    for (int64_t r = 0; r < rows; ++r) column_amax = std::max(column_amax, std::fabs(x[r * cols + c]));
    EXPECT_EQ(t.row_amax[c], column_amax) << c;
  }
}

TEST(RowScaled, RefusesWhatTransformerEngineRefuses) {
  std::vector<float> x(32 * 32, 1.0f);
  for (QuantOptions o : {QuantOptions{.rht = true}, QuantOptions{.rounding = Rounding::stochastic},
                         QuantOptions{.tile_16x16 = true}, QuantOptions{.four_over_six = true},
                         QuantOptions{.format = Format::mxfp4}, QuantOptions{.format = Format::fp8_e4m3}}) {
    o.row_scaled = true;
    try {
      ref::quantize(x, 32, 32, o);
      ADD_FAILURE() << "accepted row-scaled " << to_string(o.format);
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("row-scaled"), std::string::npos) << e.what();
    }
  }
}
