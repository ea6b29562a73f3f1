// Which SIMD kernels this CPU can run, read once from cpuid. Every dispatching entry point picks
// its variant from here at first use; tests can force a lower one to check every variant.
#pragma once
#include <optional>
#include <string_view>

namespace nibble::cpu {

// Ordered: each level implies the ones below it.
//   avx512:     F+BW+VL+DQ+VNNI.
//   avx512bf16: avx512 plus AVX512-BF16 (vdpbf16ps: Zen 4/5, Cooper Lake and later Xeons), for the
//               BF16 pair products (gemm_bf16, FP8 with fp32_products, attention) where vdpbf16ps
//               beats two FMAs (gemm.h: bf16_pair_kernel); everything else runs its avx512 variant.
//   amx:        avx512bf16 plus AMX-TILE and AMX-INT8, enabled by the OS for this process (Linux grants
//               the tile state on request, arch_prctl ARCH_REQ_XCOMP_PERM). Only the GEMMs have AMX
//               kernels; every other entry point runs its avx512 variant at this level.
enum class Isa { scalar = 0, avx2 = 1, avx512 = 2, avx512bf16 = 3, amx = 4 };

// AMX-BF16 (tdpbf16ps) on top of the amx level, for NVFP4's fp32-products GEMM; false when
// active_isa() is below amx.
bool amx_bf16_active();
Isa detected_isa();               // what the hardware supports
Isa active_isa();                 // what dispatch uses: detected, capped by set_isa_limit / $NIBBLE_ISA
void set_isa_limit(Isa limit);    // for tests and benchmarks; never raises above detected_isa()
std::string_view to_string(Isa isa);
// The $NIBBLE_ISA spelling of a level ("scalar", "avx2", "avx512", "avx512bf16", "amx"); nullopt for
// anything else.
std::optional<Isa> parse_isa(std::string_view name);
// cpuid's vendor string is "GenuineIntel": for choices made per vendor where both ways give the same
// bits and only the speed differs (gemm.h: bf16_pair_kernel).
bool genuine_intel();

}  // namespace nibble::cpu
