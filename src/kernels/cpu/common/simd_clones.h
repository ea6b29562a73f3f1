// Per-ISA copies of plain C++ loops. The baseline x86-64 build runs a loop four floats at a time
// (SSE2); a function marked NIBBLE_SIMD_CLONES is compiled three times (AVX-512, AVX2 + FMA, baseline)
// and the loader picks the copy from cpuid, so the same source runs 8 or 16 floats wide where the
// CPU allows. The build disables FMA contraction (-ffp-contract=off) and every loop so marked is
// element-wise or sums in an order written in the source, so each copy gives the same bits.
//
// An OpenMP parallel region is outlined into a function of its own that the attribute does not
// reach: mark the per-row or per-range function that the region calls, not the caller.
#pragma once

#define NIBBLE_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
