// Fast CPU quantize/dequantize: vectorised (AVX-512, AVX2, scalar; chosen once from cpuid) and
// multi-threaded. Bit-identical to nibble::ref (format/quantize.h) for every format and rounding:
// stochastic rounding draws from the same Philox stream indexed by element, so the result does
// not depend on the thread count either. This is what every caller above kernels/ should use.
#pragma once
#include <cstdint>
#include <span>

#include "format/quantize.h"
#include "format/source_amax.h"

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
// known: x's amaxes gathered by its producer (gather_source_amax); used when valid and when its rht
// matches t_opt's (and x is finite and small enough for the RHT), else the pass is made here.
void quantize_both_into(std::span<const float> x, int64_t rows, int64_t cols, const QuantOptions& row_opt,
                        QuantizedTensor& row_out, const QuantOptions& t_opt, QuantizedTensor& t_out,
                        const SourceAmax* known = nullptr);
// A producer's epilogue: folds the amaxes of rows [row_begin, row_end) of x ([*, cols], just
// written) into `into` (a maximum; sets into.valid). cols % 16 == 0; with into.rht the stripe is
// whole 16-row token blocks (row_begin % 16 == 0, (row_end - row_begin) % 16 == 0). One thread.
void gather_source_amax(const float* x, int64_t cols, int64_t row_begin, int64_t row_end, SourceAmax& into);
// Folds `part` (a thread's gather) into `into`.
void merge_source_amax(const SourceAmax& part, SourceAmax& into);
// max |x| (threaded): +Inf or NaN when x holds one.
float max_abs(std::span<const float> x);
// Rows of a larger tensor whose amax is tensor_amax, quantized with that tensor's global scale: the
// whole tensor's bytes for these rows when they start on a block (16x16: tile) boundary. NVFP4, RN,
// no RHT, no row scaling; UsageError otherwise (or for a shape ref::validate refuses), NumericalError
// for non-finite x; internal error when max |x| > tensor_amax.
void quantize_rows_of_into(std::span<const float> x, int64_t rows, int64_t cols, const QuantOptions& opt,
                           float tensor_amax, QuantizedTensor& out);
void dequantize(const QuantizedTensor& q, std::span<float> out);
// The exact transpose of a 16x16-tile NVFP4 tensor (ref::transpose_tiles, threaded): the column-wise
// copy of a weight without quantizing it again. UsageError for other blocks or rows % 16 != 0.
QuantizedTensor transpose_tiles(const QuantizedTensor& q);

}  // namespace nibble::cpu
