// The amaxes an operand's quantize_both needs before its encode pass (the global scale comes first:
// spec section 4), gathered by the op that produced the operand while its rows were in cache (the
// producer's epilogue: RMSNorm, SwiGLU), so the quantizer skips its own amax pass over the tensor.
// Both are maxima: the order in which stripes of rows and threads contribute changes no bit.
#pragma once
#include <cstdint>

namespace nibble {

struct SourceAmax {
  bool rht = false;    // asked for: x^T takes the RHT (transposed_rht_amax is gathered too)
  bool valid = false;  // set by a producer that gathered it; else the quantizer makes its own pass
  // max |x| as FP32 bits with the sign cleared (integer order = float order; >= 0x7F800000: an Inf
  // or NaN is present).
  uint32_t max_abs_bits = 0;
  // With rht: the amax of x^T's 16-blocks after the RHT and the BF16 rounding (meaningful when
  // max |x| is below 2^122, where no transformed value can overflow).
  float transposed_rht_amax = 0;
};

}  // namespace nibble
