// Fused attention's product with AVX-512: 4 rows x 4 vectors of 16 accumulators (16 of the 32 zmm
// registers: a 64-wide head in one strip), one broadcast of A per row and four loads of B per k.
#ifdef NIBBLE_EMULATED_INTRINSICS
// tests/emulated/: a software model of the five intrinsics below, so this file's tiling is tested on
// CPUs without AVX-512 too.
#include NIBBLE_EMULATED_INTRINSICS
#else
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>

namespace nibble::cpu::attention_kernels {
namespace {
struct Simd {
  using Vec = __m512;
  static constexpr int64_t kWidth = 16, kRows = 4, kVectors = 4;
  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec set1(float x) { return _mm512_set1_ps(x); }
  static Vec load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
};
#include "kernels/cpu/layers/attention_matmul.inc"
}  // namespace

void matmul_avx512(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_row, int64_t a_k, const float* B,
                   int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  attention_matmul_impl<Order::k>(M, N, K, A, a_row, a_k, B, ldb, C, ldc, accumulate);
}
void pair_matmul_avx512(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_row, int64_t a_k, const float* B,
                        int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  attention_matmul_impl<Order::pairs>(M, N, K, A, a_row, a_k, B, ldb, C, ldc, accumulate);
}
}  // namespace nibble::cpu::attention_kernels
