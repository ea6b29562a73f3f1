// `nibble bench gemm --device cuda`: the CUDA benchmark (kernels/cuda/bench_cuda.h) -- NVFP4
// (native or emulated), FP8 and BF16 cuBLASLt GEMMs and the quantization kernels' GB/s against a
// device-to-device copy, in one run. In a build without the CUDA backend it says so and exits 2.
#include <cstdio>

#include "cli/bench_cuda.h"
#if defined(NIBBLE_HAVE_CUDA)
#include "kernels/cuda/bench_cuda.h"
#endif

namespace nibble::cli {

int run_bench_gemm_cuda(int64_t size) {
#if defined(NIBBLE_HAVE_CUDA)
  cuda::CudaBenchOptions b;
  b.m = b.n = b.k = size;
  b.quant_rows = b.quant_cols = size;
  return cuda::run_cuda_gemm_bench(b);
#else
  (void)size;
  std::fprintf(stderr, "nibble: error: this nibble was built without the CUDA backend: install the CUDA toolkit "
                       "(nvcc, cuBLASLt) and configure with -DNIBBLE_CUDA=ON\n");
  return 2;
#endif
}

}  // namespace nibble::cli
