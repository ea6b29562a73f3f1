// The choice between vdpbf16ps and two FMAs for BF16 products summed in pair order (gemm.h): both
// micro-kernels give the same bits, so the faster one is taken, timed once on panels that stay in L1.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/cpu/common/cpu_features.h"
#include "kernels/cpu/gemm/gemm.h"
#include "kernels/cpu/gemm/gemm_kernels.h"

namespace nibble::cpu {
namespace {

using gemm_detail::MicroKernel;

// Best time of `calls` back-to-back calls of `kernel` on the 8 x 32 micro-tile over `pairs` k pairs.
double best_seconds(MicroKernel kernel, const uint8_t* a, const uint8_t* b, int64_t pairs, float* acc, int rounds) {
  constexpr int kCalls = 32;
  double best = 1e30;
  for (int round = 0; round < rounds; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int call = 0; call < kCalls; ++call) kernel(a, b, pairs, acc, call == 0);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// vdpbf16ps unless the FMAs are clearly faster (10 %: the pair panels are half the bytes, which the
// L1-resident timing does not see). The two are timed in alternation, so a slow phase of a shared
// machine weighs on both.
Bf16PairKernel measured() {
  if (active_isa() < Isa::avx512bf16) return Bf16PairKernel::fma;
  constexpr int64_t kPairs = 128, kK = 2 * kPairs;  // 4 KB of A and 16 KB of B pairs
  std::vector<float> a(static_cast<size_t>(gemm_detail::kMr * kK)), b(static_cast<size_t>(gemm_detail::kNr * kK));
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.5f + static_cast<float>(i % 13) * 0.125f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = 1.0f - static_cast<float>(i % 7) * 0.0625f;
  const gemm_detail::F32Operand ao{a.data(), kK, gemm_detail::kMr, kK, true}, bo{b.data(), kK, gemm_detail::kNr, kK, true};
  std::vector<uint8_t> pa(static_cast<size_t>(kPairs * gemm_detail::bf16_pair_a_unit_bytes()));
  std::vector<uint8_t> pb(static_cast<size_t>(kPairs * gemm_detail::bf16_pair_b_unit_bytes()));
  std::vector<uint8_t> wa(static_cast<size_t>(kK * gemm_detail::f32_a_k_bytes()));
  std::vector<uint8_t> wb(static_cast<size_t>(kK * gemm_detail::f32_b_k_bytes()));
  gemm_detail::pack_bf16_pair_a_panel_avx2(ao, 0, pa.data());
  gemm_detail::pack_bf16_pair_b_panel_avx2(bo, 0, pb.data());
  gemm_detail::pack_bf16_pair_widened_a_panel_avx2(ao, 0, wa.data());
  gemm_detail::pack_bf16_pair_widened_b_panel_avx2(bo, 0, wb.data());
  std::vector<float> acc(static_cast<size_t>(gemm_detail::kMr * gemm_detail::kNr));
  const MicroKernel dot = gemm_detail::bf16_pair_micro_kernel_avx512bf16();
  const MicroKernel fma = gemm_detail::widened_pair_micro_kernel_avx512();
  double dot_s = 1e30, fma_s = 1e30;
  for (int alternation = 0; alternation < 4; ++alternation) {
    dot_s = std::min(dot_s, best_seconds(dot, pa.data(), pb.data(), kPairs, acc.data(), 2));
    fma_s = std::min(fma_s, best_seconds(fma, wa.data(), wb.data(), kPairs, acc.data(), 2));
  }
  return fma_s < 0.9 * dot_s ? Bf16PairKernel::fma : Bf16PairKernel::dpbf16;
}

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
  static const Bf16PairKernel chosen = measured();
  return chosen;
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
