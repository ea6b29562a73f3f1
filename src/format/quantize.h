// The scalar reference quantizers: the spec (docs/nvfp4-spec.md section 3-6) in code. Every fast
// path (kernels/cpu, kernels/cuda) must produce the same bytes for round-to-nearest and the same
// bytes for stochastic rounding (same Philox stream).
#pragma once
#include <cstdint>
#include <span>

#include "format/codecs.h"
#include "format/quantized_tensor.h"

namespace nibble::ref {

// x: row-major [rows, cols]. Throws UsageError for shapes that do not fit the block (cols not a
// multiple of the block; rows not a multiple of 16 for 16x16 tiles), non-finite values (naming the
// first offending index) and option combinations that do not apply to the format.
QuantizedTensor quantize(std::span<const float> x, int64_t rows, int64_t cols, const QuantOptions& opt);
QuantizedTensor quantize(std::span<const bf16> x, int64_t rows, int64_t cols, const QuantOptions& opt);

// Column-wise copy: the quantization of x^T ([cols, rows]), so a GEMM gets the other orientation
// K-contiguous. For 16x16 tiles it is the exact transpose of the row-wise codes and scales.
QuantizedTensor quantize_transposed(std::span<const float> x, int64_t rows, int64_t cols,
                                    const QuantOptions& opt);
// Exact transpose of a 16x16-tile NVFP4 tensor (codes and scales); UsageError for other blocks.
QuantizedTensor transpose_tiles(const QuantizedTensor& q);

// Values in the quantized domain (after RHT when q.rht): codes * block scale * global scale.
void dequantize_codes(const QuantizedTensor& q, std::span<float> out);
// Values in the original domain: dequantize_codes followed by the inverse RHT when q.rht.
void dequantize(const QuantizedTensor& q, std::span<float> out);

// Validation shared by every implementation: throws UsageError with the reason.
void validate(std::span<const float> x, int64_t rows, int64_t cols, const QuantOptions& opt);

// Pieces of the chain, exposed for the fast paths and tests.
struct Nvfp4GlobalScale {
  float encode;  // S_enc
  float decode;  // S_dec = 1 / S_enc
};
Nvfp4GlobalScale nvfp4_global_scale(float amax, bool four_over_six);
// Quantize one block of n (16) values with the global encode scale; returns the scale byte.
uint8_t nvfp4_quantize_block(const float* x, int n, float block_amax, Nvfp4GlobalScale g, bool four_over_six,
                             Rounding rounding, uint64_t seed, uint64_t first_index, uint8_t* codes_out);

}  // namespace nibble::ref
