// Warp-level BF16 tensor-core products for the tiled attention (flash_attention.cuh):
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, D[16x8] = A[16x16] B[16x8] + C, FP32
// accumulation, issued by all 32 lanes of a warp together. Each lane holds pieces ("fragments") of
// A, B and C/D in registers, laid out as the PTX ISA's "Matrix Fragments for mma.m16n8k16 with
// floating point type" says, with g = lane / 4 and t = lane % 4 (two BF16 values per 32-bit
// register, the lower column or row index in the low 16 bits):
//   A (row-major): a[0] = (row g,   cols 2t, 2t+1)     a[1] = (row g+8, cols 2t, 2t+1)
//                  a[2] = (row g,   cols 2t+8, 2t+9)   a[3] = (row g+8, cols 2t+8, 2t+9)
//   B (col-major): b[0] = (rows 2t, 2t+1, col g)       b[1] = (rows 2t+8, 2t+9, col g)
//   C, D (FP32):   c[0], c[1] = (row g, cols 2t, 2t+1)  c[2], c[3] = (row g+8, cols 2t, 2t+1)
// Under the CUDA model (tests/emulated/cuda_model) the instruction is the model's warp collective,
// which gathers the 32 lanes' fragments by this very layout, multiplies, and scatters D back.
#pragma once
#include <cstdint>

#include "kernels/cuda/device_math.h"

namespace nibble::cuda::mma {

// c = a b + c over one warp (every lane calls it, converged).
__device__ __forceinline__ void mma_bf16_16x8x16(float c[4], const uint32_t a[4], const uint32_t b[2]) {
#if defined(NIBBLE_CUDA_MODEL)
  cuda_model::mma_bf16_m16n8k16(c, a, b);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(__CUDA_ARCH__)
  __trap();  // BF16 mma.sync needs sm_80: layers.cu never launches the tiled kernels below (flash::supports)
#else
  (void)c, (void)a, (void)b;  // nvcc's host pass: device-only code
#endif
}

// Two values rounded to BF16 (round to nearest even) in one register: lo in the low half. On the GPU
// one conversion instruction for the pair (the same bits as dm::bf16_bits_rn for every non-NaN
// value; a NaN stays a NaN, with the hardware's payload).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
#if !defined(NIBBLE_CUDA_MODEL) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(hi), "f"(lo));  // the first source is the high half
  return packed;
#else
  return static_cast<uint32_t>(dm::bf16_bits_rn(lo)) | static_cast<uint32_t>(dm::bf16_bits_rn(hi)) << 16;
#endif
}

}  // namespace nibble::cuda::mma
