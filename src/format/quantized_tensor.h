// A quantized tensor is a struct, not a dtype flag: packed element codes, block scales, the
// global amax/scale and how it was made. Row-major [rows, cols]; `cols` is the reduction
// dimension K of a GEMM and is always contiguous (blocks run along it).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace nibble {

enum class Format : uint8_t { nvfp4, mxfp4, mxfp8, fp8_e4m3, fp8_e5m2 };
enum class BlockShape : uint8_t { per_tensor, row_1x16, tile_16x16, row_1x32 };
enum class Rounding : uint8_t { nearest, stochastic };
// Four Over Six (TE `nvfp4_4over6_err_mode`): how a block's map-to-4 and map-to-6 candidates are
// compared, in the original domain: the sum of |error| (MAE, TE's default) or of error^2 (MSE).
enum class FourOverSixError : uint8_t { mae, mse };

struct QuantOptions {
  Format format = Format::nvfp4;
  bool tile_16x16 = false;      // nvfp4 only: one scale per 16x16 tile (weights), else 1x16
  Rounding rounding = Rounding::nearest;
  uint64_t seed = 0;            // stochastic rounding: Philox key
  uint64_t offset = 0;          // stochastic rounding: stream position of element 0
  bool rht = false;             // nvfp4 only: 16-point random Hadamard transform along rows
  bool four_over_six = false;   // nvfp4 only: per block (16x16: per tile), scale to 4 or 6, whichever errs less
  // With four_over_six (ignored without it; spec section 4): the error measure, and the E4M3
  // ceiling of the global scale, S_enc = (6 * four_over_six_e4m3_max) / amax: 448 (TE's default,
  // numerator 2688) or 256 (the paper's, numerator 1536). Any other value is a UsageError.
  FourOverSixError four_over_six_error = FourOverSixError::mae;
  int four_over_six_e4m3_max = 448;
  // nvfp4 only: one FP32 global scale per row instead of one per tensor (TE's row-scaled NVFP4,
  // `row_scaled_nvfp4` / recipe `row_scaled_activation`, spec section 4b): row r's S_enc is the
  // per-tensor formula on that row's amax. 1x16 blocks, no RHT, no SR, no Four Over Six, as TE.
  bool row_scaled = false;

  bool operator==(const QuantOptions&) const = default;
};

// What a quantized tensor is, wherever its bytes live: the one description shared by the host
// tensor below, the CUDA backend's device tensor (kernels/cuda/quantize.h) and the backend seam
// (ops/backend.h). Copying a tensor between host and device copies this struct, then the storage.
struct QuantizedLayout {
  Format format = Format::nvfp4;
  BlockShape block = BlockShape::row_1x16;
  Rounding rounding = Rounding::nearest;
  bool rht = false;
  bool four_over_six = false;
  // As QuantOptions; without four_over_six always the defaults (mae, 448), so the global scale is
  // S_enc = nvfp4_global_numerator(*this) / amax in every case.
  FourOverSixError four_over_six_error = FourOverSixError::mae;
  int four_over_six_e4m3_max = 448;
  bool row_scaled = false;  // as QuantOptions: a global scale per row (QuantizedTensor::row_*)
  int64_t rows = 0, cols = 0;

  int64_t block_len() const;            // elements per scale along a row (16, 32, or cols)
  int64_t scale_cols() const { return block == BlockShape::per_tensor ? 0 : cols / block_len(); }
  bool is_4bit() const { return format == Format::nvfp4 || format == Format::mxfp4; }
  int64_t row_bytes() const { return is_4bit() ? cols / 2 : cols; }
  int64_t code_bytes() const { return rows * row_bytes(); }
  int64_t scale_bytes() const { return rows * scale_cols(); }
};

// A quantized tensor in host memory.
struct QuantizedTensor : QuantizedLayout {
  std::vector<uint8_t> codes;   // 4-bit formats: rows*cols/2 (packed, low nibble first); 8-bit: rows*cols
  std::vector<uint8_t> scales;  // rows * (cols/block_len): E4M3 (nvfp4) or E8M0 (mx); empty per tensor
  float amax = 0.0f;            // global amax (of the transformed values when rht); row_scaled: max of row_amax
  float decode_scale = 1.0f;    // nvfp4: S_dec = 1/S_enc; fp8: 1/scale; mx: 1; row_scaled: 1 (unused)
  // row_scaled only ([rows] each, empty otherwise): each row's amax (what TE stores as its rowwise
  // amax vector) and its S_dec = 1 / S_enc(row amax), which the GEMM epilogue applies per row.
  std::vector<float> row_amax, row_decode_scale;

  // The global decode scale of row r: row_decode_scale[r] when row_scaled, else decode_scale.
  float decode_scale_of_row(int64_t r) const {
    return row_scaled ? row_decode_scale[static_cast<size_t>(r)] : decode_scale;
  }

  QuantizedLayout& layout() { return *this; }
  const QuantizedLayout& layout() const { return *this; }
};

// Formats whose elements are E2M1 codes packed two per byte.
inline bool is_4bit(Format f) { return f == Format::nvfp4 || f == Format::mxfp4; }
// The FP8 formats with one scale per tensor (fp8_e4m3, fp8_e5m2); mxfp8's E4M3 elements carry
// 1x32 block scales and are not among them.
inline bool is_per_tensor_fp8(Format f) { return f == Format::fp8_e4m3 || f == Format::fp8_e5m2; }
// The OCP microscaling formats: one E8M0 scale per 32 elements.
inline bool is_mx(Format f) { return f == Format::mxfp4 || f == Format::mxfp8; }
// Storage per element of a tensor in format f: its code plus its share of the block scale
// (NVFP4: one E4M3 per 16, MX: one E8M0 per 32, FP8: one FP32 per tensor, counted as none).
inline double stored_bytes_per_element(Format f) {
  switch (f) {
    case Format::nvfp4: return 0.5 + 1.0 / 16;
    case Format::mxfp4: return 0.5 + 1.0 / 32;
    case Format::mxfp8: return 1.0 + 1.0 / 32;
    case Format::fp8_e4m3:
    case Format::fp8_e5m2: return 1.0;
  }
  return 1.0;
}
// The block shape a quantization with these options produces (shared by every implementation).
BlockShape block_shape_of(const QuantOptions& o);
// The layout of the [rows, cols] tensor a quantization with these options produces (every backend's
// quantizers start from it).
QuantizedLayout layout_of(const QuantOptions& o, int64_t rows, int64_t cols);

std::string_view to_string(Format f);
std::string_view to_string(BlockShape b);
std::string_view to_string(Rounding r);
std::string_view to_string(FourOverSixError e);  // "mae" / "mse"
Format parse_format(std::string_view s);  // throws UsageError listing the valid names
// "mae" or "mse"; anything else is a UsageError that names `what` (the key or flag), the value and
// the valid ones.
FourOverSixError parse_four_over_six_error(std::string_view s, std::string_view what);
// "448" or "256" (the text of a key or flag); anything else is a UsageError as above.
int parse_four_over_six_e4m3_max(std::string_view s, std::string_view what);
// Throws that UsageError unless v is 448 or 256.
void check_four_over_six_e4m3_max(int v, std::string_view what);

// Global constants of the NVFP4 chain (spec section 3 / 4).
inline constexpr float kNvfp4GlobalScaleNumerator = 448.0f * 6.0f;        // 2688
inline constexpr int kFourOverSixDefaultE4m3Max = 448;                   // TE's nvfp4_e4m3_max default
// The numerator of S_enc: 6 * 448 = 2688, or 6 * four_over_six_e4m3_max with Four Over Six
// (2688 or 1536), exactly as TE: (e4m3_max * 6) / amax.
inline float nvfp4_global_numerator(bool four_over_six, int four_over_six_e4m3_max) {
  return four_over_six ? 6.0f * static_cast<float>(four_over_six_e4m3_max) : kNvfp4GlobalScaleNumerator;
}
inline float nvfp4_global_numerator(const QuantOptions& o) {
  return nvfp4_global_numerator(o.four_over_six, o.four_over_six_e4m3_max);
}
inline float nvfp4_global_numerator(const QuantizedLayout& q) {
  return nvfp4_global_numerator(q.four_over_six, q.four_over_six_e4m3_max);
}
// The Four Over Six fields a tensor made with these options carries (the defaults without it).
inline FourOverSixError four_over_six_error_of(const QuantOptions& o) {
  return o.four_over_six ? o.four_over_six_error : FourOverSixError::mae;
}
inline int four_over_six_e4m3_max_of(const QuantOptions& o) {
  return o.four_over_six ? o.four_over_six_e4m3_max : kFourOverSixDefaultE4m3Max;
}

}  // namespace nibble

