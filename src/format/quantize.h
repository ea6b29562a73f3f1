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
// multiple of the block; rows not a multiple of 16 for 16x16 tiles) and option combinations that do
// not apply to the format; NumericalError (a UsageError) for non-finite values, naming the first
// offending index.
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
// The option part of it for row-scaled NVFP4 (QuantOptions::row_scaled): UsageError for a format,
// block, RHT, SR or Four Over Six that Transformer Engine's row-scaled quantizer refuses.
void check_row_scaled(const QuantOptions& opt);

// Pieces of the chain, exposed for the fast paths and tests.
struct Nvfp4GlobalScale {
  float encode;     // S_enc = min(numerator / amax, FLT_MAX), 1 when amax == 0 (or S_enc == 0)
  float decode;     // S_dec = 1 / S_enc
  float amax;       // the tensor amax: Four Over Six measures its error with it, as TE does
  float numerator;  // 6 * the E4M3 ceiling: 2688, or 1536 (Four Over Six with e4m3_max 256)
};
// numerator: nvfp4_global_numerator(options) (quantized_tensor.h).
Nvfp4GlobalScale nvfp4_global_scale(float amax, float numerator);
Nvfp4GlobalScale nvfp4_global_scale(float amax, bool) = delete;  // the old (amax, four_over_six) form
// Quantize one block of n (16) values the plain way (block max to 6, spec section 3): returns the
// scale byte. Four Over Six is four_over_six_candidates below.
uint8_t nvfp4_quantize_block(const float* x, int n, float block_amax, Nvfp4GlobalScale g, Rounding rounding,
                             uint64_t seed, uint64_t first_index, uint8_t* codes_out);

// Four Over Six (spec section 4; TE `_quantize_blockwise_4over6_reference`, non-fast-math error).
// Block scale bytes from the block (or 16x16 tile) amax b, in TE's order of FP32 operations:
// map6 = E4M3(min((b / 6) * S_enc, 448)), map4 = E4M3(min(((b / 6) * S_enc) * 1.5, 448)).
struct FourOverSixScales {
  uint8_t map6, map4;
};
FourOverSixScales four_over_six_scales(float block_amax, const Nvfp4GlobalScale& g);
// The error of one block quantized to `codes` (one per element) with scale byte `scale`, against
// the values x it came from: sum over k in index order, in FP32, of |d_k| (MAE) or d_k * d_k (MSE),
// d_k = ((e2m1(code_k) * e4m3(scale)) * amax) / numerator - x_k.
float four_over_six_error(const float* x, const uint8_t* codes, uint8_t scale, const Nvfp4GlobalScale& g,
                          FourOverSixError measure);
// Both candidates of one block of 16: codes (one per element, RN or SR with the block's own
// stream bytes, the same for both) and errors.
struct FourOverSixCandidates {
  FourOverSixScales scales;
  float error6, error4;
  uint8_t codes6[16], codes4[16];
};
FourOverSixCandidates four_over_six_candidates(const float* x, float block_amax, const Nvfp4GlobalScale& g,
                                               FourOverSixError measure, Rounding rounding, uint64_t seed,
                                               uint64_t first_index);
// A 16x16 tile's error from its 16 row errors (rows past the tensor's end count 0), in TE's
// tree order (`_sum_4over6_2d_error`): a_i = r_i + r_{i+8}, b_i = a_i + a_{i+4}, c_i = b_i + b_{i+2},
// c_0 + c_1.
float four_over_six_tile_error(const float* row_errors16);
// TE's rule: map to 4 only when it errs strictly less (ties, and NaN, keep 6).
inline bool four_over_six_picks_map4(float error4, float error6) { return error4 < error6; }

}  // namespace nibble::ref
