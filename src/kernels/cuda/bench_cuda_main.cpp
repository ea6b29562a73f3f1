// nibble_bench_cuda: the CUDA benchmark as a program of its own, so that scripts/gpu-check.sh can
// run it whether or not the nibble command was linked with the CUDA backend.
//   nibble_bench_cuda [SIZE [ITERATIONS]]     (GEMM M = N = K = SIZE, default 8192)
#include <cstdlib>

#include "kernels/cuda/bench_cuda.h"

int main(int argc, char** argv) {
  nibble::cuda::CudaBenchOptions options;
  if (argc > 1) options.m = options.n = options.k = std::atoll(argv[1]);
  if (argc > 2) options.iterations = std::atoi(argv[2]);
  return nibble::cuda::run_cuda_gemm_bench(options);
}
