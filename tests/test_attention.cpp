// The fused CPU attention (src/kernels/cpu/layers/attention*): its product kernel is the same bits on every
// ISA this CPU runs, and the whole forward and backward are the same bits for any thread count.
// (Agreement with the double-precision reference loops is in test_model_layers.)
#include <gtest/gtest.h>
#include <omp.h>

#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/layers/attention.h"
#include "kernels/cpu/common/cpu_features.h"
#include "kernels/cpu/gemm/gemm.h"
#include "kernels/cpu/gemm/gemm_kernels.h"
#include "format/codecs.h"
#include "support/check.h"
#include "support/random.h"

namespace nibble::cpu {
namespace {

using nibble_test::normal_floats;
using nibble_test::same_bits;

// One FMA chain per output in k order, written out: what every variant must produce bit for bit.
void matmul_model(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_row, int64_t a_k, const float* B,
                  int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float c = accumulate ? C[m * ldc + n] : 0.0f;
      for (int64_t k = 0; k < K; ++k) c = std::fma(A[m * a_row + k * a_k], B[k * ldb + n], c);
      C[m * ldc + n] = c;
    }
}

TEST(FusedAttention, ProductKernelIsTheFmaChainOnEveryIsa) {
  std::vector<std::pair<const char*, attention_kernels::Matmul>> variants = {{"scalar", &attention_kernels::matmul_scalar}};
  if (detected_isa() >= Isa::avx2) variants.emplace_back("avx2", &attention_kernels::matmul_avx2);
  if (detected_isa() >= Isa::avx512) variants.emplace_back("avx512", &attention_kernels::matmul_avx512);
  uint32_t seed = 1;
  // Row counts around the 4-row tile, columns around every vector strip (8, 16, 64) with tails, A
  // read row-major (a_row = K) and transposed (a_k = M), into a fresh or an accumulated C.
  for (int64_t M : {1, 3, 4, 9, 16})
    for (int64_t N : {1, 7, 8, 16, 23, 64, 70})
      for (int64_t K : {1, 5, 64})
        for (bool transposed_a : {false, true})
          for (bool accumulate : {false, true}) {
            const auto A = normal_floats(static_cast<size_t>(M * K), seed++);
            const auto B = normal_floats(static_cast<size_t>(K * (N + 2)), seed++);
            const auto C0 = normal_floats(static_cast<size_t>(M * (N + 1)), seed++);
            const int64_t a_row = transposed_a ? 1 : K, a_k = transposed_a ? M : 1;
            std::vector<float> want = C0;
            matmul_model(M, N, K, A.data(), a_row, a_k, B.data(), N + 2, want.data(), N + 1, accumulate);
            for (const auto& [name, matmul] : variants) {
              std::vector<float> got = C0;
              matmul(M, N, K, A.data(), a_row, a_k, B.data(), N + 2, got.data(), N + 1, accumulate);
              ASSERT_TRUE(same_bits(got, want)) << name << " M=" << M << " N=" << N << " K=" << K
                                                << " transposed_a=" << transposed_a << " accumulate=" << accumulate;
            }
          }
}

// BF16 operands' product in pair order (k + 1, then k, per pair; a last odd k alone), written out:
// what every pair variant, vdpbf16ps included, must produce bit for bit.
void pair_matmul_model(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_row, int64_t a_k, const float* B,
                       int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float c = accumulate ? C[m * ldc + n] : 0.0f;
      for (int64_t k = 0; k < K; k += 2) {
        if (k + 1 < K) c = std::fma(A[m * a_row + (k + 1) * a_k], B[(k + 1) * ldb + n], c);
        c = std::fma(A[m * a_row + k * a_k], B[k * ldb + n], c);
      }
      C[m * ldc + n] = c;
    }
}

// Random BF16 values (as the products' operands are: rounded, subnormals flushed), magnitudes over
// a few binades so that sums round.
std::vector<float> bf16_floats(size_t n, uint32_t seed) {
  std::vector<float> v = normal_floats(n, seed);
  std::mt19937 rng(seed);
  for (float& x : v) x = round_to_bf16(std::ldexp(x, static_cast<int>(rng() % 9) - 4));
  return v;
}

TEST(FusedAttention, BF16ProductKernelIsThePairOrderOnEveryIsa) {
  std::vector<std::pair<const char*, attention_kernels::Matmul>> variants = {
      {"scalar", &attention_kernels::pair_matmul_scalar}};
  if (detected_isa() >= Isa::avx2) variants.emplace_back("avx2", &attention_kernels::pair_matmul_avx2);
  if (detected_isa() >= Isa::avx512) variants.emplace_back("avx512", &attention_kernels::pair_matmul_avx512);
  // The CPU's own vdpbf16ps: the pair order is the Intel SDM's, which this checks on the CPU at hand.
  if (detected_isa() >= Isa::avx512bf16) variants.emplace_back("avx512bf16", &attention_kernels::pair_matmul_avx512bf16);
  uint32_t seed = 300;
  for (int64_t M : {1, 3, 4, 9, 16})
    for (int64_t N : {1, 7, 16, 23, 64, 70, 130})
      for (int64_t K : {1, 2, 5, 16, 64})
        for (bool transposed_a : {false, true})
          for (bool accumulate : {false, true}) {
            const auto A = bf16_floats(static_cast<size_t>(M * K), seed++);
            const auto B = bf16_floats(static_cast<size_t>(K * (N + 2)), seed++);
            const auto C0 = normal_floats(static_cast<size_t>(M * (N + 1)), seed++);
            const int64_t a_row = transposed_a ? 1 : K, a_k = transposed_a ? M : 1;
            std::vector<float> want = C0;
            pair_matmul_model(M, N, K, A.data(), a_row, a_k, B.data(), N + 2, want.data(), N + 1, accumulate);
            for (const auto& [name, matmul] : variants) {
              std::vector<float> got = C0;
              matmul(M, N, K, A.data(), a_row, a_k, B.data(), N + 2, got.data(), N + 1, accumulate);
              ASSERT_TRUE(same_bits(got, want)) << name << " M=" << M << " N=" << N << " K=" << K
                                                << " transposed_a=" << transposed_a << " accumulate=" << accumulate;
            }
          }
  // Not vacuous: on long sums the pair order and the k order differ somewhere.
  const int64_t M = 16, N = 64, K = 256;
  const auto A = bf16_floats(M * K, 7), B = bf16_floats(K * N, 8);
  std::vector<float> pairs(M * N), k_order(M * N);
  attention_kernels::pair_matmul_scalar(M, N, K, A.data(), K, 1, B.data(), N, pairs.data(), N, false);
  matmul_model(M, N, K, A.data(), K, 1, B.data(), N, k_order.data(), N, false);
  EXPECT_FALSE(same_bits(pairs, k_order));
}

TEST(FusedAttention, TransposeIsTheSameCopyOnEveryIsa) {
  // Sequence lengths and head widths around the 8 x 8 register blocks, read from a wider row stride
  // (a head inside qkv's rows) into a wider destination stride.
  std::vector<std::pair<const char*, attention_kernels::Transpose>> variants = {
      {"scalar", &attention_kernels::transpose_scalar}};
  if (detected_isa() >= Isa::avx2) variants.emplace_back("avx2", &attention_kernels::transpose_avx2);
  uint32_t seed = 100;
  for (int64_t rows : {1, 7, 8, 9, 16, 37})
    for (int64_t cols : {1, 5, 8, 12, 64}) {
      const int64_t src_stride = cols + 3, dst_stride = rows + 2;
      const auto src = normal_floats(static_cast<size_t>(rows * src_stride), seed++);
      std::vector<float> want(static_cast<size_t>(cols * dst_stride), -1.0f);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) want[c * dst_stride + r] = src[r * src_stride + c];
      for (const auto& [name, transpose] : variants) {
        std::vector<float> got(want.size(), -1.0f);  // the padding past `rows` must stay untouched
        transpose(src.data(), src_stride, rows, cols, got.data(), dst_stride);
        ASSERT_TRUE(same_bits(got, want)) << name << " rows=" << rows << " cols=" << cols;
      }
    }
}

struct AttentionRun {
  std::vector<float> out, stats, dqkv;
};

AttentionRun run_attention(const AttentionShape& s, const std::vector<float>& qkv, const std::vector<float>& dout) {
  AttentionRun r{std::vector<float>(static_cast<size_t>(s.batch * s.seq * s.out_width())),
                 std::vector<float>(static_cast<size_t>(s.softmax_stats_size())),
                 std::vector<float>(qkv.size(), 3.0f)};  // garbage: backward overwrites every gradient
  attention_forward(s, qkv.data(), r.out.data(), r.stats.data());
  attention_backward(s, qkv.data(), r.stats.data(), dout.data(), r.dqkv.data());
  return r;
}

TEST(FusedAttention, SameBitsForAnyThreadCount) {
  const int saved = omp_get_max_threads();
  // Several query blocks with a partial last one (seq 37), GQA and MQA, a head width with a vector tail.
  for (const AttentionShape base : {AttentionShape{3, 37, 4, 2, 16}, AttentionShape{2, 40, 3, 1, 12},
                                    AttentionShape{2, 33, 2, 2, 64}})
    for (bool bf16 : {false, true}) {
      AttentionShape s = base;
      s.bf16_matmuls = bf16;
      const auto qkv = normal_floats(static_cast<size_t>(s.batch * s.seq * s.qkv_stride()), 5);
      const auto dout = normal_floats(static_cast<size_t>(s.batch * s.seq * s.out_width()), 6);
      omp_set_num_threads(1);
      const AttentionRun one = run_attention(s, qkv, dout);
      for (int threads : {2, 3, 5}) {
        omp_set_num_threads(threads);
        const AttentionRun many = run_attention(s, qkv, dout);
        EXPECT_TRUE(same_bits(one.out, many.out)) << threads << " threads, bf16=" << bf16;
        EXPECT_TRUE(same_bits(one.stats, many.stats)) << threads << " threads, bf16=" << bf16;
        EXPECT_TRUE(same_bits(one.dqkv, many.dqkv)) << threads << " threads, bf16=" << bf16;
      }
    }
  omp_set_num_threads(saved);
}

// With vdpbf16ps the whole forward and backward give the AVX-512 FMA kernels' bits (the two share
// exp_f32's AVX-512 variant; the product kernels of every ISA are compared above): vdpbf16ps over a
// head's K^T, V, V^T and K packed once, and the per-call packing for dK and dV. Shapes: partial and
// odd last query blocks (37, 33: an odd last pair), head widths below, at and above one vector (12,
// 16, 64), GQA and MQA. Inputs over several binades, with tiny gradients whose BF16 roundings are
// subnormal (flushed on both).
TEST(FusedAttention, AvxBf16AttentionIsTheAvx512Bits) {
  if (detected_isa() < Isa::avx512bf16) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  for (const AttentionShape base : {AttentionShape{2, 37, 4, 2, 16}, AttentionShape{2, 40, 3, 1, 12},
                                    AttentionShape{1, 33, 2, 2, 64}, AttentionShape{1, 70, 2, 1, 64}})
    for (bool bf16 : {false, true}) {
      AttentionShape s = base;
      s.bf16_matmuls = bf16;
      auto qkv = normal_floats(static_cast<size_t>(s.batch * s.seq * s.qkv_stride()), 15, 2.0f);
      auto dout = normal_floats(static_cast<size_t>(s.batch * s.seq * s.out_width()), 16);
      for (size_t i = 0; i < dout.size(); i += 97) dout[i] = std::ldexp(dout[i], -130);  // subnormal in BF16
      set_isa_limit(Isa::avx512);
      const AttentionRun fma = run_attention(s, qkv, dout);
      set_isa_limit(Isa::avx512bf16);  // (on AMX-BF16 CPUs the BF16 products take the tiles: tested below)
      set_bf16_pair_kernel(Bf16PairKernel::dpbf16);  // even where two FMAs are faster and chosen
      const AttentionRun dpbf16 = run_attention(s, qkv, dout);
      set_bf16_pair_kernel(std::nullopt);
      EXPECT_TRUE(same_bits(fma.out, dpbf16.out)) << "bf16=" << bf16 << " hd=" << s.head_dim;
      EXPECT_TRUE(same_bits(fma.stats, dpbf16.stats)) << "bf16=" << bf16 << " hd=" << s.head_dim;
      EXPECT_TRUE(same_bits(fma.dqkv, dpbf16.dqkv)) << "bf16=" << bf16 << " hd=" << s.head_dim;
    }
  set_isa_limit(detected_isa());
}

// On AMX-BF16 CPUs attention's BF16 products run on the tiles, with the tile unit's own FP32
// summation (as these CPUs' GEMMs do): each output within the FP32 accumulation bound of the exact
// product of the same BF16 values. The call forms attention makes: A along its rows or down its
// columns, a prefix k of B's K rows, accumulating or not, edges of the 32 x 32 micro-tile.
// (test_gemm_bf16_amx_emulated runs the same code in the tile model's order on any CPU.)
TEST(FusedAttention, AmxProductIsWithinTheFp32BoundOfTheExactProduct) {
  if (!amx_bf16_active()) GTEST_SKIP() << "no AMX-BF16 on this CPU";
  using namespace gemm_detail;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto bf16_values = [&](size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = round_to_bf16(normal(rng));
    return v;
  };
  const double u = std::ldexp(1.0, -24);
  for (const auto& [M, N, K, k] : {std::array<int64_t, 4>{16, 70, 64, 64}, {37, 33, 100, 45}, {70, 64, 256, 200},
                                  {1, 1, 32, 1}})
    for (bool a_down_columns : {false, true})
      for (bool accumulate : {false, true}) {
        const int64_t ldb = N + 3, ldc = N + 5, a_ld = a_down_columns ? M + 2 : k + 2;
        const std::vector<float> b = bf16_values(static_cast<size_t>(K * ldb));
        const std::vector<float> a = bf16_values(static_cast<size_t>((a_down_columns ? k : M) * a_ld));
        const std::vector<float> c0 = normal_floats(static_cast<size_t>(M * ldc), 9);
        std::vector<float> c = c0;
        std::vector<uint8_t> panels(static_cast<size_t>(bf16_panels_bytes(K, N))), a_panels(static_cast<size_t>(bf16_panels_bytes(k, M)));
        std::vector<float> acc(static_cast<size_t>(kBf16Panel * kBf16AccStride));
        pack_bf16_b_panels(K, N, b.data(), ldb, panels.data());
        const int64_t a_row = a_down_columns ? 1 : a_ld, a_k = a_down_columns ? a_ld : 1;
        bf16_product_amx(M, N, k, a.data(), a_row, a_k, panels.data(), bf16_units(K), c.data(), ldc, accumulate,
                         a_panels.data(), acc.data());
        for (int64_t m = 0; m < M; ++m) {
          for (int64_t n = 0; n < N; ++n) {
            double exact = accumulate ? c0[m * ldc + n] : 0.0, magnitude = 0.0;
            for (int64_t j = 0; j < k; ++j) {
              const double p = static_cast<double>(a[m * a_row + j * a_k]) * b[j * ldb + n];
              exact += p, magnitude += std::fabs(p);
            }
            const double bound = (k + 2) * u * magnitude + (accumulate ? 2 * u * std::fabs(c0[m * ldc + n]) : 0.0);
            ASSERT_LE(std::fabs(c[m * ldc + n] - exact), bound) << M << "x" << N << " k=" << k << " m=" << m << " n=" << n;
          }
          for (int64_t n = N; n < ldc; ++n) ASSERT_EQ(c[m * ldc + n], c0[m * ldc + n]) << "wrote past N";
        }
      }
}

TEST(FusedAttention, Bf16RoundsTheOperandsOnly) {
  // With operands that are BF16 already (and probabilities 1: one key), bf16_matmuls changes nothing.
  AttentionShape s{1, 1, 2, 1, 8};
  std::vector<float> qkv(static_cast<size_t>(s.qkv_stride()));
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<float>(static_cast<int>(i) - 7) * 0.25f;
  const std::vector<float> dout(static_cast<size_t>(s.out_width()), 0.5f);
  const AttentionRun fp32 = run_attention(s, qkv, dout);
  s.bf16_matmuls = true;
  const AttentionRun bf16 = run_attention(s, qkv, dout);
  EXPECT_TRUE(same_bits(fp32.out, bf16.out));
  EXPECT_TRUE(same_bits(fp32.dqkv, bf16.dqkv));
  // A single key: the output is its value vector, exactly.
  for (int64_t h = 0; h < s.heads; ++h)
    for (int64_t i = 0; i < s.head_dim; ++i) EXPECT_EQ(fp32.out[h * s.head_dim + i], qkv[(s.heads + 1) * s.head_dim + i]);
}

}  // namespace
}  // namespace nibble::cpu
