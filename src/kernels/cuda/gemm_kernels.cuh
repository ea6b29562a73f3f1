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

}  // namespace nibble::cuda::gemm_kernels
