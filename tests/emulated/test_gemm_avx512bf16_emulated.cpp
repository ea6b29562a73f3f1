// The AVX512-BF16 GEMM micro-kernel (src/kernels/cpu/gemm/gemm_avx512bf16.cpp) compiled against a software
// model of its intrinsics (avx512bf16_intrinsics.h), run on any CPU: packing (gemm_pack.cpp, the real
// one) + kernel over several K chunks against a scalar statement of what vdpbf16ps computes on the
// BF16-rounded operands. It checks nibble's layout and indexing, not the instruction: on CPUs with
// AVX512-BF16, test_gemm runs the real kernel against the FP64 reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "format/codecs.h"
#include "kernels/cpu/gemm/gemm_kernels.h"

namespace nibble::cpu::gemm_detail {
namespace {

// What vdpbf16ps does per k pair (Intel SDM order: k + 1 first, then k), on BF16-rounded values.
float pair_dot_model(const std::vector<float>& a, const std::vector<float>& b, int64_t K, int64_t m, int64_t n,
                     int64_t lda, int64_t ldb) {
  float acc = 0.0f;
  for (int64_t k = 0; k < K; k += 2) {
    const float a1 = k + 1 < K ? round_to_bf16(a[m * lda + k + 1]) : 0.0f;
    const float b1 = k + 1 < K ? round_to_bf16(b[n * ldb + k + 1]) : 0.0f;
    acc = std::fma(a1, b1, acc);
    acc = std::fma(round_to_bf16(a[m * lda + k]), round_to_bf16(b[n * ldb + k]), acc);
  }
  return acc;
}

TEST(Avx512Bf16Emulated, PackedPanelsAndKernelMatchThePairModel) {
  const MicroKernel kernel = bf16_pair_micro_kernel_avx512bf16();
  std::mt19937 rng(77);
  std::normal_distribution<float> normal;
  // Odd K (a half-filled last pair), edge panels (rows/columns past the matrix), A stored either way.
  for (const int64_t K : {1, 2, 37, 300, 513}) {
    for (const bool k_contiguous : {true, false}) {
      const int64_t rows_a = 5, rows_b = 27;  // fewer than the panel's 8 rows / 32 columns
      const int64_t lda = K + 3, ldb = K + 1;
      std::vector<float> a(static_cast<size_t>(rows_a * lda)), b(static_cast<size_t>(rows_b * ldb));
      for (float& x : a) x = normal(rng);
      for (float& x : b) x = normal(rng);
      // The transposed storage of A: element (m, k) at at[k * rows_a + m].
      std::vector<float> at(static_cast<size_t>(K * rows_a));
      for (int64_t m = 0; m < rows_a; ++m)
        for (int64_t k = 0; k < K; ++k) at[k * rows_a + m] = a[m * lda + k];
      const F32Operand ao = k_contiguous ? F32Operand{a.data(), lda, rows_a, K, true}
                                         : F32Operand{at.data(), rows_a, rows_a, K, false};
      const F32Operand bo{b.data(), ldb, rows_b, K, true};
      const int64_t units = (K + 1) / 2;
      std::vector<uint8_t> pa(static_cast<size_t>(units * bf16_pair_a_unit_bytes()), 0xAB);
      std::vector<uint8_t> pb(static_cast<size_t>(units * bf16_pair_b_unit_bytes()), 0xCD);
      pack_bf16_pair_a_panel(ao, 0, pa.data());
      pack_bf16_pair_b_panel(bo, 0, pb.data());
      // The driver's walk over K chunks: the first call overwrites, the later ones accumulate.
      std::vector<float> acc(kMr * kNr, std::nanf(""));
      constexpr int64_t kChunkUnits = 100;
      for (int64_t u0 = 0; u0 < units; u0 += kChunkUnits)
        kernel(pa.data() + u0 * bf16_pair_a_unit_bytes(), pb.data() + u0 * bf16_pair_b_unit_bytes(),
               std::min(kChunkUnits, units - u0), acc.data(), u0 == 0);
      for (int64_t m = 0; m < kMr; ++m)
        for (int64_t n = 0; n < kNr; ++n) {
          const float want = m < rows_a && n < rows_b ? pair_dot_model(a, b, K, m, n, lda, ldb) : 0.0f;
          ASSERT_EQ(std::memcmp(&want, &acc[m * kNr + n], 4), 0)
              << "K=" << K << (k_contiguous ? " k-contiguous" : " transposed") << " C[" << m << "," << n
              << "] = " << acc[m * kNr + n] << ", model " << want;
        }
    }
  }
}

// Per-tensor FP8 codes go through the same pair panels with their exact BF16 values.
TEST(Avx512Bf16Emulated, Fp8PanelsHoldTheExactValues) {
  QuantizedTensor q;
  q.format = Format::fp8_e4m3;
  q.block = BlockShape::per_tensor;
  q.rows = 3;
  q.cols = 5;
  q.codes = {0x00, 0x38, 0xB8, 0x7E, 0x01, 0x40, 0x41, 0x42, 0x43, 0x44, 0x7E, 0xFE, 0x08, 0x10, 0x20};
  const int64_t units = 3;
  std::vector<uint8_t> panel(static_cast<size_t>(units * bf16_pair_a_unit_bytes()));
  pack_bf16_pair_fp8_a_panel(q, 0, panel.data());
  for (int64_t p = 0; p < units; ++p)
    for (int r = 0; r < kMr; ++r) {
      uint32_t word;
      std::memcpy(&word, panel.data() + (p * kMr + r) * 4, 4);
      for (int half = 0; half < 2; ++half) {
        const int64_t k = 2 * p + half;
        const float want = r < q.rows && k < q.cols ? e4m3_decode(q.codes[r * q.cols + k]) : 0.0f;
        const float got = bf16_to_float(bf16{static_cast<uint16_t>(half ? word >> 16 : word & 0xFFFF)});
        EXPECT_EQ(got, want) << "row " << r << " k " << k;
      }
    }
}

}  // namespace
}  // namespace nibble::cpu::gemm_detail
