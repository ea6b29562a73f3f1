// Row-scaled NVFP4 against Transformer Engine's reference arithmetic: nibble's bytes (reference and
// fast CPU path) on fresh random tensors are handed to tests/te_reference/row_scaled_nvfp4.py, a
// NumPy port of TE's reference_nvfp4.py (NVFP4QuantizerRef, row_scaled_nvfp4=True) with codecs of
// its own, which recomputes every code, block scale, row amax and row S_dec and compares them. TE's
// module itself imports CUDA-only pieces, so its arithmetic is ported rather than imported.
//
// The random seed changes every run and is printed on failure; set NIBBLE_TEST_SEED to replay.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "format/codecs.h"
#include "format/quantize.h"
#include "io/npy.h"
#include "kernels/cpu/quantize/quantize.h"
#include "support/random.h"

using namespace nibble;

namespace {

uint64_t test_seed() {
  static const uint64_t seed = []() -> uint64_t {
    if (const char* e = std::getenv("NIBBLE_TEST_SEED")) return std::strtoull(e, nullptr, 10);
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) | rd();
  }();
  return seed;
}

// Rows of normal values whose magnitudes span 2^-40 .. 2^40, some all zero, some with one outlier.
std::vector<float> activation_like(std::mt19937_64& rng, int64_t rows, int64_t cols) {
  std::normal_distribution<float> normal;
  std::student_t_distribution<float> heavy(3.0f);
  std::uniform_real_distribution<float> octave(-40.0f, 40.0f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const int kind = static_cast<int>(rng() % 6);
    const float row_scale = kind == 0 ? 0.0f : std::exp2(octave(rng));
    for (int64_t c = 0; c < cols; ++c) x[r * cols + c] = (kind == 1 ? heavy(rng) : normal(rng)) * row_scale;
    if (kind == 2) x[r * cols + rng() % cols] = row_scale * 1000.0f;
  }
  return x;
}

void write_case(const std::filesystem::path& dir, const std::string& name, const std::vector<float>& x,
                const QuantizedTensor& q) {
  const int64_t shape[] = {q.rows, q.cols};
  const int64_t scale_shape[] = {q.rows, q.cols / 16};
  const int64_t row_shape[] = {q.rows};
  io::write_npy(dir / (name + "_x.npy"), x, shape);
  std::vector<float> codes(static_cast<size_t>(q.rows * q.cols)), scales(q.scales.begin(), q.scales.end());
  for (size_t i = 0; i < codes.size(); ++i) {
    const uint8_t byte = q.codes[i / 2];
    codes[i] = i % 2 ? unpack_e2m1_hi(byte) : unpack_e2m1_lo(byte);
  }
  io::write_npy(dir / (name + "_codes.npy"), codes, shape);
  io::write_npy(dir / (name + "_scales.npy"), scales, scale_shape);
  io::write_npy(dir / (name + "_row_amax.npy"), q.row_amax, row_shape);
  io::write_npy(dir / (name + "_row_decode.npy"), q.row_decode_scale, row_shape);
}

}  // namespace

TEST(TeRowScaled, CodesScalesAndRowAmaxMatchTransformerEngineReference) {
  SCOPED_TRACE("random seed " + std::to_string(test_seed()) + " (replay: NIBBLE_TEST_SEED=" +
               std::to_string(test_seed()) + ")");
  std::mt19937_64 rng(test_seed());
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("nibble_te_row_scaled_" + std::to_string(test_seed()));
  std::filesystem::create_directories(dir);
  const QuantOptions row_scaled{.format = Format::nvfp4, .row_scaled = true};
  std::string cases;
  const std::pair<int64_t, int64_t> shapes[] = {{64, 256}, {48, 768}, {256, 128}, {1, 16}};
  int index = 0;
  for (auto [rows, cols] : shapes) {
    const std::vector<float> x = activation_like(rng, rows, cols);
    const std::string n = "case" + std::to_string(index++);
    // fprop's X: the reference quantizer and the fast path (must be the same bytes anyway).
    write_case(dir, n + "_ref", x, ref::quantize(x, rows, cols, row_scaled));
    write_case(dir, n + "_fast", x, cpu::quantize(x, rows, cols, row_scaled));
    cases += n + "_ref " + n + "_fast ";
    if (rows % 16 != 0) continue;
    // wgrad's X^T: TE quantizes x.t() with one amax per row of it (per column of x).
    std::vector<float> xt(x.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) xt[c * rows + r] = x[r * cols + c];
    write_case(dir, n + "_t", xt, cpu::quantize_transposed(x, rows, cols, row_scaled));
    cases += n + "_t ";
  }
  std::ofstream(dir / "cases.txt") << cases << "\n";
  const std::string command = std::string(NIBBLE_PYTHON3) + " " + NIBBLE_SOURCE_DIR +
                              "/tests/te_reference/row_scaled_nvfp4.py " + dir.string();
  const int status = std::system(command.c_str());
  EXPECT_EQ(status, 0) << command << " (inputs kept in " << dir << ")";
  if (status == 0) std::filesystem::remove_all(dir);
}
