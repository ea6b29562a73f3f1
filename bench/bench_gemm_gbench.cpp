// Google Benchmark for the CPU GEMMs, for profiling outside CI (perf, VTune): one benchmark per
// kernel and shape, reporting FLOP/s as 2*M*N*K per iteration. `nibble bench gemm` is the
// one-run comparison table; this target is for looking at one kernel at a time.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "kernels/cpu/gemm/gemm.h"
#include "kernels/cpu/quantize/quantize.h"

namespace {

std::vector<float> random_matrix(int64_t rows, int64_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (float& v : x) v = normal(rng);
  return x;
}

void set_flops(benchmark::State& state, int64_t M, int64_t N, int64_t K) {
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * M * N * K, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_QuantizedGemm(benchmark::State& state, nibble::Format format) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  std::vector<float> a = random_matrix(M, K, 1), b = random_matrix(N, K, 2);
  nibble::QuantizedTensor qa = nibble::cpu::quantize(a, M, K, {.format = format});
  nibble::QuantizedTensor qb = nibble::cpu::quantize(b, N, K, {.format = format});
  std::vector<float> c(static_cast<size_t>(M * N));
  for (auto _ : state) {
    nibble::cpu::gemm(qa, qb, c.data(), N);
    benchmark::DoNotOptimize(c.data());
  }
  set_flops(state, M, N, K);
}

void BM_OneDnnF32(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  std::vector<float> a = random_matrix(M, K, 1), b = random_matrix(N, K, 2), c(static_cast<size_t>(M * N));
  for (auto _ : state) {
    nibble::cpu::gemm_f32_onednn(nibble::cpu::Trans::no, nibble::cpu::Trans::yes, M, N, K, 1.0f, a.data(), K, b.data(), K,
                                 0.0f, c.data(), N);
    benchmark::DoNotOptimize(c.data());
  }
  set_flops(state, M, N, K);
}

void shapes(benchmark::internal::Benchmark* b) {
  for (int64_t n : {512, 1024, 2048}) b->Args({n, n, n});
  b->Args({4096, 3072, 768})->Args({4096, 768, 3072})->Args({768, 3072, 4096})->Args({4096, 768, 768});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

}  // namespace

BENCHMARK_CAPTURE(BM_QuantizedGemm, nvfp4, nibble::Format::nvfp4)->Apply(shapes);
BENCHMARK_CAPTURE(BM_QuantizedGemm, mxfp4, nibble::Format::mxfp4)->Apply(shapes);
BENCHMARK_CAPTURE(BM_QuantizedGemm, fp8_e4m3, nibble::Format::fp8_e4m3)->Apply(shapes);
BENCHMARK(BM_OneDnnF32)->Apply(shapes);
BENCHMARK_MAIN();
