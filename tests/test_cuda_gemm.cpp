// GPU GEMMs against an FP64 sum of the same quantized operands. Tolerances come from the math:
// every element product is exact (in BF16->FP32 emulation and in the FP4/FP8 tensor cores), so the
// only errors are the FP32 accumulation and the final scaling. For a dot product of K terms with
// S = sum |a_k b_k|, FP32 round-to-nearest summation errs by at most (K-1) u S (u = 2^-24); tensor
// cores align and truncate instead of rounding, which at most doubles u; two more roundings come from
// alpha = decode_a * decode_b * alpha and the output. Hopper FP8 tensor cores (and, conservatively,
// Blackwell's FP4 ones) keep about 13 fraction bits inside each MMA before cuBLASLt promotes to FP32,
// which adds up to 2^-12 S. Skips with the reason when no GPU is present.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "format/codecs.h"
#include "format/quantize.h"
#include "support/random.h"

#if defined(NIBBLE_HAVE_CUDA)
#include "kernels/cuda/gemm.h"

using namespace nibble;

namespace {

std::vector<float> random_tensor(int64_t n, uint32_t seed) { return nibble_test::normal_floats(static_cast<size_t>(n), seed); }

// The block-scaled value of element i (global scale left out) and the tensor-wide factor.
double block_value(const QuantizedTensor& q, int64_t i) {
  const bool four_bit = q.format == Format::nvfp4 || q.format == Format::mxfp4;
  const uint8_t code = four_bit ? ((q.codes[i / 2] >> (4 * (i & 1))) & 0xF) : q.codes[i];
  const int64_t bl = q.block_len();
  switch (q.format) {
    case Format::nvfp4: return double(e2m1_decode(code)) * e4m3_decode(q.scales[i / bl]);
    case Format::mxfp4: return double(e2m1_decode(code)) * e8m0_decode(q.scales[i / bl]);
    case Format::mxfp8: return double(e4m3_decode(code)) * e8m0_decode(q.scales[i / bl]);
    case Format::fp8_e4m3: return e4m3_decode(code);
    case Format::fp8_e5m2: return e5m2_decode(code);
  }
  return 0;
}
// Row-scaled operands: the S_dec of the output's row (A) or column (B).
double global_factor(const QuantizedTensor& q, int64_t row) {
  return q.format == Format::mxfp4 || q.format == Format::mxfp8 ? 1.0 : double(q.decode_scale_of_row(row));
}

class CudaGemm : public ::testing::Test {
 protected:
  void SetUp() override {
    const cuda::DeviceAvailability a = cuda::probe_devices();
    if (!a.available) GTEST_SKIP() << "skipping GPU test: " << a.reason;
  }
  cuda::Context& ctx() { return cuda::default_context(); }

  // Quantizes a [M,K] and b [N,K] on the GPU, multiplies, and checks against FP64.
  void check(int64_t M, int64_t N, int64_t K, const QuantOptions& ao, const QuantOptions& bo, int64_t ldc,
             float alpha, bool accumulate, uint32_t seed) {
    const auto x = random_tensor(M * K, seed), w = random_tensor(N * K, seed + 1);
    const auto dx = cuda::DeviceBuffer<float>::from_host(x, ctx().stream());
    const auto dw = cuda::DeviceBuffer<float>::from_host(w, ctx().stream());
    const cuda::DeviceQuantized qa = cuda::quantize(dx.data(), M, K, ao, ctx());
    const cuda::DeviceQuantized qb = cuda::quantize(dw.data(), N, K, bo, ctx());
    std::vector<float> c0(static_cast<size_t>(M * ldc));
    for (size_t i = 0; i < c0.size(); ++i) c0[i] = static_cast<float>(i % 7) - 3.0f;
    auto dc = cuda::DeviceBuffer<float>::from_host(c0, ctx().stream());
    const cuda::GemmPath path = cuda::gemm(qa, qb, dc.data(), ldc, alpha, accumulate ? Output::accumulate : Output::overwrite, ctx());
    const std::vector<float> c = dc.download();
    const QuantizedTensor ha = cuda::to_host(qa), hb = cuda::to_host(qb);
    const double u = std::ldexp(1.0, -24);
    const bool tensor_core_chunks = path != cuda::GemmPath::emulated_bf16;
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        const double scale = global_factor(ha, i) * global_factor(hb, j) * alpha;
        double sum = 0, abs_sum = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double p = block_value(ha, i * K + k) * block_value(hb, j * K + k);
          sum += p;
          abs_sum += std::fabs(p);
        }
        const double want = sum * scale + (accumulate ? c0[i * ldc + j] : 0.0);
        const double bound = (2.0 * (K + 3) * u + (tensor_core_chunks ? std::ldexp(1.0, -12) : 0.0)) * abs_sum *
                                 std::fabs(scale) +
                             ((ha.row_scaled || hb.row_scaled) ? 3 : 1) * u * std::fabs(want);  // + the epilogue's 2
        ASSERT_NEAR(c[i * ldc + j], want, bound)
            << "C[" << i << ", " << j << "] " << to_string(ao.format) << " x " << to_string(bo.format) << " via "
            << cuda::to_string(path);
      }
    // The padding between rows is untouched.
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t j = N; j < ldc; ++j) {
        ASSERT_EQ(c[i * ldc + j], c0[i * ldc + j]);
      }
    }
  }
};

QuantOptions fmt(Format f, bool tile = false) {
  QuantOptions o;
  o.format = f;
  o.tile_16x16 = tile;
  return o;
}

}  // namespace

TEST_F(CudaGemm, Nvfp4FpropShape) {
  // X 1x16 x W 16x16, the recipe's forward GEMM; native on sm_100, emulated on Hopper.
  check(128, 256, 512, fmt(Format::nvfp4), fmt(Format::nvfp4, true), 256, 1.0f, false, 1);
}

TEST_F(CudaGemm, Nvfp4OddShapesAlphaAndAccumulate) {
  check(37, 50, 48, fmt(Format::nvfp4), fmt(Format::nvfp4), 53, 0.5f, true, 2);
  check(64, 64, 256, fmt(Format::nvfp4), fmt(Format::nvfp4), 68, -2.0f, true, 3);
}

TEST_F(CudaGemm, Nvfp4RowScaledOperands) {
  // TE's row_scaled_activation: fprop's X row-scaled (A), wgrad's X^T row-scaled (B), both.
  QuantOptions rows = fmt(Format::nvfp4);
  rows.row_scaled = true;
  check(128, 256, 512, rows, fmt(Format::nvfp4, true), 256, 1.0f, false, 4);
  check(64, 96, 256, fmt(Format::nvfp4), rows, 100, 0.5f, true, 5);
  check(37, 50, 48, rows, rows, 53, -2.0f, true, 6);
}

TEST_F(CudaGemm, Fp8) {
  check(64, 128, 256, fmt(Format::fp8_e4m3), fmt(Format::fp8_e4m3), 128, 1.0f, false, 4);
  check(64, 128, 256, fmt(Format::fp8_e4m3), fmt(Format::fp8_e5m2), 128, 1.0f, false, 5);
  check(32, 48, 64, fmt(Format::fp8_e5m2), fmt(Format::fp8_e5m2), 48, 1.0f, true, 6);  // emulated
}

TEST_F(CudaGemm, MxFormatsAreEmulated) {
  check(64, 96, 128, fmt(Format::mxfp8), fmt(Format::mxfp8), 96, 1.0f, false, 7);
  check(64, 96, 128, fmt(Format::mxfp4), fmt(Format::mxfp4), 96, 1.0f, false, 8);
}

TEST_F(CudaGemm, MismatchedOperandsAreUsageErrors) {
  const auto x = random_tensor(32 * 64, 9);
  const auto dx = cuda::DeviceBuffer<float>::from_host(x, ctx().stream());
  const cuda::DeviceQuantized a = cuda::quantize(dx.data(), 32, 64, fmt(Format::nvfp4), ctx());
  const cuda::DeviceQuantized b = cuda::quantize(dx.data(), 64, 32, fmt(Format::mxfp4), ctx());
  cuda::DeviceBuffer<float> c(32 * 64, ctx().stream());
  EXPECT_THROW(cuda::gemm(a, b, c.data(), 64, 1.0f, Output::overwrite, ctx()), UsageError);
}

TEST_F(CudaGemm, Bf16AllTransposes) {
  const int64_t M = 48, N = 40, K = 72;
  const auto af = random_tensor(M * K, 10), bf = random_tensor(K * N, 11);
  std::vector<uint16_t> a(af.size()), b(bf.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = bf16_from_float_rn(af[i]).bits;
  for (size_t i = 0; i < b.size(); ++i) b[i] = bf16_from_float_rn(bf[i]).bits;
  auto value = [](const std::vector<uint16_t>& v, size_t i) { return double(bf16_to_float(bf16{v[i]})); };
  const auto da = cuda::DeviceBuffer<uint16_t>::from_host(a, ctx().stream());
  const auto db = cuda::DeviceBuffer<uint16_t>::from_host(b, ctx().stream());
  for (cuda::Trans ta : {cuda::Trans::no, cuda::Trans::yes})
    for (cuda::Trans tb : {cuda::Trans::no, cuda::Trans::yes}) {
      // The same buffers read as op(A) [M,K] and op(B) [K,N] under each transpose flag.
      const int64_t lda = ta == cuda::Trans::no ? K : M, ldb = tb == cuda::Trans::no ? N : K;
      auto a_at = [&](int64_t i, int64_t k) { return ta == cuda::Trans::no ? value(a, i * K + k) : value(a, k * M + i); };
      auto b_at = [&](int64_t k, int64_t j) { return tb == cuda::Trans::no ? value(b, k * N + j) : value(b, j * K + k); };
      cuda::DeviceBuffer<float> c(static_cast<size_t>(M * N), ctx().stream());
      c.fill_zero();
      cuda::gemm_bf16(ta, tb, M, N, K, 1.0f, da.data(), lda, db.data(), ldb, 0.0f, c.data(), N, ctx());
      const std::vector<float> got = c.download();
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double sum = 0, abs_sum = 0;
          for (int64_t k = 0; k < K; ++k) {
            sum += a_at(i, k) * b_at(k, j);
            abs_sum += std::fabs(a_at(i, k) * b_at(k, j));
          }
          ASSERT_NEAR(got[i * N + j], sum, 2.0 * (K + 2) * std::ldexp(1.0, -24) * abs_sum)
              << "ta=" << int(ta) << " tb=" << int(tb) << " at " << i << "," << j;
        }
    }
}

#else
TEST(CudaGemm, NotBuilt) { GTEST_SKIP() << "nibble was built without the CUDA backend (NIBBLE_CUDA=OFF or no nvcc)"; }
#endif
