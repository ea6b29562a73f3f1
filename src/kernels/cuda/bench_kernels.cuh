// The benchmark's input kernels (bench_cuda.cu), in a header of their own so that the CUDA model's
// tests (tests/emulated/test_cuda_model_kernels.cpp) run them without the benchmark's cuBLASLt calls.
// Included by one translation unit per program.
#pragma once
#include <cstdint>

#include "kernels/cuda/device_math.h"

namespace nibble::cuda::bench_kernels {

// Deterministic pseudo-random normal-ish values (sum of uniforms) without a host round trip.
__global__ void fill_random_kernel(float* x, int64_t n, uint64_t seed) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const dm::Philox4 r = dm::philox4x32_10(static_cast<uint64_t>(i), seed);
    const float s = dm::philox_word_to_uniform(r.v[0]) + dm::philox_word_to_uniform(r.v[1]) +
                    dm::philox_word_to_uniform(r.v[2]) + dm::philox_word_to_uniform(r.v[3]);
    x[i] = (s - 2.0f) * 1.7f;
  }
}
__global__ void to_bf16_kernel(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = dm::bf16_bits_rn(x[i]);
}

}  // namespace nibble::cuda::bench_kernels
