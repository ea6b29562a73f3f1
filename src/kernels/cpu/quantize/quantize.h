// Fast CPU quantize/dequantize: vectorised (AVX-512, AVX2, scalar; chosen once from cpuid) and
// multi-threaded. Bit-identical to nibble::ref (format/quantize.h) for every format and rounding:
// stochastic rounding draws from the same Philox stream indexed by element, so the result does
// not depend on the thread count either. This is what every caller above kernels/ should use.
#pragma once
#include <cstdint>
#include <span>

#include "format/quantize.h"

namespace nibble::cpu {

QuantizedTensor quantize(std::span<const float> x, int64_t rows, int64_t cols, const QuantOptions& opt);
QuantizedTensor quantize(std::span<const bf16> x, int64_t rows, int64_t cols, const QuantOptions& opt);
// As quantize(), into `out`, reusing the capacity of its code and scale buffers: a caller that
// quantizes same-shaped tensors repeatedly (every training step) pays no allocation, no page
// faults and no zero-fill. `out` is left in an unspecified state if this throws.
void quantize_into(std::span<const float> x, int64_t rows, int64_t cols, const QuantOptions& opt, QuantizedTensor& out);
QuantizedTensor quantize_transposed(std::span<const float> x, int64_t rows, int64_t cols, const QuantOptions& opt);
// As quantize_transposed(), into `out` (capacity reused, as quantize_into).
void quantize_transposed_into(std::span<const float> x, int64_t rows, int64_t cols, const QuantOptions& opt,
                              QuantizedTensor& out);
// Both quantizations a Linear makes of one operand: x row-wise (fprop's X, dgrad's dY) into
// row_out and x^T (wgrad's) into t_out; the same bytes as quantize_into + quantize_transposed_into.
// x^T first: its amax pass also yields max |x|, which is the row-wise NVFP4 amax, so x is read once
// less. A non-finite x is reported by the x^T quantization (indices of x^T).
void quantize_both_into(std::span<const float> x, int64_t rows, int64_t cols, const QuantOptions& row_opt,
                        QuantizedTensor& row_out, const QuantOptions& t_opt, QuantizedTensor& t_out);
void dequantize(const QuantizedTensor& q, std::span<float> out);
// The exact transpose of a 16x16-tile NVFP4 tensor (ref::transpose_tiles, threaded): the column-wise
// copy of a weight without quantizing it again. UsageError for other blocks or rows % 16 != 0.
QuantizedTensor transpose_tiles(const QuantizedTensor& q);

}  // namespace nibble::cpu
