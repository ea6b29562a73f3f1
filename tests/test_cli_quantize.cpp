// `nibble quantize` / `nibble dequantize` end to end: runs the built binary on temporary files.
// Round trips for every format and option, file contents checked against the library, every
// bad-input case (exit code 2, a message that says what is wrong, no output file left behind),
// and interop with numpy when /usr/bin/python3 has it.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "format/quant_stats.h"
#include "io/atomic_file.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "kernels/cpu/quantize/quantize.h"
#include "support/random.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;
using nibble::io::DType;

namespace {

const std::string kNibble = std::string(NIBBLE_BINARY_DIR) + "/nibble";

struct RunResult {
  int exit_code = -1;
  std::string out, err;
};

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

class CliQuantize : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kNibble)) << kNibble << " does not exist: build the nibble target before this test";
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = nibble_test::fresh_dir("test_cli_quantize", info->name());
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path path(const std::string& name) const { return dir_ / name; }

  RunResult run(const std::string& args) const {
    const fs::path out = dir_ / ".stdout", err = dir_ / ".stderr";
    const std::string cmd = quote(kNibble) + " " + args + " >" + quote(out.string()) + " 2>" + quote(err.string());
    const int status = std::system(cmd.c_str());
    RunResult r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = read_text(out);
    r.err = read_text(err);
    fs::remove(out);
    fs::remove(err);
    return r;
  }

  // Files in the test directory, except the captured output.
  std::vector<std::string> files() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  void write_matrix(const std::string& name, const std::vector<float>& v, int64_t rows, int64_t cols) const {
    const int64_t shape[] = {rows, cols};
    nibble::io::write_npy(path(name), v, shape);
  }

  // A bad invocation must exit with 2, say `expected` on stderr, and leave the directory as it was.
  void expect_failure(const std::string& args, const std::string& expected) const {
    SCOPED_TRACE(args);
    const std::vector<std::string> before = files();
    RunResult r = run(args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find(expected), std::string::npos) << "stderr: " << r.err << "\nexpected: " << expected;
    EXPECT_EQ(files(), before) << "a failed command left files behind";
  }

  fs::path dir_;
};

std::vector<float> random_matrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::vector<float> v = nibble_test::normal_floats(static_cast<size_t>(rows * cols), seed);
  v[7] = 9.5f;  // an outlier, so block scales differ
  return v;
}

double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(a[i]) * a[i];
  }
  return std::sqrt(num / den);
}

struct FormatCase {
  std::string options;
  nibble::QuantOptions quant;
  bool transposed;
  DType scale_dtype;  // U8 placeholder when the format stores a per-tensor `scale`
  bool per_tensor;
  double max_error;
};

std::vector<FormatCase> format_cases() {
  using nibble::Format;
  using nibble::Rounding;
  auto opt = [](Format f) {
    nibble::QuantOptions o;
    o.format = f;
    return o;
  };
  std::vector<FormatCase> cases;
  cases.push_back({"--format nvfp4", opt(Format::nvfp4), false, DType::F8_E4M3, false, 0.15});
  auto tile = opt(Format::nvfp4);
  tile.tile_16x16 = true;
  cases.push_back({"--format nvfp4 --block 16x16", tile, false, DType::F8_E4M3, false, 0.2});
  cases.push_back({"--format nvfp4 --block 16x16 --transposed", tile, true, DType::F8_E4M3, false, 0.2});
  auto sr = opt(Format::nvfp4);
  sr.rounding = Rounding::stochastic;
  sr.seed = 1234;
  cases.push_back({"--format nvfp4 --rounding sr --seed 1234", sr, false, DType::F8_E4M3, false, 0.25});
  auto rht = opt(Format::nvfp4);
  rht.rht = true;
  cases.push_back({"--format nvfp4 --rht", rht, false, DType::F8_E4M3, false, 0.15});
  cases.push_back({"--format nvfp4 --rht --transposed", rht, true, DType::F8_E4M3, false, 0.15});
  auto fos = opt(Format::nvfp4);
  fos.four_over_six = true;
  cases.push_back({"--format nvfp4 --four-over-six", fos, false, DType::F8_E4M3, false, 0.15});
  auto fos_tile = fos;
  fos_tile.tile_16x16 = true;
  fos_tile.four_over_six_error = nibble::FourOverSixError::mse;
  fos_tile.four_over_six_e4m3_max = 256;
  cases.push_back({"--format nvfp4 --block 16x16 --four-over-six --four-over-six-error mse --four-over-six-e4m3-max 256",
                   fos_tile, false, DType::F8_E4M3, false, 0.2});
  cases.push_back({"--format nvfp4 --block 16x16 --transposed --four-over-six --four-over-six-error mse "
                   "--four-over-six-e4m3-max 256",
                   fos_tile, true, DType::F8_E4M3, false, 0.2});
  auto fos_sr = fos;
  fos_sr.rounding = Rounding::stochastic;
  fos_sr.seed = 5;
  fos_sr.four_over_six_e4m3_max = 256;
  cases.push_back({"--format nvfp4 --rounding sr --seed 5 --four-over-six --four-over-six-e4m3-max 256 --four-over-six-error mae",
                   fos_sr, false, DType::F8_E4M3, false, 0.25});
  cases.push_back({"--format nvfp4 --transposed", opt(Format::nvfp4), true, DType::F8_E4M3, false, 0.15});
  cases.push_back({"--format mxfp4", opt(Format::mxfp4), false, DType::U8, false, 0.2});
  auto mx_sr = opt(Format::mxfp4);
  mx_sr.rounding = Rounding::stochastic;
  mx_sr.seed = 7;
  cases.push_back({"--format mxfp4 --block 1x32 --rounding sr --seed 7", mx_sr, false, DType::U8, false, 0.3});
  cases.push_back({"--format mxfp8", opt(Format::mxfp8), false, DType::U8, false, 0.05});
  cases.push_back({"--format fp8_e4m3", opt(Format::fp8_e4m3), false, DType::U8, true, 0.05});
  cases.push_back({"--format fp8_e5m2 --block tensor", opt(Format::fp8_e5m2), false, DType::U8, true, 0.1});
  return cases;
}

}  // namespace

TEST_F(CliQuantize, RoundTripEveryFormat) {
  const int64_t rows = 32, cols = 64;
  const std::vector<float> x = random_matrix(rows, cols, 11);
  write_matrix("x.npy", x, rows, cols);
  for (const FormatCase& c : format_cases()) {
    SCOPED_TRACE(c.options);
    RunResult q = run("quantize " + quote(path("x.npy").string()) + " -o " + quote(path("q.safetensors").string()) + " " + c.options);
    ASSERT_EQ(q.exit_code, 0) << q.err;

    // The file holds exactly what the library produces for the same options.
    const nibble::QuantizedTensor expected =
        c.transposed ? nibble::cpu::quantize_transposed(x, rows, cols, c.quant) : nibble::cpu::quantize(x, rows, cols, c.quant);
    const nibble::io::SafetensorsFile file = nibble::io::read_safetensors(path("q.safetensors"));
    const auto& codes = file.tensor("codes");
    EXPECT_EQ(codes.dtype, DType::U8);
    EXPECT_EQ(codes.shape, (std::vector<int64_t>{expected.rows, expected.row_bytes()}));
    EXPECT_EQ(codes.data, expected.codes);
    if (c.per_tensor) {
      const auto& scale = file.tensor("scale");
      EXPECT_EQ(scale.dtype, DType::F32);
      EXPECT_EQ(scale.shape, (std::vector<int64_t>{1}));
      float s;
      std::memcpy(&s, scale.data.data(), 4);
      EXPECT_EQ(s, expected.decode_scale);
      EXPECT_EQ(file.tensors.count("scales"), 0u);
    } else {
      const auto& scales = file.tensor("scales");
      EXPECT_EQ(scales.dtype, c.scale_dtype);
      EXPECT_EQ(scales.shape, (std::vector<int64_t>{expected.rows, expected.scale_cols()}));
      EXPECT_EQ(scales.data, expected.scales);
    }
    const auto& amax = file.tensor("amax");
    EXPECT_EQ(amax.dtype, DType::F32);
    EXPECT_EQ(amax.shape, (std::vector<int64_t>{1}));
    float a;
    std::memcpy(&a, amax.data.data(), 4);
    EXPECT_EQ(a, expected.amax);
    EXPECT_EQ(file.metadata_value("format"), std::string(nibble::to_string(expected.format)));
    EXPECT_EQ(file.metadata_value("block"), std::string(nibble::to_string(expected.block)));
    EXPECT_EQ(file.metadata_value("rounding"), std::string(nibble::to_string(expected.rounding)));
    EXPECT_EQ(file.metadata_value("seed"), std::to_string(c.quant.seed));
    EXPECT_EQ(file.metadata_value("rht"), c.quant.rht ? "true" : "false");
    EXPECT_EQ(file.metadata_value("four_over_six"), c.quant.four_over_six ? "true" : "false");
    EXPECT_EQ(file.metadata_value("four_over_six_error"), std::string(nibble::to_string(nibble::four_over_six_error_of(c.quant))));
    EXPECT_EQ(file.metadata_value("four_over_six_e4m3_max"), std::to_string(nibble::four_over_six_e4m3_max_of(c.quant)));
    EXPECT_EQ(expected.four_over_six_e4m3_max, nibble::four_over_six_e4m3_max_of(c.quant));
    EXPECT_EQ(file.metadata_value("transposed"), c.transposed ? "true" : "false");
    EXPECT_EQ(file.metadata_value("rows"), std::to_string(expected.rows));
    EXPECT_EQ(file.metadata_value("cols"), std::to_string(expected.cols));
    EXPECT_FALSE(file.metadata_value("nibble_version").empty());

    // Dequantize: the input's shape, the library's values, a small error.
    RunResult d = run("dequantize " + quote(path("q.safetensors").string()) + " -o " + quote(path("y.npy").string()));
    ASSERT_EQ(d.exit_code, 0) << d.err;
    nibble::io::NpyArray y = nibble::io::read_npy(path("y.npy"));
    ASSERT_EQ(y.shape, (std::vector<int64_t>{rows, cols}));
    std::vector<float> library(static_cast<size_t>(rows * cols));
    nibble::cpu::dequantize(expected, library);
    if (c.transposed) {
      std::vector<float> back(library.size());
      for (int64_t r = 0; r < expected.rows; ++r)
        for (int64_t k = 0; k < expected.cols; ++k) back[k * expected.rows + r] = library[r * expected.cols + k];
      library = back;
    }
    EXPECT_EQ(y.data, library);
    EXPECT_LT(relative_error(x, y.data), c.max_error);
    fs::remove(path("q.safetensors"));
    fs::remove(path("y.npy"));
  }
  EXPECT_EQ(files(), (std::vector<std::string>{"x.npy"}));
}

TEST_F(CliQuantize, SubcommandsPrintStatistics) {
  const int64_t rows = 16, cols = 32;
  const std::vector<float> x = random_matrix(rows, cols, 3);
  write_matrix("x.npy", x, rows, cols);
  RunResult q = run("quantize " + quote(path("x.npy").string()) + " -o " + quote(path("q.safetensors").string()) +
                    " --format nvfp4 --stats");
  ASSERT_EQ(q.exit_code, 0) << q.err;
  nibble::QuantOptions o;
  const nibble::QuantStats s = nibble::quant_stats(x, nibble::cpu::quantize(x, rows, cols, o));
  for (const char* label : {"relative RMS", "SNR", "dB", "flushed to zero", "saturated", "amax"})
    EXPECT_NE(q.out.find(label), std::string::npos) << label << "\n" << q.out;
  char snr[64];
  std::snprintf(snr, sizeof snr, "%.3f dB", s.snr_db);
  EXPECT_NE(q.out.find(snr), std::string::npos) << q.out;

  RunResult d = run("dequantize " + quote(path("q.safetensors").string()) + " -o " + quote(path("y.npy").string()) +
                    " --stats --reference " + quote(path("x.npy").string()));
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_NE(d.out.find(snr), std::string::npos) << d.out;
}

TEST_F(CliQuantize, AcceptsFloat16Input) {
  // float16 bits for 1.0, -0.5, 2.0, 0.25 repeated, in a file written by hand (not by nibble).
  std::vector<uint8_t> bytes = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  std::string header = "{'descr': '<f2', 'fortran_order': False, 'shape': (2, 16), }";
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  bytes.push_back(static_cast<uint8_t>(header.size()));
  bytes.push_back(0);
  bytes.insert(bytes.end(), header.begin(), header.end());
  const uint16_t halves[4] = {0x3C00, 0xB800, 0x4000, 0x3400};
  for (int i = 0; i < 32; ++i) {
    bytes.push_back(static_cast<uint8_t>(halves[i % 4]));
    bytes.push_back(static_cast<uint8_t>(halves[i % 4] >> 8));
  }
  std::ofstream(path("h.npy"), std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  RunResult q = run("quantize " + quote(path("h.npy").string()) + " -o " + quote(path("q.safetensors").string()) + " --format nvfp4");
  ASSERT_EQ(q.exit_code, 0) << q.err;
  EXPECT_EQ(nibble::io::read_safetensors(path("q.safetensors")).metadata_value("source_dtype"), "float16");
  RunResult d = run("dequantize " + quote(path("q.safetensors").string()) + " -o " + quote(path("y.npy").string()));
  ASSERT_EQ(d.exit_code, 0) << d.err;
  nibble::io::NpyArray y = nibble::io::read_npy(path("y.npy"));
  // Same result as quantizing the widened float32 values in-process.
  const float widened[4] = {1.0f, -0.5f, 2.0f, 0.25f};
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[static_cast<size_t>(i)] = widened[i % 4];
  std::vector<float> expected(32);
  nibble::cpu::dequantize(nibble::cpu::quantize(x, 2, 16, nibble::QuantOptions{}), expected);
  EXPECT_EQ(y.data, expected);
  EXPECT_EQ(y.shape, (std::vector<int64_t>{2, 16}));
}

TEST_F(CliQuantize, RejectsBadInputsAndLeavesNoOutput) {
  write_matrix("x.npy", random_matrix(32, 64, 5), 32, 64);
  const std::string x = quote(path("x.npy").string()), out = quote(path("out.safetensors").string());

  // Not 2-D.
  std::vector<float> flat(64, 1.0f);
  const int64_t shape1[] = {64};
  nibble::io::write_npy(path("flat.npy"), flat, shape1);
  const int64_t shape3[] = {2, 2, 16};
  nibble::io::write_npy(path("cube.npy"), flat, shape3);
  expect_failure("quantize " + quote(path("flat.npy").string()) + " -o " + out + " --format nvfp4", "expected a 2-D array but its shape is [64]");
  expect_failure("quantize " + quote(path("cube.npy").string()) + " -o " + out + " --format nvfp4", "[2, 2, 16]");
  // Columns not a multiple of the block: nvfp4 16, mx 32.
  write_matrix("odd.npy", random_matrix(4, 24, 1), 4, 24);
  const std::string odd = quote(path("odd.npy").string());
  expect_failure("quantize " + odd + " -o " + out + " --format nvfp4", "not a multiple of the nvfp4 block size 16");
  expect_failure("quantize " + odd + " -o " + out + " --format mxfp8", "not a multiple of the mxfp8 block size 32");
  expect_failure("quantize " + odd + " -o " + out + " --format nvfp4", "does not pad silently");
  // NaN / Inf: the first offending index is named.
  std::vector<float> bad = random_matrix(4, 32, 2);
  bad[2 * 32 + 9] = INFINITY;
  bad[3 * 32 + 1] = NAN;
  write_matrix("inf.npy", bad, 4, 32);
  expect_failure("quantize " + quote(path("inf.npy").string()) + " -o " + out + " --format fp8_e4m3", "index [2, 9]");
  // Unreadable, missing and truncated inputs.
  expect_failure("quantize " + quote(path("missing.npy").string()) + " -o " + out + " --format nvfp4", "missing.npy");
  std::vector<uint8_t> whole = nibble::io::read_file_bytes(path("x.npy"));
  std::ofstream(path("cut.npy"), std::ios::binary).write(reinterpret_cast<const char*>(whole.data()), static_cast<std::streamsize>(whole.size() - 5));
  expect_failure("quantize " + quote(path("cut.npy").string()) + " -o " + out + " --format nvfp4", "truncated");
  std::ofstream(path("junk.npy")) << "this is not numpy";
  expect_failure("quantize " + quote(path("junk.npy").string()) + " -o " + out + " --format nvfp4", "not a .npy file");
  // Options.
  expect_failure("quantize " + x + " -o " + out + " --format nvfp4 --frobnicate", "--frobnicate");
  expect_failure("quantize " + x + " -o " + out + " --format nvfp5", "unknown format 'nvfp5': use one of nvfp4, mxfp4, mxfp8, fp8_e4m3, fp8_e5m2");
  expect_failure("quantize " + x + " -o " + out, "--format");
  expect_failure("quantize " + x + " --format nvfp4", "--output");
  expect_failure("quantize " + x + " -o " + out + " --format nvfp4 --block 2x8", "its blocks are 1x16 or 16x16");
  expect_failure("quantize " + x + " -o " + out + " --format mxfp4 --block 16x16", "its blocks are 1x32");
  expect_failure("quantize " + x + " -o " + out + " --format nvfp4 --rounding up", "unknown --rounding 'up'");
  expect_failure("quantize " + x + " -o " + out + " --format nvfp4 --seed 3", "--seed only applies with --rounding sr");
  expect_failure("quantize " + x + " -o " + out + " --format nvfp4 --rounding sr --seed minus", "--seed");
  expect_failure("quantize " + x + " -o " + out + " --format mxfp8 --rounding sr", "stochastic rounding applies");
  expect_failure("quantize " + x + " -o " + out + " --format fp8_e4m3 --rht", "apply to nvfp4 only");
  expect_failure("quantize " + x + " -o " + out + " --format nvfp4 --four-over-six --four-over-six-error l2",
                 "--four-over-six-error 'l2' is not a Four Over Six error measure: use mae");
  expect_failure("quantize " + x + " -o " + out + " --format nvfp4 --four-over-six --four-over-six-e4m3-max 300",
                 "--four-over-six-e4m3-max '300' is not a valid E4M3 ceiling");
  expect_failure("quantize " + x + " -o " + out + " --format nvfp4 --four-over-six --four-over-six-e4m3-max 300",
                 "use 448 (TE's default");
  expect_failure("quantize " + x + " -o " + out + " --format nvfp4 --four-over-six-error mse",
                 "--four-over-six-error only applies with --four-over-six");
  expect_failure("quantize " + x + " -o " + out + " --format nvfp4 --four-over-six-e4m3-max 256",
                 "--four-over-six-e4m3-max only applies with --four-over-six");
  write_matrix("rows8.npy", random_matrix(8, 32, 4), 8, 32);
  expect_failure("quantize " + quote(path("rows8.npy").string()) + " -o " + out + " --format nvfp4 --block 16x16 --transposed",
                 "multiple of 16 rows");
  expect_failure("quantize " + x + " -o " + quote(path("no/such/dir/out.safetensors").string()) + " --format nvfp4",
                 "cannot create output file");
  expect_failure("frobnicate", "unknown command 'frobnicate'");
}

TEST_F(CliQuantize, DequantizeRejectsDamagedFiles) {
  write_matrix("x.npy", random_matrix(16, 64, 8), 16, 64);
  ASSERT_EQ(run("quantize " + quote(path("x.npy").string()) + " -o " + quote(path("q.safetensors").string()) + " --format nvfp4").exit_code, 0);
  const nibble::io::SafetensorsFile good = nibble::io::read_safetensors(path("q.safetensors"));
  const std::string out = quote(path("out.npy").string());
  auto expect_damaged = [&](const std::string& name, const nibble::io::SafetensorsFile& f, const std::string& expected) {
    nibble::io::write_safetensors(path(name), f);
    expect_failure("dequantize " + quote(path(name).string()) + " -o " + out, expected);
  };

  auto f = good;
  f.metadata.erase("format");
  expect_damaged("a.safetensors", f, "the metadata key 'format' is missing");
  f = good;
  f.metadata["format"] = "int4";
  expect_damaged("b.safetensors", f, "unknown format 'int4'");
  f = good;
  f.metadata["block"] = "1x32";
  expect_damaged("c.safetensors", f, "metadata block '1x32' does not fit format nvfp4");
  f = good;
  f.metadata["rows"] = "15";
  expect_damaged("d.safetensors", f, "tensor 'codes' has shape [16, 32], expected [15, 32]");
  f = good;
  f.metadata["cols"] = "-64";
  expect_damaged("e.safetensors", f, "expected a positive integer");
  f = good;
  f.metadata["rht"] = "yes";
  expect_damaged("f.safetensors", f, "expected true or false");
  f = good;
  f.tensors.erase("scales");
  expect_damaged("g.safetensors", f, "the tensor 'scales' is missing");
  f = good;
  f.tensors["scales"].dtype = DType::U8;
  expect_damaged("h.safetensors", f, "tensor 'scales' has dtype U8, expected F8_E4M3");
  f = good;
  f.tensors["scales"].data[3] = 0x7F;
  expect_damaged("i.safetensors", f, "scales[3] = 0x7F is not a valid unsigned E4M3 block scale");
  f = good;
  const float nan = NAN;
  std::memcpy(f.tensors["amax"].data.data(), &nan, 4);
  expect_damaged("j.safetensors", f, "amax");
  f = good;
  f.tensors["extra"] = nibble::io::make_tensor(DType::U8, {1}, std::vector<uint8_t>{0});
  expect_damaged("k.safetensors", f, "unexpected tensor 'extra'");

  // Four Over Six metadata that does not fit.
  f = good;
  f.metadata["four_over_six_e4m3_max"] = "256";
  expect_damaged("l.safetensors", f, "four_over_six is false, so four_over_six_error must be mae and four_over_six_e4m3_max 448");
  f = good;
  f.metadata["four_over_six_error"] = "huber";
  expect_damaged("m.safetensors", f, "metadata four_over_six_error 'huber'");
  f = good;
  f.metadata["four_over_six"] = "true";
  f.metadata["four_over_six_e4m3_max"] = "300";
  expect_damaged("n.safetensors", f, "metadata four_over_six_e4m3_max '300'");
  f = good;
  f.metadata.erase("four_over_six_error");
  expect_damaged("o.safetensors", f, "only one of four_over_six_error and four_over_six_e4m3_max");

  // Truncated and foreign files.
  std::vector<uint8_t> bytes = nibble::io::read_file_bytes(path("q.safetensors"));
  std::ofstream(path("cut.safetensors"), std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size() - 7));
  expect_failure("dequantize " + quote(path("cut.safetensors").string()) + " -o " + out, "truncated");
  expect_failure("dequantize " + quote(path("x.npy").string()) + " -o " + out, "x.npy");
  expect_failure("dequantize " + quote(path("missing.safetensors").string()) + " -o " + out, "missing.safetensors");
  // --stats needs the original; the reference must match.
  const std::string q = quote(path("q.safetensors").string());
  expect_failure("dequantize " + q + " -o " + out + " --stats", "--stats needs the original tensor");
  write_matrix("small.npy", random_matrix(16, 32, 1), 16, 32);
  expect_failure("dequantize " + q + " -o " + out + " --reference " + quote(path("small.npy").string()),
                 "does not match the quantized tensor's [16, 64]");
  expect_failure("dequantize " + q + " -o " + out + " --bogus", "--bogus");
}

TEST_F(CliQuantize, FourOverSixFilesWithoutTheNewKeysReadAsBefore) {
  // Files written before four_over_six_error / four_over_six_e4m3_max existed used the fixed global
  // numerator 256 * 6: without the keys, four_over_six=true reads as e4m3_max 256 (and the old
  // squared-error rule as mse), so such a file dequantizes to what it always did.
  const int64_t rows = 16, cols = 64;
  const std::vector<float> x = random_matrix(rows, cols, 21);
  write_matrix("x.npy", x, rows, cols);
  const std::string q = quote(path("q.safetensors").string()), y = quote(path("y.npy").string());
  ASSERT_EQ(run("quantize " + quote(path("x.npy").string()) + " -o " + q +
                " --format nvfp4 --four-over-six --four-over-six-error mse --four-over-six-e4m3-max 256").exit_code, 0);
  nibble::io::SafetensorsFile file = nibble::io::read_safetensors(path("q.safetensors"));
  EXPECT_EQ(file.metadata_value("four_over_six_e4m3_max"), "256");
  ASSERT_EQ(run("dequantize " + q + " -o " + y).exit_code, 0);
  const std::vector<float> with_keys = nibble::io::read_npy(path("y.npy")).data;
  file.metadata.erase("four_over_six_error");
  file.metadata.erase("four_over_six_e4m3_max");
  nibble::io::write_safetensors(path("old.safetensors"), file);
  ASSERT_EQ(run("dequantize " + quote(path("old.safetensors").string()) + " -o " + y).exit_code, 0);
  EXPECT_EQ(nibble::io::read_npy(path("y.npy")).data, with_keys);
  // The library's values for the same file content.
  nibble::QuantOptions o;
  o.four_over_six = true;
  o.four_over_six_error = nibble::FourOverSixError::mse;
  o.four_over_six_e4m3_max = 256;
  std::vector<float> library(static_cast<size_t>(rows * cols));
  nibble::cpu::dequantize(nibble::cpu::quantize(x, rows, cols, o), library);
  EXPECT_EQ(with_keys, library);
  // TE's default ceiling (448) is a different tensor: its stats line names the knobs.
  RunResult d = run("quantize " + quote(path("x.npy").string()) + " -o " + q + " --format nvfp4 --four-over-six --stats");
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_NE(d.out.find("four-over-six mae e4m3-max 448"), std::string::npos) << d.out;
  EXPECT_EQ(nibble::io::read_safetensors(path("q.safetensors")).metadata_value("four_over_six_e4m3_max"), "448");
}

TEST_F(CliQuantize, NumpyInterop) {
  if (std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "/usr/bin/python3 cannot import numpy (install python3-numpy) - numpy interop not tested";
  const std::string script = path("interop.py").string();
  std::ofstream(script) << R"PY(
import json, struct, subprocess, sys
import numpy as np
nibble, work = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(0)
for dtype, fmt, limit in [(np.float32, "nvfp4", 0.12), (np.float16, "nvfp4", 0.12), (np.float32, "mxfp8", 0.05),
                          (np.float16, "fp8_e4m3", 0.05)]:
    x = rng.standard_normal((64, 128)).astype(dtype)
    np.save(f"{work}/x.npy", x)
    subprocess.run([nibble, "quantize", f"{work}/x.npy", "-o", f"{work}/q.safetensors", "--format", fmt], check=True)
    # The safetensors layout, read with nothing but json and numpy.
    raw = open(f"{work}/q.safetensors", "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    codes = header["codes"]
    assert codes["dtype"] == "U8", codes
    assert header["__metadata__"]["format"] == fmt, header["__metadata__"]
    begin, end = codes["data_offsets"]
    assert end - begin == int(np.prod(codes["shape"])), codes
    subprocess.run([nibble, "dequantize", f"{work}/q.safetensors", "-o", f"{work}/y.npy"], check=True)
    y = np.load(f"{work}/y.npy")
    assert y.dtype == np.float32 and y.shape == x.shape, (y.dtype, y.shape)
    xf = x.astype(np.float32)
    err = np.linalg.norm(xf - y) / np.linalg.norm(xf)
    print(f"{np.dtype(dtype).name} {fmt}: relative error {err:.4f}")
    assert err < limit, err
print("numpy interop ok")
)PY";
  const std::string cmd = "/usr/bin/python3 " + quote(script) + " " + quote(kNibble) + " " + quote(dir_.string()) + " 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[256];
  while (std::fgets(buffer, sizeof buffer, pipe)) output += buffer;
  const int status = ::pclose(pipe);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  EXPECT_NE(output.find("numpy interop ok"), std::string::npos) << output;
}
