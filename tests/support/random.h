// Random test inputs from fixed seeds. Each helper draws exactly what the loops it replaced drew
// (std::mt19937 seeded with `seed`, then one distribution object in element order), so a test that
// pins values or bits sees the same numbers it always did.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace nibble_test {

// n draws of N(0, scale^2).
inline std::vector<float> normal_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

inline std::vector<double> normal_doubles(size_t n, uint32_t seed, double scale = 1.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

// N(0, scale^2) with 1% outliers (x1000: blocks with very different scales), 1% tiny values
// (x1e-6: subnormal scales) and 1% zeros: the quantizers' hard cases.
inline std::vector<float> floats_with_outliers(size_t n, uint32_t seed, float scale = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::uniform_int_distribution<int> pick(0, 99);
  std::vector<float> v(n);
  for (auto& x : v) {
    x = normal(rng);
    const int p = pick(rng);
    if (p == 0) x *= 1000.0f;
    else if (p == 1) x *= 1e-6f;
    else if (p == 2) x = 0.0f;
  }
  return v;
}

// For the tests of summation order (test_distributed, test_cuda_collective): normal values scaled
// by 2^-10 .. 2^9, so that adding them in another order changes the bits.
inline std::vector<float> mixed_magnitude_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng) * std::exp2(static_cast<float>(static_cast<int>(rng() % 20) - 10));
  return v;
}

// n token ids below `vocab`, drawn as rng() % vocab from a generator the caller keeps (tokens and
// targets from one stream) or from mt19937(seed).
inline std::vector<int32_t> random_tokens(size_t n, int64_t vocab, std::mt19937& rng) {
  std::vector<int32_t> v(n);
  for (auto& t : v) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return v;
}
inline std::vector<int32_t> random_tokens(size_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  return random_tokens(n, vocab, rng);
}

}  // namespace nibble_test
