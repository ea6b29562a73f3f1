// One quantized tensor in a safetensors file: what `nibble quantize` writes and `nibble dequantize`
// reads (numpy/PyTorch/JAX users exchange NVFP4, MXFP4, MXFP8 and FP8 tensors through it). Layout:
//   codes   U8       [rows, cols/2] (4-bit, two per byte, low nibble first) or [rows, cols] (8-bit)
//   scales  F8_E4M3  [rows, cols/16] (nvfp4) or U8 [rows, cols/32] (E8M0 exponents, mx formats)
//   scale   F32      [1] the per-tensor decode scale (fp8_e4m3 / fp8_e5m2 only)
//   amax    F32      [1] the global amax (of the RHT-transformed values when rht)
//   __metadata__: format, block, rounding, seed, rht, four_over_six, four_over_six_error (mae|mse),
//   four_over_six_e4m3_max (448|256), transposed, rows, cols, source_dtype, nibble_version.
// rows/cols are the shape of the stored (quantized) tensor; `transposed` says it is the quantization
// of the original's transpose (the column-wise GEMM operand).
//
// Compatibility: the global decode scale is recomputed from amax, S_dec = 1 / ((6 * e4m3_max) /
// amax), with e4m3_max = four_over_six_e4m3_max under Four Over Six, else 448. Files written before
// the two four_over_six_* keys existed (both absent) hold the old fixed Four Over Six numerator
// 256 * 6, so a missing four_over_six_e4m3_max reads as 256 when four_over_six is true (448
// otherwise) and dequantizes exactly as before; a missing four_over_six_error reads as mse (the old
// rule compared squared errors, per row, in the scaled domain - not TE's rule, so re-quantizing such
// a file's source gives different bytes, while its dequantized values are unchanged). Only one of
// the two keys is refused, as is any field that disagrees with the others.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "format/quantized_tensor.h"
#include "io/npy.h"
#include "io/safetensors.h"

namespace nibble::io {

// The block shapes format f stores, as --block and the metadata name them ("1x16 or 16x16", "1x32",
// "tensor (one scale per tensor)").
std::string_view block_names(Format f);
// The block shape `name` stands for in format f; nullopt when f does not store that block.
std::optional<BlockShape> parse_block_name(Format f, std::string_view name);

// The file for q; `seed` is the stochastic-rounding seed it was made with, `source_dtype` the dtype
// of the .npy it came from (recorded in the metadata).
SafetensorsFile quantized_to_safetensors(const QuantizedTensor& q, uint64_t seed, bool transposed,
                                         NpyDType source_dtype);

struct QuantizedFile {
  QuantizedTensor tensor;
  bool transposed = false;  // tensor holds the transpose of the original
};

// Reads back what quantized_to_safetensors wrote, checking every field against the others: a damaged
// or foreign file is a UsageError "<source>: not a valid nibble quantized tensor: <reason>" instead
// of garbage values. `source` labels the messages (a path).
QuantizedFile quantized_from_safetensors(const SafetensorsFile& file, const std::string& source);

}  // namespace nibble::io
