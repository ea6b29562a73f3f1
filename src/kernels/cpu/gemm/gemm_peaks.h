// Measured instruction peaks of this CPU, for judging GEMM kernels against what the hardware can
// do rather than against each other. Each loop runs one thread with enough independent
// accumulators to cover the instruction's latency, so it measures throughput per core.
#pragma once

namespace nibble::cpu {

struct InstructionPeak {
  const char* instruction;  // what was measured, e.g. "vfmadd231ps zmm"
  double giga_ops_per_s;    // per core; a multiply-add counts as 2 operations
};

// FP32 FMA at the widest vector width this CPU runs (zmm with AVX-512, else ymm).
InstructionPeak measure_fma_f32_peak(double seconds = 0.2);
// int8 multiply-accumulate: vpdpbusd zmm with AVX-512 VNNI, else vpmaddubsw ymm (AVX2).
InstructionPeak measure_int8_dot_peak(double seconds = 0.2);
// int8 tile multiply (AMX-INT8 tdpbssd at its full K of 64), where the CPU has AMX; else 0.
InstructionPeak measure_amx_int8_peak(double seconds = 0.2);
// BF16 tile multiply (AMX-BF16 tdpbf16ps, K=32, FP32 accumulate), where the CPU has it; else 0.
InstructionPeak measure_amx_bf16_peak(double seconds = 0.2);

}  // namespace nibble::cpu
