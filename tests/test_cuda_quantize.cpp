// GPU quantization kernels against the scalar reference, bit for bit (RN and Philox SR), on fresh
// random inputs. Skips with the reason when no GPU is present.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "format/codecs.h"
#include "format/quantize.h"
#include "support/random.h"

#if defined(NIBBLE_HAVE_CUDA)
#include "kernels/cuda/device_math.h"
#include "kernels/cuda/quantize.h"

using namespace nibble;

namespace {

// Normal values with outliers, tiny values and zeros.
std::vector<float> random_tensor(int64_t n, uint32_t seed, float scale = 3.0f) {
  return nibble_test::floats_with_outliers(static_cast<size_t>(n), seed, scale);
}

::testing::AssertionResult same_quantization(const QuantizedTensor& got, const QuantizedTensor& want) {
  if (got.rows != want.rows || got.cols != want.cols)
    return ::testing::AssertionFailure() << "shape [" << got.rows << ", " << got.cols << "] vs [" << want.rows << ", "
                                         << want.cols << "]";
  if (got.four_over_six != want.four_over_six || got.four_over_six_error != want.four_over_six_error ||
      got.four_over_six_e4m3_max != want.four_over_six_e4m3_max)
    return ::testing::AssertionFailure() << "Four Over Six fields differ";
  if (std::bit_cast<uint32_t>(got.amax) != std::bit_cast<uint32_t>(want.amax))
    return ::testing::AssertionFailure() << "amax " << got.amax << " vs " << want.amax;
  if (std::bit_cast<uint32_t>(got.decode_scale) != std::bit_cast<uint32_t>(want.decode_scale))
    return ::testing::AssertionFailure() << "decode scale " << got.decode_scale << " vs " << want.decode_scale;
  if (got.scales.size() != want.scales.size() || got.codes.size() != want.codes.size())
    return ::testing::AssertionFailure() << "buffer sizes differ";
  for (size_t i = 0; i < got.scales.size(); ++i)
    if (got.scales[i] != want.scales[i])
      return ::testing::AssertionFailure() << "scale " << i << ": 0x" << std::hex << int(got.scales[i]) << " vs 0x"
                                           << int(want.scales[i]);
  for (size_t i = 0; i < got.codes.size(); ++i)
    if (got.codes[i] != want.codes[i])
      return ::testing::AssertionFailure() << "code byte " << i << ": 0x" << std::hex << int(got.codes[i]) << " vs 0x"
                                           << int(want.codes[i]);
  return ::testing::AssertionSuccess();
}

class CudaQuantize : public ::testing::Test {
 protected:
  void SetUp() override {
    const cuda::DeviceAvailability a = cuda::probe_devices();
    if (!a.available) GTEST_SKIP() << "skipping GPU test: " << a.reason;
  }
  cuda::Context& ctx() { return cuda::default_context(); }
  cuda::DeviceBuffer<float> upload(const std::vector<float>& x) {
    return cuda::DeviceBuffer<float>::from_host(x, ctx().stream());
  }
};

QuantOptions nvfp4_options(bool tile, Rounding r, bool rht, bool four_over_six, uint64_t seed = 0, uint64_t offset = 0) {
  QuantOptions o;
  o.tile_16x16 = tile;
  o.rounding = r;
  o.rht = rht;
  o.four_over_six = four_over_six;
  o.seed = seed;
  o.offset = offset;
  return o;
}

}  // namespace

TEST_F(CudaQuantize, Nvfp4RowwiseMatchesReference) {
  struct Case {
    int64_t rows, cols;
    QuantOptions opt;
  };
  const Case cases[] = {
      {1, 16, nvfp4_options(false, Rounding::nearest, false, false)},
      {37, 144, nvfp4_options(false, Rounding::nearest, false, false)},  // rows not a multiple of 16
      {256, 1024, nvfp4_options(false, Rounding::nearest, false, false)},
      {64, 160, nvfp4_options(true, Rounding::nearest, false, false)},
      {40, 64, nvfp4_options(true, Rounding::nearest, false, false)},    // partial 16x16 tiles
      {96, 256, nvfp4_options(false, Rounding::stochastic, false, false, 1234, 7)},
      {64, 128, nvfp4_options(false, Rounding::stochastic, true, false, 99, 0)},
      {48, 96, nvfp4_options(false, Rounding::nearest, true, false)},
      {32, 512, nvfp4_options(false, Rounding::nearest, false, true)},
      {32, 64, nvfp4_options(true, Rounding::stochastic, false, true, 5, 1)},
  };
  uint32_t seed = 10;
  for (const Case& c : cases) {
    const auto x = random_tensor(c.rows * c.cols, seed++);
    const auto dx = upload(x);
    const QuantizedTensor got = cuda::to_host(cuda::quantize(dx.data(), c.rows, c.cols, c.opt, ctx()));
    EXPECT_TRUE(same_quantization(got, ref::quantize(x, c.rows, c.cols, c.opt)))
        << c.rows << "x" << c.cols << " tile=" << c.opt.tile_16x16 << " sr=" << (c.opt.rounding == Rounding::stochastic)
        << " rht=" << c.opt.rht << " 4/6=" << c.opt.four_over_six;
  }
}

TEST_F(CudaQuantize, FourOverSixEveryOptionMatchesReference) {
  // TE's rule on the device: per 1x16 block, or once per 16x16 tile (the shuffle-butterfly sum of
  // the row errors), both error measures and both E4M3 ceilings; the fused transposed copy of the
  // tiles stays the exact transpose.
  uint32_t seed = 40;
  for (FourOverSixError e : {FourOverSixError::mae, FourOverSixError::mse})
    for (int ceiling : {448, 256})
      for (bool tile : {false, true})
        for (Rounding r : {Rounding::nearest, Rounding::stochastic}) {
          QuantOptions o = nvfp4_options(tile, r, false, true, 77, 5);
          o.four_over_six_error = e;
          o.four_over_six_e4m3_max = ceiling;
          const int64_t rows = 80, cols = 160;
          const auto x = random_tensor(rows * cols, seed++);
          const auto dx = upload(x);
          SCOPED_TRACE(std::string(to_string(e)) + " " + std::to_string(ceiling) + (tile ? " 16x16" : " 1x16") +
                       (r == Rounding::stochastic ? " sr" : " rn"));
          EXPECT_TRUE(same_quantization(cuda::to_host(cuda::quantize(dx.data(), rows, cols, o, ctx())),
                                        ref::quantize(x, rows, cols, o)));
          const auto short_rows = random_tensor(37 * cols, seed++);  // a short last tile
          const auto ds = upload(short_rows);
          EXPECT_TRUE(same_quantization(cuda::to_host(cuda::quantize(ds.data(), 37, cols, o, ctx())),
                                        ref::quantize(short_rows, 37, cols, o)));
          if (tile) {
            cuda::QuantizedPair pair = cuda::quantize_both(dx.data(), rows, cols, o, o, ctx());
            EXPECT_TRUE(same_quantization(cuda::to_host(pair.rowwise), ref::quantize(x, rows, cols, o)));
            EXPECT_TRUE(same_quantization(cuda::to_host(pair.columnwise), ref::quantize_transposed(x, rows, cols, o)));
          } else {
            EXPECT_TRUE(same_quantization(cuda::to_host(cuda::quantize_transposed(dx.data(), rows, cols, o, ctx())),
                                          ref::quantize_transposed(x, rows, cols, o)));
          }
        }
}

TEST_F(CudaQuantize, Bf16InputMatchesReference) {
  const int64_t rows = 64, cols = 256;
  const auto f = random_tensor(rows * cols, 3);
  std::vector<bf16> x(f.size());
  for (size_t i = 0; i < f.size(); ++i) x[i] = bf16_from_float_rn(f[i]);
  const auto dx = cuda::DeviceBuffer<bf16>::from_host(x, ctx().stream());
  for (const QuantOptions& o : {nvfp4_options(false, Rounding::nearest, false, false),
                                nvfp4_options(true, Rounding::nearest, false, false),
                                nvfp4_options(false, Rounding::stochastic, true, false, 8, 0)}) {
    const QuantizedTensor got = cuda::to_host(cuda::quantize(dx.data(), rows, cols, o, ctx()));
    EXPECT_TRUE(same_quantization(got, ref::quantize(std::span<const bf16>(x), rows, cols, o)));
  }
}

TEST_F(CudaQuantize, FusedTransposedCopyOf16x16TilesIsTheExactTranspose) {
  const int64_t rows = 128, cols = 96;
  const auto x = random_tensor(rows * cols, 21);
  const auto dx = upload(x);
  const QuantOptions o = nvfp4_options(true, Rounding::nearest, false, false);
  cuda::QuantizedPair pair = cuda::quantize_both(dx.data(), rows, cols, o, o, ctx());
  EXPECT_TRUE(same_quantization(cuda::to_host(pair.rowwise), ref::quantize(x, rows, cols, o)));
  EXPECT_TRUE(same_quantization(cuda::to_host(pair.columnwise), ref::quantize_transposed(x, rows, cols, o)));
}

TEST_F(CudaQuantize, FusedTransposedCopyForWgradRhtAndSr) {
  // The wgrad operands: row-wise 1x16 RN for fprop, column-wise (along tokens) with RHT and SR.
  const int64_t rows = 256, cols = 64;
  const auto x = random_tensor(rows * cols, 22);
  const auto dx = upload(x);
  const QuantOptions row = nvfp4_options(false, Rounding::nearest, false, false);
  for (const QuantOptions& col : {nvfp4_options(false, Rounding::stochastic, true, false, 77, 1000),
                                  nvfp4_options(false, Rounding::nearest, true, false),
                                  nvfp4_options(false, Rounding::nearest, false, false)}) {
    cuda::QuantizedPair pair = cuda::quantize_both(dx.data(), rows, cols, row, col, ctx());
    EXPECT_TRUE(same_quantization(cuda::to_host(pair.rowwise), ref::quantize(x, rows, cols, row)));
    EXPECT_TRUE(same_quantization(cuda::to_host(pair.columnwise), ref::quantize_transposed(x, rows, cols, col)))
        << "rht=" << col.rht << " sr=" << (col.rounding == Rounding::stochastic);
  }
}

TEST_F(CudaQuantize, RowScaledRowwiseAndTransposedMatchReference) {
  // TE's row-scaled NVFP4 (X and X^T of row_scaled_activation): rows of very different magnitudes,
  // one all zero; codes, scales and the per-row amax and S_dec of the reference, bit for bit.
  const int64_t rows = 64, cols = 96;
  auto x = random_tensor(rows * cols, 25);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) x[r * cols + c] *= r == 5 ? 0.0f : std::exp2(static_cast<float>(r % 13 * 6 - 36));
  const auto dx = upload(x);
  const QuantOptions o{.format = Format::nvfp4, .row_scaled = true};
  auto same_rows = [](const QuantizedTensor& got, const QuantizedTensor& want) {
    EXPECT_TRUE(same_quantization(got, want));
    ASSERT_EQ(got.row_amax.size(), want.row_amax.size());
    for (size_t r = 0; r < want.row_amax.size(); ++r) {
      EXPECT_EQ(std::bit_cast<uint32_t>(got.row_amax[r]), std::bit_cast<uint32_t>(want.row_amax[r])) << r;
      EXPECT_EQ(std::bit_cast<uint32_t>(got.row_decode_scale[r]), std::bit_cast<uint32_t>(want.row_decode_scale[r])) << r;
    }
  };
  same_rows(cuda::to_host(cuda::quantize(dx.data(), rows, cols, o, ctx())), ref::quantize(x, rows, cols, o));
  same_rows(cuda::to_host(cuda::quantize_transposed(dx.data(), rows, cols, o, ctx())),
            ref::quantize_transposed(x, rows, cols, o));
  const cuda::QuantizedPair pair = cuda::quantize_both(dx.data(), rows, cols, o, o, ctx());
  same_rows(cuda::to_host(pair.rowwise), ref::quantize(x, rows, cols, o));
  same_rows(cuda::to_host(pair.columnwise), ref::quantize_transposed(x, rows, cols, o));
  std::vector<float> want(x.size());
  ref::dequantize(ref::quantize(x, rows, cols, o), want);
  cuda::DeviceBuffer<float> out(x.size(), ctx().stream());
  cuda::dequantize(cuda::quantize(dx.data(), rows, cols, o, ctx()), out.data(), ctx());
  const std::vector<float> got = out.download();
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i])) << i;
  QuantOptions rht = o;
  rht.rht = true;
  EXPECT_THROW(cuda::quantize(dx.data(), rows, cols, rht, ctx()), UsageError);
}

TEST_F(CudaQuantize, GivenAmaxSkipsThePassAndGivesTheSameBits) {
  const int64_t rows = 64, cols = 128;
  const auto x = random_tensor(rows * cols, 24);
  const auto dx = upload(x);
  const QuantOptions row = nvfp4_options(false, Rounding::nearest, false, false);
  const QuantOptions col = nvfp4_options(false, Rounding::stochastic, true, false, 5, 0);
  const cuda::DeviceQuantized first = cuda::quantize(dx.data(), rows, cols, row, ctx());
  cuda::KernelOptions given;
  given.given_amax = first.globals.data();
  EXPECT_TRUE(same_quantization(cuda::to_host(cuda::quantize(dx.data(), rows, cols, row, ctx(), given)),
                                cuda::to_host(first)));
  const cuda::QuantizedPair pair = cuda::quantize_both(dx.data(), rows, cols, row, col, ctx());
  given.given_amax = pair.rowwise.globals.data();
  given.given_column_amax = pair.columnwise.globals.data();
  const cuda::QuantizedPair again = cuda::quantize_both(dx.data(), rows, cols, row, col, ctx(), given);
  EXPECT_TRUE(same_quantization(cuda::to_host(again.rowwise), cuda::to_host(pair.rowwise)));
  EXPECT_TRUE(same_quantization(cuda::to_host(again.columnwise), cuda::to_host(pair.columnwise)));
}

TEST_F(CudaQuantize, QuantizeTransposedEveryFormat) {
  const int64_t rows = 64, cols = 96;
  const auto x = random_tensor(rows * cols, 23);
  const auto dx = upload(x);
  std::vector<QuantOptions> options = {nvfp4_options(false, Rounding::nearest, false, false),
                                       nvfp4_options(true, Rounding::nearest, false, false)};
  for (Format f : {Format::mxfp4, Format::mxfp8, Format::fp8_e4m3, Format::fp8_e5m2}) {
    QuantOptions o;
    o.format = f;
    options.push_back(o);
  }
  for (const QuantOptions& o : options) {
    const QuantizedTensor got = cuda::to_host(cuda::quantize_transposed(dx.data(), rows, cols, o, ctx()));
    EXPECT_TRUE(same_quantization(got, ref::quantize_transposed(x, rows, cols, o))) << to_string(o.format);
  }
}

TEST_F(CudaQuantize, MxAndFp8MatchReference) {
  const int64_t rows = 48, cols = 320;
  const auto x = random_tensor(rows * cols, 31);
  const auto dx = upload(x);
  for (Format f : {Format::mxfp4, Format::mxfp8, Format::fp8_e4m3, Format::fp8_e5m2}) {
    QuantOptions o;
    o.format = f;
    EXPECT_TRUE(same_quantization(cuda::to_host(cuda::quantize(dx.data(), rows, cols, o, ctx())),
                                  ref::quantize(x, rows, cols, o)))
        << to_string(f);
  }
  QuantOptions sr;
  sr.format = Format::mxfp4;
  sr.rounding = Rounding::stochastic;
  sr.seed = 3;
  EXPECT_TRUE(same_quantization(cuda::to_host(cuda::quantize(dx.data(), rows, cols, sr, ctx())),
                                ref::quantize(x, rows, cols, sr)));
}

TEST_F(CudaQuantize, DequantizeMatchesReferenceBitForBit) {
  const int64_t rows = 32, cols = 128;
  const auto x = random_tensor(rows * cols, 41);
  const auto dx = upload(x);
  std::vector<QuantOptions> options = {nvfp4_options(false, Rounding::nearest, false, false),
                                       nvfp4_options(true, Rounding::nearest, false, true),
                                       nvfp4_options(false, Rounding::stochastic, true, false, 1, 0)};
  for (Format f : {Format::mxfp4, Format::mxfp8, Format::fp8_e4m3, Format::fp8_e5m2}) {
    QuantOptions o;
    o.format = f;
    options.push_back(o);
  }
  for (const QuantOptions& o : options) {
    cuda::DeviceQuantized q = cuda::quantize(dx.data(), rows, cols, o, ctx());
    cuda::DeviceBuffer<float> out(static_cast<size_t>(rows * cols), ctx().stream());
    cuda::dequantize(q, out.data(), ctx());
    const std::vector<float> got = out.download();
    std::vector<float> want(got.size());
    ref::dequantize(cuda::to_host(q), want);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
          << to_string(o.format) << " rht=" << o.rht << " at " << i << ": " << got[i] << " vs " << want[i];
  }
}

TEST_F(CudaQuantize, Bf16BlockScaledDecodeIsExact) {
  const int64_t rows = 32, cols = 64;
  const auto x = random_tensor(rows * cols, 42);
  const auto dx = upload(x);
  for (bool tile : {false, true}) {
    cuda::DeviceQuantized q = cuda::quantize(dx.data(), rows, cols, nvfp4_options(tile, Rounding::nearest, false, false), ctx());
    cuda::DeviceBuffer<uint16_t> out(static_cast<size_t>(rows * cols), ctx().stream());
    cuda::dequantize_block_scaled_bf16(q, out.data(), ctx());
    const std::vector<uint16_t> got = out.download();
    const QuantizedTensor h = cuda::to_host(q);
    for (int64_t i = 0; i < rows * cols; ++i) {
      const uint8_t code = (h.codes[i / 2] >> (4 * (i & 1))) & 0xF;
      const float exact = e2m1_decode(code) * e4m3_decode(h.scales[i / 16]);  // <= 6 significant bits
      ASSERT_EQ(bf16_to_float(bf16{got[i]}), exact) << i;
    }
  }
}

TEST_F(CudaQuantize, SwizzledScalesFollowTheSpecLayout) {
  const int64_t rows = 200, cols = 96;  // 6 scale columns: padding in both directions
  const auto x = random_tensor(rows * cols, 51);
  const auto dx = upload(x);
  cuda::DeviceQuantized q = cuda::quantize(dx.data(), rows, cols, QuantOptions{}, ctx());
  const int64_t sc = q.scale_cols(), total = cuda::dm::swizzled_scale_bytes(rows, sc);
  cuda::DeviceBuffer<uint8_t> out(static_cast<size_t>(total), ctx().stream());
  cuda::swizzle_scales(q, out.data(), ctx());
  const std::vector<uint8_t> got = out.download();
  const QuantizedTensor h = cuda::to_host(q);
  std::vector<uint8_t> want(static_cast<size_t>(total), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < sc; ++c) want[cuda::dm::swizzled_scale_offset(r, c, sc)] = h.scales[r * sc + c];
  EXPECT_EQ(got, want);
}

TEST_F(CudaQuantize, AmaxOfALargeTensor) {
  auto x = random_tensor(1 << 20, 61);
  x[777777] = -12345.5f;
  const auto dx = upload(x);
  cuda::DeviceBuffer<float> out(1, ctx().stream());
  cuda::amax(dx.data(), static_cast<int64_t>(x.size()), out.data(), ctx());
  EXPECT_EQ(out.download()[0], 12345.5f);
}

TEST_F(CudaQuantize, NonFiniteInputIsAUsageErrorNamingTheIndex) {
  std::vector<float> x(32 * 64, 1.0f);
  x[5 * 64 + 17] = std::nanf("");
  x[9 * 64 + 3] = INFINITY;
  const auto dx = upload(x);
  try {
    cuda::quantize(dx.data(), 32, 64, QuantOptions{}, ctx());
    FAIL() << "NaN accepted";
  } catch (const NumericalError& e) {  // a UsageError of its own type: non-finite input
    EXPECT_NE(std::string(e.what()).find("[5, 17]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cuda::quantize(dx.data(), 32, 60, QuantOptions{}, ctx()), UsageError);  // 60 % 16 != 0
}

TEST_F(CudaQuantize, Sm100KernelsAgreeWithPortableOnes) {
  const cuda::DeviceInfo& dev = ctx().device();
  if (!cuda::runs_sm100a_kernels(dev.cc_major, dev.cc_minor))
    GTEST_SKIP() << dev.name << " (sm_" << dev.compute_capability() << ") does not run the sm_100a kernels";
  const int64_t rows = 128, cols = 256;
  const auto x = random_tensor(rows * cols, 71);
  const auto dx = upload(x);
  cuda::KernelOptions portable;
  portable.allow_sm100_kernels = false;
  for (const QuantOptions& o : {nvfp4_options(false, Rounding::nearest, false, false),
                                nvfp4_options(true, Rounding::nearest, false, true)}) {
    const QuantizedTensor native = cuda::to_host(cuda::quantize(dx.data(), rows, cols, o, ctx()));
    const QuantizedTensor generic = cuda::to_host(cuda::quantize(dx.data(), rows, cols, o, ctx(), portable));
    EXPECT_TRUE(same_quantization(native, generic));
    EXPECT_TRUE(same_quantization(native, ref::quantize(x, rows, cols, o)));
  }
  // Hardware SR: not the reference's bits, but unbiased: the mean of many draws of a constant
  // approaches the constant, and beats RN's error.
  const int64_t n_rows = 1024, n_cols = 256;
  // Every block is [6, 0.7, 0.7, ...]: scale 448, element multiplier exactly 1, so 0.7 falls
  // between the grid points 0.5 and 1 and only SR can average to it.
  std::vector<float> c(static_cast<size_t>(n_rows * n_cols));
  for (size_t i = 0; i < c.size(); ++i) c[i] = i % 16 == 0 ? 6.0f : 0.7f;
  const auto dc = upload(c);
  cuda::KernelOptions hw;
  hw.hardware_stochastic_rounding = true;
  const QuantOptions sr = nvfp4_options(false, Rounding::stochastic, false, false, 11, 0);
  cuda::DeviceQuantized q = cuda::quantize(dc.data(), n_rows, n_cols, sr, ctx(), hw);
  cuda::DeviceBuffer<float> out(c.size(), ctx().stream());
  cuda::dequantize(q, out.data(), ctx());
  const std::vector<float> d = out.download();
  double mean = 0;
  size_t count = 0;
  for (size_t i = 0; i < d.size(); ++i)
    if (i % 16 != 0) {
      mean += d[i];
      ++count;
    }
  mean /= static_cast<double>(count);
  EXPECT_NEAR(mean, 0.7, 0.01) << "hardware SR looks biased";
}

#else
TEST(CudaQuantize, NotBuilt) { GTEST_SKIP() << "nibble was built without the CUDA backend (NIBBLE_CUDA=OFF or no nvcc)"; }
#endif
