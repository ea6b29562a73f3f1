// `nibble quantize` and `nibble dequantize`: NVFP4 (and MXFP4, MXFP8, FP8) for numpy/PyTorch/JAX
// users, through .npy in and safetensors out (and back). The file layout:
//   codes   U8       [rows, cols/2] (4-bit, two per byte, low nibble first) or [rows, cols] (8-bit)
//   scales  F8_E4M3  [rows, cols/16] (nvfp4) or U8 [rows, cols/32] (E8M0 exponents, mx formats)
//   scale   F32      [1] the per-tensor decode scale (fp8_e4m3 / fp8_e5m2 only)
//   amax    F32      [1] the global amax (of the RHT-transformed values when rht)
//   __metadata__: format, block, rounding, seed, rht, four_over_six, four_over_six_error (mae|mse),
//   four_over_six_e4m3_max (448|256), transposed, rows, cols, source_dtype, nibble_version.
// The global decode scale is recomputed from amax: S_dec = 1 / ((6 * e4m3_max) / amax), with
// e4m3_max = four_over_six_e4m3_max under Four Over Six, else 448. Files written before the two
// four_over_six_* keys existed (they are then absent) hold the old fixed Four Over Six numerator
// 256 * 6, so a missing four_over_six_e4m3_max reads as 256 when four_over_six is true (448
// otherwise) and dequantizes exactly as before; a missing four_over_six_error reads as mse (the old
// rule compared squared errors, per row, in the scaled domain - not TE's rule, so re-quantizing
// such a file's source gives different bytes, while its dequantized values are unchanged).
// rows/cols are the shape of the stored (quantized) tensor. With --transposed it is the
// quantization of the input's transpose (the column-wise GEMM operand); dequantize transposes the
// result back, so a round trip always returns the input's shape.
// Every failure is a UsageError (exit code 2) raised before the output is committed; outputs are
// written through io::AtomicFileWriter, so a failed command leaves no output file.
#include <fmt/core.h>

#include <charconv>
#include <cstring>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/command.h"
#include "format/codecs.h"
#include "format/quant_stats.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "kernels/cpu/quantize/quantize.h"

#ifndef NIBBLE_VERSION_STRING
#define NIBBLE_VERSION_STRING "unknown"
#endif

namespace nibble::cli {
namespace {

using io::DType;

// ------------------------------------------------------------------ shared helpers ------------

std::vector<float> transpose(std::span<const float> x, int64_t rows, int64_t cols) {
  std::vector<float> t(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[static_cast<size_t>(c * rows + r)] = x[static_cast<size_t>(r * cols + c)];
  return t;
}

std::string shape_text(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A .npy input as a 2-D float32 matrix; anything else is a UsageError that says what to do.
struct Matrix {
  std::vector<float> values;
  int64_t rows = 0, cols = 0;
  io::NpyDType stored_dtype = io::NpyDType::float32;
};

Matrix read_matrix(const std::string& path) {
  io::NpyArray array = io::read_npy(path);
  if (array.shape.size() != 2)
    throw UsageError(path + ": expected a 2-D array but its shape is " + shape_text(array.shape) +
                     " (reshape it to [rows, cols] first, with the block dimension last)");
  return {std::move(array.data), array.shape[0], array.shape[1], array.stored_dtype};
}

bool is_mx(Format f) { return f == Format::mxfp4 || f == Format::mxfp8; }
bool is_per_tensor_fp8(Format f) { return f == Format::fp8_e4m3 || f == Format::fp8_e5m2; }

// The one block shape each format stores, or the two nvfp4 can use.
std::string valid_blocks_of(Format f) {
  if (f == Format::nvfp4) return "1x16 or 16x16";
  if (is_mx(f)) return "1x32";
  return "tensor (one scale per tensor)";
}

void print_stats(const QuantStats& s, const QuantizedTensor& q, bool transposed) {
  const std::string four_over_six =
      q.four_over_six ? fmt::format(", four-over-six {} e4m3-max {}", to_string(q.four_over_six_error),
                                    q.four_over_six_e4m3_max)
                      : std::string();
  fmt::print("format           {} (block {}, rounding {}{}{})\n", to_string(q.format), to_string(q.block),
             to_string(q.rounding), q.rht ? ", rht" : "", four_over_six);
  fmt::print("shape            [{}, {}]{}\n", q.rows, q.cols, transposed ? " (stored transposed)" : "");
  fmt::print("relative RMS     {:.6g}\n", s.rel_rms_error);
  fmt::print("SNR              {:.3f} dB\n", s.snr_db);
  fmt::print("flushed to zero  {} of {}\n", s.flushed_to_zero, s.count);
  fmt::print("saturated        {}\n", s.saturated);
  fmt::print("amax             {:.9g}\n", s.amax);
}

// ------------------------------------------------------------------ quantize -----------------

struct QuantizeArgs {
  std::string input, output, format, block, rounding = "rn";
  uint64_t seed = 0;
  bool rht = false, four_over_six = false, stats = false, transposed = false;
  std::string four_over_six_error = "mae", four_over_six_e4m3_max = "448";
  CLI::Option* seed_option = nullptr;
  CLI::Option* four_over_six_error_option = nullptr;
  CLI::Option* four_over_six_e4m3_max_option = nullptr;
};

QuantOptions options_from(const QuantizeArgs& a) {
  QuantOptions o;
  o.format = parse_format(a.format);
  if (!a.block.empty()) {
    const bool valid = o.format == Format::nvfp4 ? (a.block == "1x16" || a.block == "16x16")
                       : is_mx(o.format)        ? a.block == "1x32"
                                                : a.block == "tensor";
    if (!valid)
      throw UsageError("--block " + a.block + " does not apply to " + a.format + ": its blocks are " +
                       valid_blocks_of(o.format));
    o.tile_16x16 = a.block == "16x16";
  }
  if (a.rounding == "rn") o.rounding = Rounding::nearest;
  else if (a.rounding == "sr") o.rounding = Rounding::stochastic;
  else throw UsageError("unknown --rounding '" + a.rounding + "': use rn (round to nearest even) or sr (stochastic)");
  if (a.seed_option->count() > 0 && o.rounding != Rounding::stochastic)
    throw UsageError("--seed only applies with --rounding sr");
  o.seed = a.seed;
  o.rht = a.rht;
  o.four_over_six = a.four_over_six;
  // Like --seed without --rounding sr: a Four Over Six knob without --four-over-six is refused.
  for (const CLI::Option* given : {a.four_over_six_error_option, a.four_over_six_e4m3_max_option})
    if (given->count() > 0 && !a.four_over_six)
      throw UsageError(given->get_name() + " only applies with --four-over-six");
  o.four_over_six_error = parse_four_over_six_error(a.four_over_six_error, "--four-over-six-error");
  o.four_over_six_e4m3_max = parse_four_over_six_e4m3_max(a.four_over_six_e4m3_max, "--four-over-six-e4m3-max");
  return o;
}

io::SafetensorsFile to_safetensors(const QuantizedTensor& q, const QuantOptions& o, bool transposed,
                                   io::NpyDType source_dtype) {
  io::SafetensorsFile file;
  file.tensors["codes"] = io::make_tensor(DType::U8, {q.rows, q.row_bytes()}, q.codes);
  if (is_per_tensor_fp8(q.format)) {
    file.tensors["scale"] = io::make_f32_tensor({1}, std::span<const float>(&q.decode_scale, 1));
  } else {
    file.tensors["scales"] = io::make_tensor(q.format == Format::nvfp4 ? DType::F8_E4M3 : DType::U8,
                                             {q.rows, q.scale_cols()}, q.scales);
  }
  file.tensors["amax"] = io::make_f32_tensor({1}, std::span<const float>(&q.amax, 1));
  auto flag = [](bool b) { return std::string(b ? "true" : "false"); };
  file.metadata = {
      {"format", std::string(to_string(q.format))},
      {"block", std::string(to_string(q.block))},
      {"rounding", std::string(to_string(q.rounding))},
      {"seed", std::to_string(o.seed)},
      {"rht", flag(q.rht)},
      {"four_over_six", flag(q.four_over_six)},
      {"four_over_six_error", std::string(to_string(q.four_over_six_error))},
      {"four_over_six_e4m3_max", std::to_string(q.four_over_six_e4m3_max)},
      {"transposed", flag(transposed)},
      {"rows", std::to_string(q.rows)},
      {"cols", std::to_string(q.cols)},
      {"source_dtype", source_dtype == io::NpyDType::float16 ? "float16" : "float32"},
      {"nibble_version", NIBBLE_VERSION_STRING},
  };
  return file;
}

int run_quantize(const QuantizeArgs& a) {
  // Options first: a typo in --format should not wait for a large file to load.
  const QuantOptions o = options_from(a);
  if (same_file(a.input, a.output))
    throw UsageError(fmt::format("-o {} is the input file itself: writing it would destroy the input; give another "
                                 "output path (e.g. {}.safetensors)",
                                 a.output, std::filesystem::path(a.input).stem().string()));
  Matrix x = read_matrix(a.input);
  QuantizedTensor q;
  try {
    q = a.transposed ? cpu::quantize_transposed(x.values, x.rows, x.cols, o) : cpu::quantize(x.values, x.rows, x.cols, o);
  } catch (const UsageError& e) {
    throw UsageError(a.input + ": " + e.what());  // the quantizer does not know which file it was given
  }
  io::write_safetensors(a.output, to_safetensors(q, o, a.transposed, x.stored_dtype));
  if (a.stats) {
    if (a.transposed) x.values = transpose(x.values, x.rows, x.cols);
    print_stats(quant_stats(x.values, q), q, a.transposed);
  }
  return 0;
}

// ------------------------------------------------------------------ dequantize ---------------

struct DequantizeArgs {
  std::string input, output, reference;
  bool stats = false;
};

// Reads back what to_safetensors wrote, checking every field against the others so a damaged or
// foreign file is refused with a reason instead of dequantizing to garbage.
class QuantizedFileReader {
 public:
  QuantizedFileReader(const io::SafetensorsFile& file, std::string source) : file_(file), source_(std::move(source)) {}

  // Returns the tensor and whether it holds the transpose of the original.
  std::pair<QuantizedTensor, bool> read() {
    QuantizedTensor q;
    try {
      q.format = parse_format(meta("format"));
    } catch (const UsageError& e) {
      fail(std::string("metadata 'format': ") + e.what());
    }
    const std::string& block = meta("block");
    if (q.format == Format::nvfp4 && (block == "1x16" || block == "16x16"))
      q.block = block == "1x16" ? BlockShape::row_1x16 : BlockShape::tile_16x16;
    else if (is_mx(q.format) && block == "1x32")
      q.block = BlockShape::row_1x32;
    else if (is_per_tensor_fp8(q.format) && block == "tensor")
      q.block = BlockShape::per_tensor;
    else
      fail("metadata block '" + block + "' does not fit format " + std::string(to_string(q.format)) +
           " (expected " + valid_blocks_of(q.format) + ")");
    const std::string& rounding = meta("rounding");
    if (rounding != "rn" && rounding != "sr") fail("metadata rounding '" + rounding + "' is neither rn nor sr");
    q.rounding = rounding == "sr" ? Rounding::stochastic : Rounding::nearest;
    q.rht = flag("rht");
    q.four_over_six = flag("four_over_six");
    const bool transposed = flag("transposed");
    if ((q.rht || q.four_over_six) && q.format != Format::nvfp4) fail("rht and four_over_six apply to nvfp4 only");
    read_four_over_six(q);
    q.rows = dimension("rows");
    q.cols = dimension("cols");
    if (int64_t product; __builtin_mul_overflow(q.rows, q.cols, &product)) fail("rows * cols overflows");
    if (q.block != BlockShape::per_tensor && q.cols % q.block_len() != 0)
      fail("cols " + std::to_string(q.cols) + " is not a multiple of the block length " + std::to_string(q.block_len()));
    if (is_4bit(q.format) && q.cols % 2 != 0) fail("cols must be even for a 4-bit format");

    q.codes = tensor_bytes("codes", DType::U8, {q.rows, q.row_bytes()});
    q.amax = scalar_f32("amax");
    if (!std::isfinite(q.amax) || q.amax < 0) fail("amax " + std::to_string(q.amax) + " is not a finite value >= 0");
    switch (q.format) {
      case Format::nvfp4:
        q.scales = tensor_bytes("scales", DType::F8_E4M3, {q.rows, q.cols / q.block_len()});
        // S_dec is a function of amax (spec section 3), so it is recomputed rather than stored.
        q.decode_scale = ref::nvfp4_global_scale(q.amax, nvfp4_global_numerator(q)).decode;
        for (size_t i = 0; i < q.scales.size(); ++i)
          if (q.scales[i] >= 0x7F)  // 0x7F is NaN; a set sign bit is a negative scale, never produced
            fail(fmt::format("scales[{}] = 0x{:02X} is not a valid unsigned E4M3 block scale", i, q.scales[i]));
        break;
      case Format::mxfp4:
      case Format::mxfp8:
        q.scales = tensor_bytes("scales", DType::U8, {q.rows, q.cols / q.block_len()});
        q.decode_scale = 1.0f;
        for (size_t i = 0; i < q.scales.size(); ++i)
          if (q.scales[i] == 0xFF) fail(fmt::format("scales[{}] = 0xFF is the E8M0 NaN encoding", i));
        break;
      case Format::fp8_e4m3:
      case Format::fp8_e5m2:
        q.decode_scale = scalar_f32("scale");
        if (!std::isfinite(q.decode_scale) || !(q.decode_scale > 0))
          fail("scale " + std::to_string(q.decode_scale) + " is not a finite positive decode scale");
        for (size_t i = 0; i < q.codes.size(); ++i) {
          const float v = q.format == Format::fp8_e4m3 ? e4m3_decode(q.codes[i]) : e5m2_decode(q.codes[i]);
          if (!std::isfinite(v)) fail(fmt::format("codes[{}] = 0x{:02X} encodes a non-finite value", i, q.codes[i]));
        }
        break;
    }
    check_no_unknown_tensors(q.format);
    return {std::move(q), transposed};
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw UsageError(source_ + ": not a valid nibble quantized tensor: " + what);
  }

  const std::string& meta(const std::string& key) const {
    auto it = file_.metadata.find(key);
    if (it == file_.metadata.end()) fail("the metadata key '" + key + "' is missing (was it written by nibble quantize?)");
    return it->second;
  }

  // four_over_six_error / four_over_six_e4m3_max (see the file comment for files without them).
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

  const io::Tensor& tensor(const std::string& name) const {
    auto it = file_.tensors.find(name);
    if (it == file_.tensors.end()) fail("the tensor '" + name + "' is missing");
    return it->second;
  }

  std::vector<uint8_t> tensor_bytes(const std::string& name, DType dtype, std::vector<int64_t> shape) const {
    const io::Tensor& t = tensor(name);
    if (t.dtype != dtype)
      fail("tensor '" + name + "' has dtype " + std::string(io::to_string(t.dtype)) + ", expected " +
           std::string(io::to_string(dtype)));
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

  const io::SafetensorsFile& file_;
  std::string source_;
};

int run_dequantize(const DequantizeArgs& a) {
  const bool want_stats = a.stats || !a.reference.empty();
  if (a.stats && a.reference.empty())
    throw UsageError("--stats needs the original tensor: add --reference ORIGINAL.npy");
  for (const std::string& read : {a.input, a.reference})
    if (!read.empty() && same_file(read, a.output))
      throw UsageError(fmt::format("-o {} is the input file {} itself: writing it would destroy that file; give another "
                                   "output path (e.g. {}.npy)",
                                   a.output, read, std::filesystem::path(a.input).stem().string()));
  const io::SafetensorsFile file = io::read_safetensors(a.input);
  auto [q, transposed] = QuantizedFileReader(file, a.input).read();

  std::vector<float> values(static_cast<size_t>(q.rows * q.cols));
  cpu::dequantize(q, values);
  // The output has the input's orientation: undo the transpose of a column-wise copy.
  const int64_t out_rows = transposed ? q.cols : q.rows, out_cols = transposed ? q.rows : q.cols;
  if (transposed) values = transpose(values, q.rows, q.cols);

  std::optional<Matrix> reference;
  if (want_stats) {
    // Read and check the reference before writing, so a wrong --reference leaves no output.
    reference = read_matrix(a.reference);
    if (reference->rows != out_rows || reference->cols != out_cols)
      throw UsageError(fmt::format("{}: shape [{}, {}] does not match the quantized tensor's [{}, {}]", a.reference,
                                   reference->rows, reference->cols, out_rows, out_cols));
    for (size_t i = 0; i < reference->values.size(); ++i)
      if (!std::isfinite(reference->values[i]))
        throw UsageError(fmt::format("{}: non-finite value at index [{}, {}]", a.reference,
                                     static_cast<int64_t>(i) / out_cols, static_cast<int64_t>(i) % out_cols));
  }
  const int64_t shape[2] = {out_rows, out_cols};
  io::write_npy(a.output, values, shape);
  if (reference) {
    if (transposed) reference->values = transpose(reference->values, out_rows, out_cols);
    print_stats(quant_stats(reference->values, q), q, transposed);
  }
  return 0;
}

// ------------------------------------------------------------------ registration -------------

const CommandRegistration quantize_command("quantize", [](CLI::App& app, int& exit_code) {
  auto args = std::make_shared<QuantizeArgs>();
  CLI::App* cmd = app.add_subcommand("quantize", "Quantize a 2-D float32/float16 .npy to a safetensors file");
  cmd->add_option("input", args->input, "Input .npy (2-D, little-endian float32 or float16, C order)")->required();
  cmd->add_option("-o,--output", args->output, "Output .safetensors file")->required();
  cmd->add_option("--format", args->format, "nvfp4, mxfp4, mxfp8, fp8_e4m3 or fp8_e5m2")->required();
  cmd->add_option("--block", args->block, "nvfp4: 1x16 (default) or 16x16; mx formats: 1x32; fp8: tensor");
  cmd->add_option("--rounding", args->rounding, "rn (round to nearest even, default) or sr (stochastic)");
  args->seed_option = cmd->add_option("--seed", args->seed, "Seed of the stochastic rounding stream (with --rounding sr)")
                          ->check(integer_at_least(0, "a seed >= 0"));
  cmd->add_flag("--rht", args->rht, "nvfp4: 16-point random Hadamard transform along rows first");
  cmd->add_flag("--four-over-six", args->four_over_six,
                "nvfp4: per block (16x16: per tile), scale to 4 or 6, whichever errs less (TE's Four Over Six)");
  args->four_over_six_error_option = cmd->add_option(
      "--four-over-six-error", args->four_over_six_error,
      "With --four-over-six: mae (sum of |error|, TE's default) or mse (sum of squared errors)");
  args->four_over_six_e4m3_max_option = cmd->add_option(
      "--four-over-six-e4m3-max", args->four_over_six_e4m3_max,
      "With --four-over-six: E4M3 ceiling of the global scale, 448 (TE's default: 2688 / amax) or 256 (1536 / amax)");
  cmd->add_flag("--transposed", args->transposed, "Quantize the transpose (the column-wise GEMM operand)");
  cmd->add_flag("--stats", args->stats, "Print the quantization error statistics");
  cmd->callback([args, &exit_code] { exit_code = run_quantize(*args); });
});

const CommandRegistration dequantize_command("dequantize", [](CLI::App& app, int& exit_code) {
  auto args = std::make_shared<DequantizeArgs>();
  CLI::App* cmd = app.add_subcommand("dequantize", "Dequantize a nibble safetensors file to a float32 .npy");
  cmd->add_option("input", args->input, "Input .safetensors written by nibble quantize")->required();
  cmd->add_option("-o,--output", args->output, "Output .npy (float32, the original shape and domain)")->required();
  cmd->add_option("--reference", args->reference, "The original .npy, to print error statistics (implies --stats)");
  cmd->add_flag("--stats", args->stats, "Print error statistics against --reference");
  cmd->callback([args, &exit_code] { exit_code = run_dequantize(*args); });
});

}  // namespace
}  // namespace nibble::cli
