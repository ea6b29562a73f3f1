// The AMX-BF16 GEMM path (src/kernels/cpu/gemm/gemm_bf16_amx.cpp: its packers for E2M1, FP8 and FP32
// operands of either storage order, and the 32x32 tile walk over K chunks) compiled against a software
// model of its AMX, AVX-512 and SSE intrinsics (amx_bf16_intrinsics.h), run on any CPU against a
// plain statement of the product in the model's order: per k pair, the odd product then the even one,
// on the values the packers must produce (E2M1 times its block scale and FP8 exactly, FP32 rounded to
// BF16). The tile unit's own FP32 rounding is tested where it exists (test_gemm, against FP64).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "format/codecs.h"
#include "kernels/cpu/gemm/gemm_kernels.h"
#include "spread_inputs.h"

namespace nibble::cpu::gemm_detail {
namespace {

using emulated_tests::quantized;
using emulated_tests::spread_values;

// BF16 round to nearest even of an FP32 value, subnormal inputs as zeros (vcvtne2ps2bf16).
float bf16_daz(float x) {
  if (std::fpclassify(x) == FP_SUBNORMAL) return std::copysign(0.0f, x);
  return round_to_bf16(x);
}

using Value = std::function<float(int64_t row, int64_t k)>;  // an operand's value, 0 past its edge

// The 32 x 32 accumulator (stride kBf16AccStride) for A rows and B columns [0, 32) over K.
std::vector<float> model(const Value& a, const Value& b, int64_t K) {
  std::vector<float> c(32 * kBf16AccStride, 0.0f);
  for (int64_t m = 0; m < 32; ++m)
    for (int64_t n = 0; n < 32; ++n) {
      float acc = 0.0f;
      for (int64_t k = 0; k < bf16_units(K) * kBf16UnitK; k += 2) {
        acc = acc + a(m, k + 1) * b(n, k + 1);
        acc = acc + a(m, k) * b(n, k);
      }
      c[m * kBf16AccStride + n] = acc;
    }
  return c;
}

void expect_kernel_matches(const std::vector<uint8_t>& pa, const std::vector<uint8_t>& pb, int64_t K,
                           const std::vector<float>& want, const std::string& what) {
  const int64_t units = bf16_units(K);
  amx_bf16_thread_begin();
  for (const int64_t chunk : {int64_t{1}, int64_t{3}, units}) {
    std::vector<float> acc(32 * kBf16AccStride, std::nanf(""));
    for (int64_t u0 = 0; u0 < units; u0 += chunk)
      bf16_micro_kernel_amx()(pa.data() + u0 * kBf16UnitBytes, pb.data() + u0 * kBf16UnitBytes, std::min(chunk, units - u0),
                              acc.data(), u0 == 0);
    for (int64_t m = 0; m < 32; ++m)
      for (int64_t n = 0; n < 32; ++n) {
        const int64_t i = m * kBf16AccStride + n;
        ASSERT_EQ(std::memcmp(&want[i], &acc[i], 4), 0)
            << what << " chunk " << chunk << ": C[" << m << "," << n << "] = " << acc[i] << ", model " << want[i];
      }
  }
}

std::vector<uint8_t> panel(int64_t K) { return std::vector<uint8_t>(static_cast<size_t>(bf16_units(K) * kBf16UnitBytes), 0xEE); }

TEST(AmxBf16Emulated, E2m1PanelsHoldEachValueTimesItsBlockScale) {
  uint64_t seed = 300;
  for (const Format format : {Format::nvfp4, Format::mxfp4})
    for (const auto& [a_rows, b_rows, K] : {std::tuple{32, 32, 64}, std::tuple{19, 27, 160}, std::tuple{32, 5, 32}}) {
      const QuantizedTensor qa = quantized(format, a_rows, K, seed++), qb = quantized(format, b_rows, K, seed++);
      const auto value_of = [](const QuantizedTensor& q) {
        return [&q](int64_t r, int64_t k) {
          if (r >= q.rows || k >= q.cols) return 0.0f;
          const uint8_t byte = q.codes[r * (q.cols / 2) + k / 2];
          const uint8_t s = q.scales[r * (q.cols / q.block_len()) + k / q.block_len()];
          return e2m1_decode(k % 2 ? byte >> 4 : byte & 15) * (q.format == Format::nvfp4 ? e4m3_decode(s) : e8m0_decode(s));
        };
      };
      std::vector<uint8_t> pa = panel(K), pb = panel(K);
      pack_bf16_a_panel(qa, 0, pa.data());
      pack_bf16_b_panel(qb, 0, pb.data());
      expect_kernel_matches(pa, pb, K, model(value_of(qa), value_of(qb), K),
                            std::string(to_string(format)) + " " + std::to_string(a_rows) + "x" + std::to_string(b_rows) +
                                " K=" + std::to_string(K));
    }
}

TEST(AmxBf16Emulated, Fp32PanelsEitherStorageOrderRoundToBf16) {
  // K not a multiple of 32 (a padded last unit, an odd last pair), edge rows, A stored either way.
  uint64_t seed = 400;
  for (const int64_t K : {1, 45, 96})
    for (const bool k_contiguous : {true, false}) {
      const int64_t a_rows = 23, b_rows = 32;
      std::vector<float> a = spread_values(a_rows, K, seed++), b = spread_values(b_rows, K, seed++);
      a[0] = 1e-40f;  // a subnormal: zero after the conversion
      std::vector<float> at(a.size());  // A as [K][rows]
      for (int64_t r = 0; r < a_rows; ++r)
        for (int64_t k = 0; k < K; ++k) at[k * a_rows + r] = a[r * K + k];
      const F32Operand ao = k_contiguous ? F32Operand{a.data(), K, a_rows, K, true} : F32Operand{at.data(), a_rows, a_rows, K, false};
      const F32Operand bo{b.data(), K, b_rows, K, true};
      std::vector<uint8_t> pa = panel(K), pb = panel(K);
      pack_bf16_a_panel(ao, 0, pa.data());
      pack_bf16_b_panel(bo, 0, pb.data());
      const auto value_of = [K](const std::vector<float>& x, int64_t rows) {
        return [&x, rows, K](int64_t r, int64_t k) { return r < rows && k < K ? bf16_daz(x[r * K + k]) : 0.0f; };
      };
      expect_kernel_matches(pa, pb, K, model(value_of(a, a_rows), value_of(b, b_rows), K),
                            "fp32 K=" + std::to_string(K) + (k_contiguous ? " k-contiguous" : " transposed"));
      // B stored [K][columns] too.
      std::vector<float> bt(b.size());
      for (int64_t r = 0; r < b_rows; ++r)
        for (int64_t k = 0; k < K; ++k) bt[k * b_rows + r] = b[r * K + k];
      std::vector<uint8_t> pbt = panel(K);
      pack_bf16_b_panel(F32Operand{bt.data(), b_rows, b_rows, K, false}, 0, pbt.data());
      EXPECT_EQ(pb, pbt) << "B stored transposed packs differently, K=" << K;
    }
}

TEST(AmxBf16Emulated, Fp8PanelsHoldTheExactValues) {
  uint64_t seed = 500;
  for (const Format format : {Format::fp8_e4m3, Format::fp8_e5m2}) {
    const int64_t a_rows = 30, b_rows = 17, K = 70;
    const QuantizedTensor qa = quantized(format, a_rows, K, seed++), qb = quantized(format, b_rows, K, seed++);
    const auto value_of = [](const QuantizedTensor& q) {
      return [&q](int64_t r, int64_t k) {
        if (r >= q.rows || k >= q.cols) return 0.0f;
        const uint8_t code = q.codes[r * q.cols + k];
        return q.format == Format::fp8_e4m3 ? e4m3_decode(code) : e5m2_decode(code);
      };
    };
    std::vector<uint8_t> pa = panel(K), pb = panel(K);
    pack_bf16_fp8_a_panel(qa, 0, pa.data());
    pack_bf16_fp8_b_panel(qb, 0, pb.data());
    expect_kernel_matches(pa, pb, K, model(value_of(qa), value_of(qb), K), std::string(to_string(format)));
  }
}

// Attention's products (bf16_product_amx over B panels packed once by pack_bf16_b_panels): every
// output of C [M][N] is the model's sum over the call's prefix k of B's K rows (A zero past it),
// written or added into C without touching C past N; A along its rows or down its columns; M, N
// across the 32 x 32 micro-tile's edges; k a partial unit and an odd pair.
TEST(AmxBf16Emulated, AttentionProductSumsEachOutputInTheTileOrder) {
  uint64_t seed = 600;
  for (const auto& [M, N, K, k] : {std::array<int64_t, 4>{16, 70, 64, 64}, {37, 33, 100, 45}, {33, 64, 96, 1}})
    for (const bool a_down_columns : {false, true})
      for (const bool accumulate : {false, true}) {
        const int64_t ldb = N + 3, ldc = N + 5, a_ld = a_down_columns ? M + 2 : k + 2;
        // Values that are BF16 already, as attention's operands are.
        std::vector<float> b = spread_values(K, ldb, seed++), a = spread_values(a_down_columns ? k : M, a_ld, seed++);
        for (float& x : b) x = bf16_daz(x);
        for (float& x : a) x = bf16_daz(x);
        const std::vector<float> c0 = spread_values(M, ldc, seed++);
        std::vector<float> c = c0;
        std::vector<uint8_t> panels(static_cast<size_t>(bf16_panels_bytes(K, N)), 0xEE);
        std::vector<uint8_t> a_panels(static_cast<size_t>(bf16_panels_bytes(k, M)), 0xEE);
        std::vector<float> acc(static_cast<size_t>(kBf16Panel * kBf16AccStride), std::nanf(""));
        pack_bf16_b_panels(K, N, b.data(), ldb, panels.data());
        const int64_t a_row = a_down_columns ? 1 : a_ld, a_k = a_down_columns ? a_ld : 1;
        bf16_product_amx(M, N, k, a.data(), a_row, a_k, panels.data(), bf16_units(K), c.data(), ldc, accumulate,
                         a_panels.data(), acc.data());
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < ldc; ++n) {
            float want = c0[m * ldc + n];
            if (n < N) {
              const auto av = [&](int64_t j) { return j < k ? a[m * a_row + j * a_k] : 0.0f; };
              const auto bv = [&](int64_t j) { return j < K ? b[j * ldb + n] : 0.0f; };
              float sum = 0.0f;
              for (int64_t j = 0; j < bf16_units(k) * kBf16UnitK; j += 2) {
                sum = sum + av(j + 1) * bv(j + 1);
                sum = sum + av(j) * bv(j);
              }
              want = accumulate ? sum + c0[m * ldc + n] : sum;
            }
            ASSERT_EQ(std::memcmp(&want, &c[m * ldc + n], 4), 0)
                << M << "x" << N << " k=" << k << (a_down_columns ? " A by columns" : " A by rows")
                << (accumulate ? " accumulating" : "") << ": C[" << m << "," << n << "] = " << c[m * ldc + n] << ", model "
                << want;
          }
      }
}

}  // namespace
}  // namespace nibble::cpu::gemm_detail
