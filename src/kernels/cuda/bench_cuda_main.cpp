// nibble_bench_cuda: the program behind `nibble bench gemm --device cuda` (the same
// run_cuda_gemm_bench, the same report), as one of its own: a NIBBLE_CUDA_ONLY build (an offline GPU
// machine, scripts/gpu-check.sh) has no nibble command, which needs the CPU stack's libraries.
//   nibble_bench_cuda [SIZE [ITERATIONS]]   GEMM M = N = K = SIZE and a SIZE x SIZE tensor for the
//                                           quantizers (default 8192, 20 timed iterations)
#include <charconv>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "kernels/cuda/bench_cuda.h"

namespace {

// A positive integer, or a message naming the argument and exit 2 (std::atoll read "abc" as 0).
bool parse_positive(const char* text, const char* what, long long max, long long& value) {
  const std::string_view s(text);
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || value < 1 || value > max) {
    std::fprintf(stderr, "nibble_bench_cuda: error: %s '%s' is not an integer from 1 to %lld: usage: nibble_bench_cuda "
                         "[SIZE [ITERATIONS]], e.g. nibble_bench_cuda 8192 20\n",
                 what, text, max);
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 3 || (argc > 1 && (std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0))) {
    std::fprintf(argc > 3 ? stderr : stdout,
                 "usage: nibble_bench_cuda [SIZE [ITERATIONS]]: NVFP4, FP8 and BF16 GEMMs at M = N = K = SIZE and the "
                 "quantization kernels on a SIZE x SIZE tensor (default 8192, 20 iterations)\n");
    return argc > 3 ? 2 : 0;
  }
  nibble::cuda::CudaBenchOptions options;
  long long size = 8192, iterations = options.iterations;
  if (argc > 1 && !parse_positive(argv[1], "SIZE", 65536, size)) return 2;
  if (argc > 2 && !parse_positive(argv[2], "ITERATIONS", 100000, iterations)) return 2;
  options.m = options.n = options.k = size;
  options.quant_rows = options.quant_cols = size;
  options.iterations = static_cast<int>(iterations);
  return nibble::cuda::run_cuda_gemm_bench(options);
}
