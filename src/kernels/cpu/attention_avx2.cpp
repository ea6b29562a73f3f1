// Fused attention's product with AVX2 + FMA: 6 rows x 2 vectors of 8 accumulators (12 of the 16
// ymm registers), one broadcast of A per row and two loads of B per k. FMA latency 4 on two pipes
// wants more than 8 independent accumulators (the FP32 GEMM kernel ran at ~56 % of the peak with 8).
#include <immintrin.h>

#include <cmath>
#include <cstdint>

namespace nibble::cpu::attention_kernels {
namespace {
struct Simd {
  using Vec = __m256;
  static constexpr int64_t kWidth = 8, kRows = 6, kVectors = 2;
  static Vec zero() { return _mm256_setzero_ps(); }
  static Vec set1(float x) { return _mm256_set1_ps(x); }
  static Vec load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
};
#include "kernels/cpu/attention_matmul.inc"
}  // namespace

void matmul_avx2(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_row, int64_t a_k, const float* B,
                 int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  attention_matmul_impl(M, N, K, A, a_row, a_k, B, ldb, C, ldc, accumulate);
}
}  // namespace nibble::cpu::attention_kernels
