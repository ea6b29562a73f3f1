// `nibble quantize` and `nibble dequantize`: NVFP4 (and MXFP4, MXFP8, FP8) for numpy/PyTorch/JAX
// users, through .npy in and safetensors out (and back). The file layout and its compatibility rules
// are io/quantized_safetensors.h's; this file parses the options and calls it.
// With --transposed the file holds the quantization of the input's transpose (the column-wise GEMM
// operand); dequantize transposes the result back, so a round trip always returns the input's shape.
// Every failure is a UsageError (exit code 2) raised before the output is committed; outputs are
// written through io::AtomicFileWriter, so a failed command leaves no output file.
#include <fmt/core.h>

#include <cmath>
#include <memory>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "cli/command.h"
#include "format/quant_stats.h"
#include "io/npy.h"
#include "io/quantized_safetensors.h"
#include "io/safetensors.h"
#include "io/write_rules.h"
#include "kernels/cpu/quantize/quantize.h"

namespace nibble::cli {
namespace {

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
    if (!io::parse_block_name(o.format, a.block))
      throw UsageError("--block " + a.block + " does not apply to " + a.format + ": its blocks are " +
                       std::string(io::block_names(o.format)));
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

int run_quantize(const QuantizeArgs& a) {
  // Options first: a typo in --format should not wait for a large file to load.
  const QuantOptions o = options_from(a);
  if (same_file(a.input, a.output))
    throw UsageError(fmt::format("-o {} is the input file itself: writing it would destroy the input; give another "
                                 "output path (e.g. {}.safetensors)",
                                 a.output, std::filesystem::path(a.input).stem().string()));
  io::refuse_output_in_owned_directory(a.output, "quantize");
  Matrix x = read_matrix(a.input);
  QuantizedTensor q;
  try {
    q = a.transposed ? cpu::quantize_transposed(x.values, x.rows, x.cols, o) : cpu::quantize(x.values, x.rows, x.cols, o);
  } catch (const UsageError& e) {
    throw UsageError(a.input + ": " + e.what());  // the quantizer does not know which file it was given
  }
  io::write_output_file(a.output,
                        io::serialize_safetensors(io::quantized_to_safetensors(q, o.seed, a.transposed, x.stored_dtype)));
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

int run_dequantize(const DequantizeArgs& a) {
  const bool want_stats = a.stats || !a.reference.empty();
  if (a.stats && a.reference.empty())
    throw UsageError("--stats needs the original tensor: add --reference ORIGINAL.npy");
  for (const std::string& read : {a.input, a.reference})
    if (!read.empty() && same_file(read, a.output))
      throw UsageError(fmt::format("-o {} is the input file {} itself: writing it would destroy that file; give another "
                                   "output path (e.g. {}.npy)",
                                   a.output, read, std::filesystem::path(a.input).stem().string()));
  io::refuse_output_in_owned_directory(a.output, "dequantize");
  const io::SafetensorsFile file = io::read_safetensors(a.input);
  auto [q, transposed] = io::quantized_from_safetensors(file, a.input);

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
  io::write_output_file(a.output, io::serialize_npy(values, shape));
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
