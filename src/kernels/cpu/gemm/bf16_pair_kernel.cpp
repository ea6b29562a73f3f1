// The choice between vdpbf16ps and two FMAs for BF16 products summed in pair order (gemm.h). Both
// give the same bits but for sums below 2^-126 (vdpbf16ps flushes them), so the choice is fixed by
// the CPU, never by a timing: a run resumed on the same machine takes the same kernel. vdpbf16ps
// is the faster on AMD's AVX512-BF16 cores (Zen 4, Zen 5), two FMAs on Intel's without AMX (measured
// on Sapphire/Emerald Rapids-class Xeons whose VM hides AMX: docs/benchmarks.md).
#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "kernels/cpu/common/cpu_features.h"
#include "kernels/cpu/gemm/gemm.h"

namespace nibble::cpu {
namespace {

// -1: not forced; else a Bf16PairKernel.
std::atomic<int>& forced_slot() {
  static std::atomic<int> slot{[] {
    const char* e = std::getenv("NIBBLE_BF16_PAIRS");
    if (!e) return -1;
    const std::optional<Bf16PairKernel> k = parse_bf16_pair_kernel(e);
    // Read before any command can report errors, so this warns rather than fails (as NIBBLE_ISA).
    if (!k) std::fprintf(stderr, "nibble: NIBBLE_BF16_PAIRS=%s is not fma or dpbf16; ignoring it\n", e);
    return k ? static_cast<int>(*k) : -1;
  }()};
  return slot;
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
