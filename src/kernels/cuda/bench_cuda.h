// `nibble bench gemm --device cuda`: NVFP4 (native or emulated, and which), FP8 and BF16 cuBLASLt
// GEMMs, and the quantization kernels' bandwidth against a device-to-device copy measured in the
// same run, printed side by side with the targets. Callable from any CLI front end.
#pragma once
#include <cstdint>

namespace nibble::cuda {

struct CudaBenchOptions {
  int64_t m = 8192, n = 8192, k = 8192;          // GEMM shape
  int64_t quant_rows = 8192, quant_cols = 8192;  // tensor the quantization kernels run on
  int iterations = 20;                           // timed repetitions (after `warmup` untimed ones)
  int warmup = 3;
  int device = 0;
};

// Prints the report on stdout. Returns 0 when it ran (targets missed are reported, not failed),
// 2 with a message on stderr when there is no usable GPU or the options are invalid.
int run_cuda_gemm_bench(const CudaBenchOptions& options);

}  // namespace nibble::cuda
