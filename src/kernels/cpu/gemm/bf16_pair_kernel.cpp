// The choice between vdpbf16ps and two FMAs for BF16 products summed in pair order (gemm.h). Both
// give the same bits but for sums below 2^-126 (vdpbf16ps flushes them), so the choice is fixed by
// the CPU, never by a timing: a run resumed on the same machine takes the same kernel. vdpbf16ps
// is the faster on AMD's AVX512-BF16 cores (Zen 4, Zen 5), two FMAs on Intel's without AMX (measured
// on Sapphire/Emerald Rapids-class Xeons whose VM hides AMX: docs/benchmarks.md).

#include "kernels/cpu/common/cpu_features.h"
#include "kernels/cpu/common/forced_choice.h"
#include "kernels/cpu/gemm/gemm.h"

namespace nibble::cpu {
namespace {

std::atomic<int>& forced_slot() {
  return forced_choice<Bf16PairKernel>("NIBBLE_BF16_PAIRS", &parse_bf16_pair_kernel, "fma or dpbf16");
}

}  // namespace

Bf16PairKernel bf16_pair_kernel() {
  if (active_isa() < Isa::avx512bf16) return Bf16PairKernel::fma;
  const int forced = forced_slot().load(std::memory_order_relaxed);
  if (forced >= 0) return static_cast<Bf16PairKernel>(forced);
  static const Bf16PairKernel by_cpu = genuine_intel() ? Bf16PairKernel::fma : Bf16PairKernel::dpbf16;
  return by_cpu;
}

void set_bf16_pair_kernel(std::optional<Bf16PairKernel> kernel) {
  forced_slot().store(kernel ? static_cast<int>(*kernel) : -1, std::memory_order_relaxed);
}

std::string_view to_string(Bf16PairKernel kernel) { return kernel == Bf16PairKernel::fma ? "fma" : "dpbf16"; }

std::optional<Bf16PairKernel> parse_bf16_pair_kernel(std::string_view name) {
  if (name == "fma") return Bf16PairKernel::fma;
  if (name == "dpbf16") return Bf16PairKernel::dpbf16;
  return std::nullopt;
}

}  // namespace nibble::cpu
