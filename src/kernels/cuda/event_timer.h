// CUDA-event timing on a context's stream, for the benchmarks and the profile (host code).
#pragma once
#include <functional>

#include "kernels/cuda/context.h"
#include "kernels/cuda/cuda_error.h"

namespace nibble::cuda {

class Timer {
 public:
  explicit Timer(Context& ctx) : ctx_(ctx) {
    NIBBLE_CUDA_CHECK(cudaEventCreate(&start_));
    NIBBLE_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~Timer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  // Mean seconds per call of `body` over `iterations` calls, after `warmup` untimed ones.
  double seconds(const std::function<void()>& body, int warmup, int iterations) {
    for (int i = 0; i < warmup; ++i) body();
    NIBBLE_CUDA_CHECK(cudaEventRecord(start_, ctx_.stream()));
    for (int i = 0; i < iterations; ++i) body();
    NIBBLE_CUDA_CHECK(cudaEventRecord(stop_, ctx_.stream()));
    NIBBLE_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    NIBBLE_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms * 1e-3 / iterations;
  }

 private:
  Context& ctx_;
  cudaEvent_t start_{}, stop_{};
};

}  // namespace nibble::cuda
