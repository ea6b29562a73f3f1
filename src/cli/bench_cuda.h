// The GPU side of `nibble bench gemm --device cuda` (cmd_bench_cuda.cpp): square M = N = K = size.
// Returns the exit code; 2 with a message when nibble was built without CUDA or no GPU is usable.
#pragma once
#include <cstdint>

namespace nibble::cli {
int run_bench_gemm_cuda(int64_t size);
}
