// Which SIMD kernels this CPU can run, read once from cpuid. Every dispatching entry point picks
// its variant from here at first use; tests can force a lower one to check every variant.
#pragma once
#include <string_view>

namespace nibble::cpu {

// Ordered: each level implies the ones below it.
//   avx512: F+BW+VL+DQ+VNNI.
//   amx:    avx512 plus AMX-TILE and AMX-INT8, enabled by the OS for this process (Linux grants the
//           tile state on request, arch_prctl ARCH_REQ_XCOMP_PERM). Only the block-scaled int8
//           GEMM has an AMX kernel; every other entry point runs its avx512 variant at this level.
enum class Isa { scalar = 0, avx2 = 1, avx512 = 2, amx = 3 };

// AMX-BF16 (tdpbf16ps) on top of the amx level, for NVFP4's fp32-products GEMM; false when
// active_isa() is below amx.
bool amx_bf16_active();
Isa detected_isa();               // what the hardware supports
Isa active_isa();                 // what dispatch uses: detected, capped by set_isa_limit / $NIBBLE_ISA
void set_isa_limit(Isa limit);    // for tests and benchmarks; never raises above detected_isa()
std::string_view to_string(Isa isa);

}  // namespace nibble::cpu
