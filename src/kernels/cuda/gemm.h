// GPU GEMMs with the CPU's contract (kernels/cpu/gemm/gemm.h), on device pointers:
//   C[M,N] = alpha * A[M,K] . B[N,K]^T   (+ C with Output::accumulate), FP32 output, row-major, ldc >= N,
// both quantized operands K-contiguous (the TN layout cuBLASLt requires for narrow types).
// The path depends on the operands and the device (choose_gemm_path):
//   native_nvfp4   sm_100+: cuBLASLt NVFP4 (CUDA_R_4F_E2M1, VEC16_UE4M3 scales in the 128x4 swizzled
//                  layout); the two global decode scales are folded into alpha on the device.
//   fp8_cublaslt   sm_89+: cuBLASLt FP8 x FP8 (not e5m2 x e5m2); decode scales folded into alpha.
//   emulated_bf16  everything else, e.g. NVFP4 on Hopper: decode codes * block scale to BF16 (exact:
//                  an e2m1 x e4m3 product has at most 6 significant bits) and run a cuBLASLt BF16
//                  GEMM with FP32 accumulation; the global scales go into alpha. NVFP4 numerics up
//                  to summation order.
// A row-scaled NVFP4 operand (TE's row_scaled_nvfp4) runs the same paths with its per-tensor factor
// 1 into a scratch [M, N] product, then an epilogue kernel multiplies output (m, n) by A's S_dec[m]
// and B's S_dec[n] (and adds C for Output::accumulate), as TE's row-scaled GEMM does.
#pragma once
#include <cstdint>
#include <string_view>

#include "format/gemm_rules.h"
#include "kernels/cuda/quantize.h"

namespace nibble::cuda {

enum class GemmPath : uint8_t { native_nvfp4, fp8_cublaslt, emulated_bf16 };
std::string_view to_string(GemmPath p);

struct GemmShape {
  int64_t m = 0, n = 0, k = 0, ldc = 0;
};
// Pure decision (no device needed): which path gemm() tries first.
GemmPath choose_gemm_path(Format a, Format b, GemmShape s, int cc_major, int cc_minor);
// The CPU gemm's operand rules: same K, compatible formats, ldc >= N, the RHT on both operands or
// on neither. Throws UsageError.
void check_gemm_operands(Format a_format, int64_t a_rows, int64_t a_cols, Format b_format, int64_t b_rows,
                         int64_t b_cols, int64_t ldc, bool a_rht = false, bool b_rht = false);

// Returns the path that ran (a native path falls back to emulation when cuBLASLt offers no
// algorithm for the shape). c is a device pointer. Asynchronous on ctx's stream.
GemmPath gemm(const DeviceQuantized& a, const DeviceQuantized& b, float* c, int64_t ldc, float alpha = 1.0f,
              Output output = Output::overwrite, Context& ctx = default_context());

using nibble::Output;
using nibble::Trans;
// BLAS-style BF16 GEMM through cuBLASLt, FP32 accumulation and output, row-major like the CPU's
// gemm_bf16: C[M,N] = alpha * op(A) op(B) + beta * C, op(A) [M,K], op(B) [K,N]; a, b are BF16 bits.
// alpha_beta_device: when non-null, a device pointer to {alpha, beta} used instead of the arguments.
void gemm_bf16(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t lda,
               const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc, Context& ctx = default_context(),
               const float* alpha_beta_device = nullptr);

// The same contract on FP32 operands (CUBLAS_COMPUTE_32F: FP32 products and sums, no TF32).
void gemm_f32(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc, Context& ctx = default_context());

// cuBLASLt plans (the matmul descriptor, the three matrix layouts and the heuristic's algorithm) are
// built once per problem (types, transposes, scale modes, shape, leading dimensions, scalar mode)
// and kept in the context; the block-scale pointers are set per call and the workspace is the
// context's one buffer. Entries so far, and a switch for tests: off, every call builds and drops
// its own plan (the same parameters, as the host replay tests check).
size_t gemm_plan_entries(Context& ctx);
void set_gemm_plan_cache(Context& ctx, bool enabled);

}  // namespace nibble::cuda
