// The dense GEMMs' entry points: gemm_f32 / gemm_bf16 check their arguments and run nibble's packed
// kernels (gemm.cpp), whose summation order does not depend on the thread count. Kept apart from
// the oneDNN comparisons (gemm_onednn.cpp) so that a build without oneDNN (NIBBLE_CUDA_ONLY, for an
// offline GPU machine) still has every GEMM training and the CUDA tests use.
#include <algorithm>
#include <string>

#include "common/error.h"
#include "kernels/cpu/gemm/gemm.h"
#include "kernels/cpu/gemm/gemm_kernels.h"

namespace nibble::cpu {

namespace gemm_detail {

void check_dense_gemm_args(const char* name, Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, int64_t lda,
                           int64_t ldb, int64_t ldc) {
  auto fail = [&](const std::string& what) { throw UsageError(std::string(name) + ": " + what); };
  if (M < 0 || N < 0 || K < 0) fail("negative dimension");
  if (lda < std::max<int64_t>(1, ta == Trans::no ? K : M))
    fail("lda " + std::to_string(lda) + " is smaller than the stored row length " + std::to_string(ta == Trans::no ? K : M));
  if (ldb < std::max<int64_t>(1, tb == Trans::no ? N : K))
    fail("ldb " + std::to_string(ldb) + " is smaller than the stored row length " + std::to_string(tb == Trans::no ? N : K));
  if (ldc < std::max<int64_t>(1, N)) fail("ldc " + std::to_string(ldc) + " is smaller than N " + std::to_string(N));
}

void scale_c_by_beta(int64_t M, int64_t N, float beta, float* c, int64_t ldc) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) c[m * ldc + n] = beta == 0.0f ? 0.0f : beta * c[m * ldc + n];
}

}  // namespace gemm_detail

namespace {

// Checks, the empty cases, and a general beta applied to C first (the kernels overwrite or accumulate).
using PackedGemm = void (*)(Trans, Trans, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                            int64_t, float, float*, int64_t);
void run_packed(const char* name, PackedGemm packed, Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha,
                const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  gemm_detail::check_dense_gemm_args(name, ta, tb, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  if (K == 0) return gemm_detail::scale_c_by_beta(M, N, beta, c, ldc);
  if (beta != 0.0f && beta != 1.0f) {
    gemm_detail::scale_c_by_beta(M, N, beta, c, ldc);
    beta = 1.0f;
  }
  packed(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace

void gemm_f32(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  run_packed("gemm_f32", &gemm_detail::gemm_f32_packed, ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_bf16(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  run_packed("gemm_bf16", &gemm_detail::gemm_bf16_packed, ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace nibble::cpu
