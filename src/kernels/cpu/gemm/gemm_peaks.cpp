#include "kernels/cpu/gemm/gemm_peaks.h"

#include <chrono>
#include <cstdint>
#include <cstdio>

#include "kernels/cpu/common/cpu_features.h"

namespace nibble::cpu {
namespace peaks {
float fma_zmm_loop(int64_t iterations);
int32_t vnni_zmm_loop(int64_t iterations);
float fma_ymm_loop(int64_t iterations);
int32_t maddubs_ymm_loop(int64_t iterations);
int32_t amx_int8_loop(int64_t iterations);
float amx_bf16_loop(int64_t iterations);
}  // namespace peaks

namespace {

// Best rate over repeated timed runs of `loop` (the best filters out interference from other
// processes on a shared machine). ops_per_iteration counts multiply and add separately.
template <class Loop>
double best_rate(Loop loop, double ops_per_iteration, double seconds) {
  using clock = std::chrono::steady_clock;
  int64_t iterations = 1 << 16;
  double best = 0.0;
  volatile double sink = 0;
  const auto deadline = clock::now() + std::chrono::duration<double>(seconds);
  do {
    auto t0 = clock::now();
    sink = sink + loop(iterations);
    double dt = std::chrono::duration<double>(clock::now() - t0).count();
    if (dt < 5e-3) {
      iterations *= 2;
      continue;
    }
    if (ops_per_iteration * iterations / dt > best) best = ops_per_iteration * iterations / dt;
  } while (clock::now() < deadline);
  return best * 1e-9;
}

}  // namespace

InstructionPeak measure_fma_f32_peak(double seconds) {
  if (detected_isa() >= Isa::avx512) return {"vfmadd231ps zmm", best_rate(peaks::fma_zmm_loop, 16 * 16 * 2, seconds)};
  if (detected_isa() == Isa::avx2) return {"vfmadd231ps ymm", best_rate(peaks::fma_ymm_loop, 12 * 8 * 2, seconds)};
  return {"none (no AVX2)", 0.0};
}

InstructionPeak measure_int8_dot_peak(double seconds) {
  if (detected_isa() >= Isa::avx512) return {"vpdpbusd zmm", best_rate(peaks::vnni_zmm_loop, 16 * 64 * 2, seconds)};
  if (detected_isa() == Isa::avx2) return {"vpmaddubsw ymm", best_rate(peaks::maddubs_ymm_loop, 12 * 32 * 2, seconds)};
  return {"none (no AVX2)", 0.0};
}

InstructionPeak measure_amx_int8_peak(double seconds) {
  // Each iteration: 4 tdpbssd of 16x16 int32 += 16x64 s8 . 64x16 s8 (16384 multiply-adds each).
  if (detected_isa() >= Isa::amx) return {"tdpbssd (K=64)", best_rate(peaks::amx_int8_loop, 4 * 16 * 16 * 64 * 2, seconds)};
  return {"none (no AMX)", 0.0};
}

InstructionPeak measure_amx_bf16_peak(double seconds) {
  // Each iteration: 4 tdpbf16ps of 16x16 f32 += 16x32 bf16 . 32x16 bf16 (8192 multiply-adds each).
  if (amx_bf16_active()) return {"tdpbf16ps (K=32)", best_rate(peaks::amx_bf16_loop, 4 * 16 * 16 * 32 * 2, seconds)};
  return {"none (no AMX-BF16)", 0.0};
}

}  // namespace nibble::cpu
