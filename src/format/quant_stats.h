// Error statistics of one quantization, as the trainer logs them per layer.
#pragma once
#include <cstdint>
#include <span>

#include "format/quantized_tensor.h"

namespace nibble {

struct QuantStats {
  int64_t count = 0;
  double rel_rms_error = 0;   // ||x - x'|| / ||x|| (0 for an all-zero x)
  double snr_db = 0;          // -20 log10(rel_rms_error); +inf when exact
  int64_t flushed_to_zero = 0;  // x != 0 but x' == 0
  int64_t saturated = 0;        // |x| beyond the largest value its block's scale can represent
  float amax = 0;
};

// x: the original tensor the quantization was made from (row-major [q.rows, q.cols]).
QuantStats quant_stats(std::span<const float> x, const QuantizedTensor& q);

}  // namespace nibble
