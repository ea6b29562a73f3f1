// Inputs of the emulated GEMM tests: values spread over 16 binades, one magnitude per 16 values, so
// that block scales cover a wide E4M3 / E8M0 range, and their quantized form.
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/quantize/quantize.h"

namespace nibble::emulated_tests {

inline std::vector<float> spread_values(int64_t rows, int64_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> octave(-8.0f, 8.0f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  float magnitude = 1.0f;
  for (size_t i = 0; i < x.size(); ++i) {
    if (i % 16 == 0) magnitude = std::exp2(octave(rng));
    x[i] = normal(rng) * magnitude;
  }
  return x;
}

inline QuantizedTensor quantized(Format format, int64_t rows, int64_t cols, uint64_t seed, bool tile_16x16 = false) {
  QuantOptions opt;
  opt.format = format;
  opt.tile_16x16 = tile_16x16;
  return cpu::quantize(spread_values(rows, cols, seed), rows, cols, opt);
}

}  // namespace nibble::emulated_tests
