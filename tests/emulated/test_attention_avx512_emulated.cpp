// The fused attention's AVX-512 product kernel (src/kernels/cpu/layers/attention_avx512.cpp) compiled against
// a software model of its intrinsics (avx512f_fma_intrinsics.h), run on any CPU against the scalar
// kernel bit for bit: its 4 x 4-vector tiles, 16-wide strips and tails. On CPUs with AVX-512,
// test_attention runs the real instructions the same way.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/layers/attention.h"

namespace nibble::cpu::attention_kernels {
namespace {

TEST(Avx512AttentionEmulated, ProductKernelMatchesTheScalarKernelBitForBit) {
  std::mt19937 rng(91);
  std::normal_distribution<float> normal;
  for (int64_t M : {1, 4, 7, 16})
    for (int64_t N : {5, 16, 33, 64, 80})
      for (int64_t K : {1, 9, 64})
        for (bool accumulate : {false, true}) {
          std::vector<float> A(static_cast<size_t>(M * K)), B(static_cast<size_t>(K * N)), C(static_cast<size_t>(M * N));
          for (auto* v : {&A, &B, &C})
            for (auto& x : *v) x = normal(rng);
          std::vector<float> want = C, got = C;
          matmul_scalar(M, N, K, A.data(), K, 1, B.data(), N, want.data(), N, accumulate);
          matmul_avx512(M, N, K, A.data(), K, 1, B.data(), N, got.data(), N, accumulate);
          ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
              << "M=" << M << " N=" << N << " K=" << K << " accumulate=" << accumulate;
        }
}

}  // namespace
}  // namespace nibble::cpu::attention_kernels
