// Fused attention's product with AVX2 + FMA: 6 rows x 2 vectors of 8 accumulators (12 of the 16
// ymm registers), one broadcast of A per row and two loads of B per k. FMA latency 4 on two pipes
// wants more than 8 independent accumulators (8 leave the pipes idle at every load hiccup, as in the
// FP32 GEMM kernel, gemm_avx2.cpp).
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
#include "kernels/cpu/layers/attention_matmul.inc"
#include "kernels/cpu/common/transpose8x8_avx.inc"
}  // namespace

void matmul_avx2(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_row, int64_t a_k, const float* B,
                 int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  attention_matmul_impl<Order::k>(M, N, K, A, a_row, a_k, B, ldb, C, ldc, accumulate);
}
void pair_matmul_avx2(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_row, int64_t a_k, const float* B,
                      int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  attention_matmul_impl<Order::pairs>(M, N, K, A, a_row, a_k, B, ldb, C, ldc, accumulate);
}

void transpose_avx2(const float* src, int64_t src_stride, int64_t rows, int64_t cols, float* dst, int64_t dst_stride) {
  const int64_t rows8 = rows / 8 * 8, cols8 = cols / 8 * 8;
  for (int64_t r = 0; r < rows8; r += 8)
    for (int64_t c = 0; c < cols8; c += 8) transpose8x8(src + r * src_stride + c, src_stride, dst + c * dst_stride + r, dst_stride);
  // The edges (a sequence or head width that is not a multiple of 8) one element at a time.
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = r < rows8 ? cols8 : 0; c < cols; ++c) dst[c * dst_stride + r] = src[r * src_stride + c];
}
}  // namespace nibble::cpu::attention_kernels
