// The quantized-tensor safetensors codec (io/quantized_safetensors.h) on its own: every format
// round-trips field for field through the file's bytes, files written before the Four Over Six keys
// read as they always did, and a damaged or foreign file is refused with a message that names the
// file and the field (the expectations `nibble dequantize` had in tests/test_cli_quantize.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "format/codecs.h"
#include "format/quantize.h"
#include "io/quantized_safetensors.h"
#include "io/safetensors.h"

namespace {

using nibble::BlockShape;
using nibble::Format;
using nibble::FourOverSixError;
using nibble::QuantizedTensor;
using nibble::QuantOptions;
using nibble::Rounding;
using nibble::UsageError;
using nibble::io::DType;
using nibble::io::SafetensorsFile;

std::vector<float> random_matrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (auto& v : x) v = normal(rng);
  return x;
}

// Through the bytes a file holds, as a reader would see them.
SafetensorsFile through_bytes(const SafetensorsFile& f) {
  return nibble::io::parse_safetensors(nibble::io::serialize_safetensors(f), "<memory>");
}

struct Case {
  const char* name;
  QuantOptions options;
  bool transposed;
  nibble::io::NpyDType source;
};

std::vector<Case> cases() {
  auto o = [](Format f) {
    QuantOptions q;
    q.format = f;
    return q;
  };
  QuantOptions tiles = o(Format::nvfp4), rht = o(Format::nvfp4), fos = o(Format::nvfp4), sr = o(Format::nvfp4);
  tiles.tile_16x16 = true;
  rht.rht = true;
  fos.four_over_six = true;
  fos.four_over_six_error = FourOverSixError::mse;
  fos.four_over_six_e4m3_max = 256;
  sr.rounding = Rounding::stochastic;
  sr.seed = 42;
  return {{"nvfp4", o(Format::nvfp4), false, nibble::io::NpyDType::float32},
          {"nvfp4_16x16", tiles, true, nibble::io::NpyDType::float16},
          {"nvfp4_rht", rht, false, nibble::io::NpyDType::float32},
          {"nvfp4_four_over_six", fos, false, nibble::io::NpyDType::float32},
          {"nvfp4_sr", sr, false, nibble::io::NpyDType::float32},
          {"mxfp4", o(Format::mxfp4), false, nibble::io::NpyDType::float32},
          {"mxfp8", o(Format::mxfp8), true, nibble::io::NpyDType::float32},
          {"fp8_e4m3", o(Format::fp8_e4m3), false, nibble::io::NpyDType::float32},
          {"fp8_e5m2", o(Format::fp8_e5m2), false, nibble::io::NpyDType::float16}};
}

TEST(QuantizedSafetensors, EveryFormatRoundTripsFieldForField) {
  const int64_t rows = 16, cols = 64;
  const std::vector<float> x = random_matrix(rows, cols, 3);
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const QuantizedTensor q = nibble::ref::quantize(x, rows, cols, c.options);
    const SafetensorsFile file = through_bytes(nibble::io::quantized_to_safetensors(q, c.options.seed, c.transposed, c.source));
    EXPECT_EQ(file.metadata.at("format"), std::string(nibble::to_string(c.options.format)));
    EXPECT_EQ(file.metadata.at("seed"), std::to_string(c.options.seed));
    EXPECT_EQ(file.metadata.at("transposed"), c.transposed ? "true" : "false");
    EXPECT_EQ(file.metadata.at("source_dtype"), c.source == nibble::io::NpyDType::float16 ? "float16" : "float32");
    EXPECT_EQ(file.metadata.size(), 13u);
    const auto [back, transposed] = nibble::io::quantized_from_safetensors(file, "q.safetensors");
    EXPECT_EQ(transposed, c.transposed);
    EXPECT_EQ(back.format, q.format);
    EXPECT_EQ(back.block, q.block);
    EXPECT_EQ(back.rounding, q.rounding);
    EXPECT_EQ(back.rht, q.rht);
    EXPECT_EQ(back.four_over_six, q.four_over_six);
    EXPECT_EQ(back.four_over_six_error, q.four_over_six_error);
    EXPECT_EQ(back.four_over_six_e4m3_max, q.four_over_six_e4m3_max);
    EXPECT_EQ(back.rows, q.rows);
    EXPECT_EQ(back.cols, q.cols);
    EXPECT_EQ(back.codes, q.codes);
    EXPECT_EQ(back.scales, q.scales);
    EXPECT_EQ(std::memcmp(&back.amax, &q.amax, 4), 0);
    EXPECT_EQ(std::memcmp(&back.decode_scale, &q.decode_scale, 4), 0) << back.decode_scale << " vs " << q.decode_scale;
    std::vector<float> a(static_cast<size_t>(rows * cols)), b(a.size());
    nibble::ref::dequantize(q, a);
    nibble::ref::dequantize(back, b);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
  }
}

TEST(QuantizedSafetensors, BlockNamesMatchEachFormat) {
  EXPECT_EQ(nibble::io::parse_block_name(Format::nvfp4, "1x16"), BlockShape::row_1x16);
  EXPECT_EQ(nibble::io::parse_block_name(Format::nvfp4, "16x16"), BlockShape::tile_16x16);
  EXPECT_EQ(nibble::io::parse_block_name(Format::mxfp4, "1x32"), BlockShape::row_1x32);
  EXPECT_EQ(nibble::io::parse_block_name(Format::mxfp8, "1x32"), BlockShape::row_1x32);
  EXPECT_EQ(nibble::io::parse_block_name(Format::fp8_e5m2, "tensor"), BlockShape::per_tensor);
  EXPECT_FALSE(nibble::io::parse_block_name(Format::nvfp4, "1x32"));
  EXPECT_FALSE(nibble::io::parse_block_name(Format::mxfp4, "16x16"));
  EXPECT_FALSE(nibble::io::parse_block_name(Format::fp8_e4m3, "1x16"));
  EXPECT_EQ(nibble::io::block_names(Format::nvfp4), "1x16 or 16x16");
  EXPECT_EQ(nibble::io::block_names(Format::mxfp8), "1x32");
}

// Files written before four_over_six_error / four_over_six_e4m3_max existed used the fixed global
// numerator 256 * 6: without the keys, four_over_six=true reads as e4m3_max 256 (and the old
// squared-error rule as mse), four_over_six=false as TE's defaults.
TEST(QuantizedSafetensors, FilesWithoutTheFourOverSixKeysReadAsBefore) {
  const std::vector<float> x = random_matrix(16, 64, 21);
  for (const bool four_over_six : {true, false}) {
    QuantOptions o;
    o.four_over_six = four_over_six;
    if (four_over_six) {
      o.four_over_six_error = FourOverSixError::mse;
      o.four_over_six_e4m3_max = 256;
    }
    const QuantizedTensor q = nibble::ref::quantize(x, 16, 64, o);
    SafetensorsFile file = nibble::io::quantized_to_safetensors(q, 0, false, nibble::io::NpyDType::float32);
    file.metadata.erase("four_over_six_error");
    file.metadata.erase("four_over_six_e4m3_max");
    const auto [back, transposed] = nibble::io::quantized_from_safetensors(through_bytes(file), "old.safetensors");
    EXPECT_EQ(back.four_over_six_e4m3_max, four_over_six ? 256 : 448);
    EXPECT_EQ(back.four_over_six_error, four_over_six ? FourOverSixError::mse : FourOverSixError::mae);
    EXPECT_EQ(std::memcmp(&back.decode_scale, &q.decode_scale, 4), 0);
    EXPECT_EQ(back.codes, q.codes);
  }
}

void expect_refused(const SafetensorsFile& f, const std::string& expected) {
  try {
    nibble::io::quantized_from_safetensors(f, "bad.safetensors");
    ADD_FAILURE() << "accepted; expected an error containing '" << expected << "'";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("bad.safetensors: not a valid nibble quantized tensor: ", 0), 0u) << what;
    EXPECT_NE(what.find(expected), std::string::npos) << "message: " << what << "\nexpected to contain: " << expected;
  }
}

SafetensorsFile good_file(Format format) {
  QuantOptions o;
  o.format = format;
  const QuantizedTensor q = nibble::ref::quantize(random_matrix(16, 64, 8), 16, 64, o);
  return nibble::io::quantized_to_safetensors(q, 0, false, nibble::io::NpyDType::float32);
}

TEST(QuantizedSafetensors, RefusesDamagedAndForeignFilesNamingTheField) {
  const SafetensorsFile good = good_file(Format::nvfp4);
  struct Damage {
    std::function<void(SafetensorsFile&)> apply;
    std::string expected;
  };
  const float nan = NAN;
  const std::vector<Damage> damages = {
      {[](auto& f) { f.metadata.erase("format"); }, "the metadata key 'format' is missing"},
      {[](auto& f) { f.metadata["format"] = "int4"; }, "metadata 'format': unknown format 'int4'"},
      {[](auto& f) { f.metadata["block"] = "1x32"; }, "metadata block '1x32' does not fit format nvfp4 (expected 1x16 or 16x16)"},
      {[](auto& f) { f.metadata["rounding"] = "up"; }, "metadata rounding 'up' is neither rn nor sr"},
      {[](auto& f) { f.metadata["rows"] = "15"; }, "tensor 'codes' has shape [16, 32], expected [15, 32]"},
      {[](auto& f) { f.metadata["cols"] = "-64"; }, "metadata 'cols' is '-64', expected a positive integer"},
      {[](auto& f) { f.metadata["cols"] = "24"; }, "cols 24 is not a multiple of the block length 16"},
      {[](auto& f) { f.metadata["rows"] = "4611686018427387904"; }, "rows * cols overflows"},
      {[](auto& f) { f.metadata["rht"] = "yes"; }, "metadata 'rht' is 'yes', expected true or false"},
      {[](auto& f) { f.metadata.erase("transposed"); }, "the metadata key 'transposed' is missing"},
      {[](auto& f) { f.tensors.erase("scales"); }, "the tensor 'scales' is missing"},
      {[](auto& f) { f.tensors["scales"].dtype = DType::U8; }, "tensor 'scales' has dtype U8, expected F8_E4M3"},
      {[](auto& f) { f.tensors["scales"].data[3] = 0x7F; }, "scales[3] = 0x7F is not a valid unsigned E4M3 block scale"},
      {[](auto& f) { f.tensors["scales"].data[5] = 0x80; }, "scales[5] = 0x80 is not a valid unsigned E4M3 block scale"},
      {[&](auto& f) { std::memcpy(f.tensors["amax"].data.data(), &nan, 4); }, "amax nan is not a finite value >= 0"},
      {[](auto& f) { f.tensors["extra"] = nibble::io::make_tensor(DType::U8, {1}, std::vector<uint8_t>{0}); },
       "unexpected tensor 'extra' for format nvfp4"},
      // Four Over Six metadata that does not fit.
      {[](auto& f) { f.metadata["four_over_six_e4m3_max"] = "256"; },
       "four_over_six is false, so four_over_six_error must be mae and four_over_six_e4m3_max 448"},
      {[](auto& f) { f.metadata["four_over_six_error"] = "huber"; }, "metadata four_over_six_error 'huber'"},
      {[](auto& f) {
         f.metadata["four_over_six"] = "true";
         f.metadata["four_over_six_e4m3_max"] = "300";
       },
       "metadata four_over_six_e4m3_max '300'"},
      {[](auto& f) { f.metadata.erase("four_over_six_error"); }, "only one of four_over_six_error and four_over_six_e4m3_max"},
  };
  for (size_t i = 0; i < damages.size(); ++i) {
    SCOPED_TRACE(damages[i].expected);
    SafetensorsFile f = good;
    damages[i].apply(f);
    expect_refused(f, damages[i].expected);
  }
}

TEST(QuantizedSafetensors, RefusesWhatOtherFormatsCannotHold) {
  SafetensorsFile mx = good_file(Format::mxfp4);
  mx.tensors["scales"].data[2] = 0xFF;
  expect_refused(mx, "scales[2] = 0xFF is the E8M0 NaN encoding");
  mx = good_file(Format::mxfp4);
  mx.metadata["rht"] = "true";
  expect_refused(mx, "rht and four_over_six apply to nvfp4 only");
  mx = good_file(Format::mxfp8);
  mx.metadata["block"] = "tensor";
  expect_refused(mx, "metadata block 'tensor' does not fit format mxfp8 (expected 1x32)");

  SafetensorsFile fp8 = good_file(Format::fp8_e4m3);
  const float zero = 0.0f;
  std::memcpy(fp8.tensors["scale"].data.data(), &zero, 4);
  expect_refused(fp8, "scale 0.000000 is not a finite positive decode scale");
  fp8 = good_file(Format::fp8_e4m3);
  fp8.tensors["codes"].data[7] = 0x7F;  // E4M3 NaN
  expect_refused(fp8, "codes[7] = 0x7F encodes a non-finite value");
  fp8 = good_file(Format::fp8_e5m2);
  fp8.tensors["scales"] = nibble::io::make_tensor(DType::U8, {16, 2}, std::vector<uint8_t>(32, 1));
  expect_refused(fp8, "unexpected tensor 'scales' for format fp8_e5m2");
}

}  // namespace
