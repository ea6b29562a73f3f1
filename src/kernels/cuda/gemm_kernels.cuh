// The GEMM's one kernel (gemm.cu), in a header of its own so that the CUDA model's tests
// (tests/emulated/test_cuda_model_kernels.cpp) run it without cuBLASLt. Included by one
// translation unit per program.
#pragma once
#include "kernels/cuda/device_math.h"

namespace nibble::cuda::gemm_kernels {

// {alpha * decode_a * decode_b, beta} on the device: the global scales never visit the host.
__global__ void fold_alpha_kernel(const float* globals_a, const float* globals_b, float alpha, float beta,
                                  float* alpha_beta) {
  alpha_beta[0] = dm::nb_mul(dm::nb_mul(globals_a[1], globals_b[1]), alpha);
  alpha_beta[1] = beta;
}

// Row-scaled NVFP4 operands (TE's row_scaled_nvfp4): the GEMM ran with the per-tensor factors in
// alpha into `product` ([M, N], FP32); each output then takes its row's S_decA[m] and its column's
// S_decB[n], as TE applies row-scaled outer scales to the FP32 output of its per-tensor GEMM.
__global__ void row_scale_epilogue_kernel(const float* product, int64_t M, int64_t N, const float* a_rows,
                                          const float* b_rows, bool accumulate, float* c, int64_t ldc) {
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < M * N;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = idx / N, n = idx % N;
    float v = product[idx];
    if (a_rows != nullptr) v = dm::nb_mul(v, a_rows[m]);
    if (b_rows != nullptr) v = dm::nb_mul(v, b_rows[n]);
    c[m * ldc + n] = accumulate ? dm::nb_add(c[m * ldc + n], v) : v;
  }
}

}  // namespace nibble::cuda::gemm_kernels
