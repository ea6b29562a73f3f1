// Operand rules every GEMM backend (kernels/cpu, kernels/cuda) enforces with the same words.
#pragma once
#include <string>

#include "format/quantized_tensor.h"

namespace nibble {

// The random Hadamard transform cancels in a product only when both operands carry it
// ((x H)(w H)^T = x w^T since H H^T = I); one transformed operand gives a silently wrong result.
inline void check_rht_pair(bool a_rht, bool b_rht) {
  if (a_rht != b_rht)
    throw UsageError("gemm: the random Hadamard transform must be applied to both operands or to neither "
                     "(H H^T = I only cancels in pairs); got A rht=" + std::to_string(a_rht) +
                     ", B rht=" + std::to_string(b_rht));
}

}  // namespace nibble
