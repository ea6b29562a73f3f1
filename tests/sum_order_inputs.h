// Inputs for the tests of summation order (test_distributed, test_cuda_collective): normal values
// scaled by 2^-10 .. 2^9, so that adding them in another order changes the bits.
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

inline std::vector<float> mixed_magnitude_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng) * std::exp2(static_cast<float>(static_cast<int>(rng() % 20) - 10));
  return v;
}
