#include "io/quantized_safetensors.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "format/codecs.h"
#include "format/quantize.h"

#ifndef NIBBLE_VERSION_STRING
#define NIBBLE_VERSION_STRING "unknown"
#endif

namespace nibble::io {

namespace {

std::string shape_text(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// "name[i] = 0xAB": the element a message is about.
std::string byte_at(const char* name, size_t i, uint8_t value) {
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02X", value);
  return std::string(name) + "[" + std::to_string(i) + "] = " + hex;
}

// Reads one file's fields in order, each checked against those read before it; every failure names
// the file and the field.
class Reader {
 public:
  Reader(const SafetensorsFile& file, const std::string& source) : file_(file), source_(source) {}

  QuantizedFile read() {
    QuantizedFile out;
    QuantizedTensor& q = out.tensor;
    read_encoding(q);
    out.transposed = flag("transposed");
    if ((q.rht || q.four_over_six) && q.format != Format::nvfp4) fail("rht and four_over_six apply to nvfp4 only");
    read_four_over_six(q);
    read_shape(q);
    q.codes = tensor_bytes("codes", DType::U8, {q.rows, q.row_bytes()});
    q.amax = scalar_f32("amax");
    if (!std::isfinite(q.amax) || q.amax < 0) fail("amax " + std::to_string(q.amax) + " is not a finite value >= 0");
    switch (q.format) {
      case Format::nvfp4: read_nvfp4_scales(q); break;
      case Format::mxfp4:
      case Format::mxfp8: read_mx_scales(q); break;
      case Format::fp8_e4m3:
      case Format::fp8_e5m2: read_fp8_scale(q); break;
    }
    check_no_unknown_tensors(q.format);
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw UsageError(source_ + ": not a valid nibble quantized tensor: " + what);
  }

  // format, block, rounding, rht, four_over_six.
  void read_encoding(QuantizedTensor& q) const {
    try {
      q.format = parse_format(meta("format"));
    } catch (const UsageError& e) {
      fail(std::string("metadata 'format': ") + e.what());
    }
    const std::string& block = meta("block");
    if (const auto shape = parse_block_name(q.format, block))
      q.block = *shape;
    else
      fail("metadata block '" + block + "' does not fit format " + std::string(to_string(q.format)) + " (expected " +
           std::string(block_names(q.format)) + ")");
    const std::string& rounding = meta("rounding");
    if (rounding != "rn" && rounding != "sr") fail("metadata rounding '" + rounding + "' is neither rn nor sr");
    q.rounding = rounding == "sr" ? Rounding::stochastic : Rounding::nearest;
    q.rht = flag("rht");
    q.four_over_six = flag("four_over_six");
  }

  // four_over_six_error / four_over_six_e4m3_max (see the header for files without them).
  void read_four_over_six(QuantizedTensor& q) const {
    const auto error = file_.metadata.find("four_over_six_error");
    const auto ceiling = file_.metadata.find("four_over_six_e4m3_max");
    const bool old_file = error == file_.metadata.end() && ceiling == file_.metadata.end();
    if (!old_file && (error == file_.metadata.end() || ceiling == file_.metadata.end()))
      fail("the metadata has only one of four_over_six_error and four_over_six_e4m3_max");
    if (old_file) {
      q.four_over_six_error = q.four_over_six ? FourOverSixError::mse : FourOverSixError::mae;
      q.four_over_six_e4m3_max = q.four_over_six ? 256 : 448;
      return;
    }
    try {
      q.four_over_six_error = parse_four_over_six_error(error->second, "metadata four_over_six_error");
      q.four_over_six_e4m3_max = parse_four_over_six_e4m3_max(ceiling->second, "metadata four_over_six_e4m3_max");
    } catch (const UsageError& e) {
      fail(e.what());
    }
    if (!q.four_over_six && (q.four_over_six_error != FourOverSixError::mae || q.four_over_six_e4m3_max != 448))
      fail("four_over_six is false, so four_over_six_error must be mae and four_over_six_e4m3_max 448 (the global "
           "scale is 2688 / amax), not " + error->second + " and " + ceiling->second);
  }

  // rows and cols, and whether the format can hold them.
  void read_shape(QuantizedTensor& q) const {
    q.rows = dimension("rows");
    q.cols = dimension("cols");
    if (int64_t product; __builtin_mul_overflow(q.rows, q.cols, &product)) fail("rows * cols overflows");
    if (q.block != BlockShape::per_tensor && q.cols % q.block_len() != 0)
      fail("cols " + std::to_string(q.cols) + " is not a multiple of the block length " + std::to_string(q.block_len()));
    if (is_4bit(q.format) && q.cols % 2 != 0) fail("cols must be even for a 4-bit format");
  }

  void read_nvfp4_scales(QuantizedTensor& q) const {
    q.scales = tensor_bytes("scales", DType::F8_E4M3, {q.rows, q.cols / q.block_len()});
    // S_dec is a function of amax (spec section 3), so it is recomputed rather than stored.
    q.decode_scale = ref::nvfp4_global_scale(q.amax, nvfp4_global_numerator(q)).decode;
    for (size_t i = 0; i < q.scales.size(); ++i)
      if (q.scales[i] >= 0x7F)  // 0x7F is NaN; a set sign bit is a negative scale, never produced
        fail(byte_at("scales", i, q.scales[i]) + " is not a valid unsigned E4M3 block scale");
  }

  void read_mx_scales(QuantizedTensor& q) const {
    q.scales = tensor_bytes("scales", DType::U8, {q.rows, q.cols / q.block_len()});
    q.decode_scale = 1.0f;
    for (size_t i = 0; i < q.scales.size(); ++i)
      if (q.scales[i] == 0xFF) fail(byte_at("scales", i, q.scales[i]) + " is the E8M0 NaN encoding");
  }

  void read_fp8_scale(QuantizedTensor& q) const {
    q.decode_scale = scalar_f32("scale");
    if (!std::isfinite(q.decode_scale) || !(q.decode_scale > 0))
      fail("scale " + std::to_string(q.decode_scale) + " is not a finite positive decode scale");
    for (size_t i = 0; i < q.codes.size(); ++i) {
      const float v = q.format == Format::fp8_e4m3 ? e4m3_decode(q.codes[i]) : e5m2_decode(q.codes[i]);
      if (!std::isfinite(v)) fail(byte_at("codes", i, q.codes[i]) + " encodes a non-finite value");
    }
  }

  const std::string& meta(const std::string& key) const {
    auto it = file_.metadata.find(key);
    if (it == file_.metadata.end()) fail("the metadata key '" + key + "' is missing (was it written by nibble quantize?)");
    return it->second;
  }

  bool flag(const std::string& key) const {
    const std::string& v = meta(key);
    if (v != "true" && v != "false") fail("metadata '" + key + "' is '" + v + "', expected true or false");
    return v == "true";
  }

  int64_t dimension(const std::string& key) const {
    const std::string& v = meta(key);
    int64_t d = 0;
    auto [end, error] = std::from_chars(v.data(), v.data() + v.size(), d);
    if (error != std::errc() || end != v.data() + v.size() || d <= 0)
      fail("metadata '" + key + "' is '" + v + "', expected a positive integer");
    return d;
  }

  const Tensor& tensor(const std::string& name) const {
    auto it = file_.tensors.find(name);
    if (it == file_.tensors.end()) fail("the tensor '" + name + "' is missing");
    return it->second;
  }

  std::vector<uint8_t> tensor_bytes(const std::string& name, DType dtype, std::vector<int64_t> shape) const {
    const Tensor& t = tensor(name);
    if (t.dtype != dtype)
      fail("tensor '" + name + "' has dtype " + std::string(to_string(t.dtype)) + ", expected " +
           std::string(to_string(dtype)));
    if (t.shape != shape)
      fail("tensor '" + name + "' has shape " + shape_text(t.shape) + ", expected " + shape_text(shape) +
           " from the metadata");
    return t.data;
  }

  float scalar_f32(const std::string& name) const {
    std::vector<uint8_t> bytes = tensor_bytes(name, DType::F32, {1});
    float v;
    std::memcpy(&v, bytes.data(), sizeof v);
    return v;
  }

  void check_no_unknown_tensors(Format f) const {
    for (const auto& [name, t] : file_.tensors) {
      (void)t;
      const bool known = name == "codes" || name == "amax" || (is_per_tensor_fp8(f) ? name == "scale" : name == "scales");
      if (!known) fail("unexpected tensor '" + name + "' for format " + std::string(to_string(f)));
    }
  }

  const SafetensorsFile& file_;
  const std::string& source_;
};

}  // namespace

std::string_view block_names(Format f) {
  if (f == Format::nvfp4) return "1x16 or 16x16";
  if (is_mx(f)) return "1x32";
  return "tensor (one scale per tensor)";
}

std::optional<BlockShape> parse_block_name(Format f, std::string_view name) {
  if (f == Format::nvfp4 && (name == "1x16" || name == "16x16"))
    return name == "1x16" ? BlockShape::row_1x16 : BlockShape::tile_16x16;
  if (is_mx(f) && name == "1x32") return BlockShape::row_1x32;
  if (is_per_tensor_fp8(f) && name == "tensor") return BlockShape::per_tensor;
  return std::nullopt;
}

SafetensorsFile quantized_to_safetensors(const QuantizedTensor& q, uint64_t seed, bool transposed,
                                         NpyDType source_dtype) {
  // The file format has one amax per tensor; nibble quantize makes no row-scaled tensors.
  if (q.row_scaled)
    throw UsageError("a row-scaled NVFP4 tensor (one global scale per row) has no quantized safetensors encoding: "
                     "quantize it per tensor to save it");
  SafetensorsFile file;
  file.tensors["codes"] = make_tensor(DType::U8, {q.rows, q.row_bytes()}, q.codes);
  if (is_per_tensor_fp8(q.format)) {
    file.tensors["scale"] = make_f32_tensor({1}, std::span<const float>(&q.decode_scale, 1));
  } else {
    file.tensors["scales"] =
        make_tensor(q.format == Format::nvfp4 ? DType::F8_E4M3 : DType::U8, {q.rows, q.scale_cols()}, q.scales);
  }
  file.tensors["amax"] = make_f32_tensor({1}, std::span<const float>(&q.amax, 1));
  auto flag = [](bool b) { return std::string(b ? "true" : "false"); };
  file.metadata = {
      {"format", std::string(to_string(q.format))},
      {"block", std::string(to_string(q.block))},
      {"rounding", std::string(to_string(q.rounding))},
      {"seed", std::to_string(seed)},
      {"rht", flag(q.rht)},
      {"four_over_six", flag(q.four_over_six)},
      {"four_over_six_error", std::string(to_string(q.four_over_six_error))},
      {"four_over_six_e4m3_max", std::to_string(q.four_over_six_e4m3_max)},
      {"transposed", flag(transposed)},
      {"rows", std::to_string(q.rows)},
      {"cols", std::to_string(q.cols)},
      {"source_dtype", source_dtype == NpyDType::float16 ? "float16" : "float32"},
      {"nibble_version", NIBBLE_VERSION_STRING},
  };
  return file;
}

QuantizedFile quantized_from_safetensors(const SafetensorsFile& file, const std::string& source) {
  return Reader(file, source).read();
}

}  // namespace nibble::io
