// Fused attention's product without SIMD (CPUs below AVX2): the reference the vector files match.
#include <cmath>
#include <cstdint>

namespace nibble::cpu::attention_kernels {
namespace {
struct Simd {
  using Vec = float;
  static constexpr int64_t kWidth = 1, kRows = 4, kVectors = 4;
  static Vec zero() { return 0.0f; }
  static Vec set1(float x) { return x; }
  static Vec load(const float* p) { return *p; }
  static void store(float* p, Vec v) { *p = v; }
  static Vec fma(Vec a, Vec b, Vec c) { return std::fma(a, b, c); }
};
#include "kernels/cpu/layers/attention_matmul.inc"
}  // namespace

void matmul_scalar(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_row, int64_t a_k, const float* B,
                   int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  attention_matmul_impl<Order::k>(M, N, K, A, a_row, a_k, B, ldb, C, ldc, accumulate);
}
void pair_matmul_scalar(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_row, int64_t a_k, const float* B,
                        int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  attention_matmul_impl<Order::pairs>(M, N, K, A, a_row, a_k, B, ldb, C, ldc, accumulate);
}

void transpose_scalar(const float* src, int64_t src_stride, int64_t rows, int64_t cols, float* dst,
                      int64_t dst_stride) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * dst_stride + r] = src[r * src_stride + c];
}
}  // namespace nibble::cpu::attention_kernels
