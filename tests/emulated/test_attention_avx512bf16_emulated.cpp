// The fused attention's AVX512-BF16 product kernel (src/kernels/cpu/layers/attention_avx512bf16.cpp)
// compiled against a software model of its intrinsics (avx512bf16_intrinsics.h: vdpbf16ps as the
// Intel SDM's pseudo-code), run on any CPU against the scalar pair-order kernel bit for bit: its
// pair packing (odd K's half-empty last pair), 4 x 4-vector tiles, 16-wide strips and tails. On CPUs
// with AVX512-BF16, test_attention runs the real instruction the same way.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "format/codecs.h"
#include "kernels/cpu/layers/attention.h"

namespace nibble::cpu::attention_kernels {
namespace {

TEST(Avx512Bf16AttentionEmulated, PairProductKernelMatchesTheScalarKernelBitForBit) {
  std::mt19937 rng(93);
  std::normal_distribution<float> normal;
  const auto bf16 = [&] { return round_to_bf16(std::ldexp(normal(rng), static_cast<int>(rng() % 9) - 4)); };
  for (int64_t M : {1, 4, 7, 16})
    for (int64_t N : {5, 16, 33, 64, 80})
      for (int64_t K : {1, 2, 9, 64})
        for (int a_layout : {0, 1, 2})  // A's rows, its columns, every other element of its rows
          for (bool accumulate : {false, true}) {
            std::vector<float> A(static_cast<size_t>(2 * M * K)), B(static_cast<size_t>(K * N)), C(static_cast<size_t>(M * N));
            for (auto* v : {&A, &B})
              for (auto& x : *v) x = bf16();
            for (auto& x : C) x = normal(rng);
            const int64_t a_row = a_layout == 0 ? K : a_layout == 1 ? 1 : 2 * K, a_k = a_layout == 0 ? 1 : a_layout == 1 ? M : 2;
            const bool transposed_a = a_layout == 1;
            std::vector<float> want = C, got = C;
            pair_matmul_scalar(M, N, K, A.data(), a_row, a_k, B.data(), N, want.data(), N, accumulate);
            pair_matmul_avx512bf16(M, N, K, A.data(), a_row, a_k, B.data(), N, got.data(), N, accumulate);
            ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
                << "M=" << M << " N=" << N << " K=" << K << " A layout " << a_layout << " transposed " << transposed_a
                << " accumulate=" << accumulate;
          }
}

}  // namespace
}  // namespace nibble::cpu::attention_kernels
