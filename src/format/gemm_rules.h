// The GEMM contract every backend (kernels/cpu, kernels/cuda, and the seam above them, ops/) shares:
// the enums of a call and the operand rules, enforced with the same words.
#pragma once
#include <cstdint>
#include <string>

#include "format/quantized_tensor.h"

namespace nibble {

// How the products of a quantized GEMM are summed (NVFP4, MXFP4 and per-tensor FP8; MXFP8 always
// sums as block_exact describes for its family).
//  * block_exact (spec section 5): each 16-element block product is an exact integer, multiplied by
//    sA*sB and added to the FP32 accumulator with one rounding per block, blocks in K order. The same
//    bits on every CPU ISA (AMX-INT8, AVX-512 VNNI, AVX2, scalar).
//  * fp32_products (spec section 7, the route Hopper takes): both operands decoded exactly to BF16
//    (e2m1 * e4m3 fits, as do E4M3 and E5M2 values and e2m1 * e8m0 while the scale stays within
//    2^-125..2^125), each element product exact, summed in FP32 in the hardware's order: differs
//    from block_exact within the FP32-accumulation bound, bitwise the same for any thread count. A
//    backend without such a kernel for a format runs block_exact (ops::TensorOps::fp32_products_available).
enum class Summation : uint8_t { block_exact, fp32_products };
// Whether a GEMM overwrites C or adds its product to C.
enum class Output : uint8_t { overwrite, accumulate };
// BLAS-style operand transposition (row-major storage).
enum class Trans : uint8_t { no, yes };

// The random Hadamard transform cancels in a product only when both operands carry it
// ((x H)(w H)^T = x w^T since H H^T = I); one transformed operand gives a silently wrong result.
inline void check_rht_pair(bool a_rht, bool b_rht) {
  if (a_rht != b_rht)
    throw UsageError("gemm: the random Hadamard transform must be applied to both operands or to neither "
                     "(H H^T = I only cancels in pairs); got A rht=" + std::to_string(a_rht) +
                     ", B rht=" + std::to_string(b_rht));
}

}  // namespace nibble
