// Scalar reference quantizers: docs/nvfp4-spec.md sections 3, 4 and 6, one element at a time,
// FP32 arithmetic in the spec's order. Deliberately simple; speed lives in kernels/.
#pragma GCC optimize("fp-contract=off")  // each FP32 operation rounds on its own, also under -march flags
#include <algorithm>
#include <cfloat>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "format/hadamard.h"
#include "format/philox.h"
#include "format/quantize.h"

namespace nibble {

QuantizedLayout layout_of(const QuantOptions& o, int64_t rows, int64_t cols) {
  QuantizedLayout l;
  l.format = o.format;
  l.block = block_shape_of(o);
  l.rounding = o.rounding;
  l.rht = o.rht;
  l.four_over_six = o.four_over_six;
  l.four_over_six_error = four_over_six_error_of(o);
  l.four_over_six_e4m3_max = four_over_six_e4m3_max_of(o);
  l.row_scaled = o.row_scaled;
  l.rows = rows;
  l.cols = cols;
  return l;
}

int64_t QuantizedLayout::block_len() const {
  switch (block) {
    case BlockShape::row_1x16:
    case BlockShape::tile_16x16: return 16;
    case BlockShape::row_1x32: return 32;
    case BlockShape::per_tensor: return cols;
  }
  return cols;
}

BlockShape block_shape_of(const QuantOptions& o) {
  switch (o.format) {
    case Format::nvfp4: return o.tile_16x16 ? BlockShape::tile_16x16 : BlockShape::row_1x16;
    case Format::mxfp4:
    case Format::mxfp8: return BlockShape::row_1x32;
    default: return BlockShape::per_tensor;
  }
}

std::string_view to_string(Format f) {
  switch (f) {
    case Format::nvfp4: return "nvfp4";
    case Format::mxfp4: return "mxfp4";
    case Format::mxfp8: return "mxfp8";
    case Format::fp8_e4m3: return "fp8_e4m3";
    case Format::fp8_e5m2: return "fp8_e5m2";
  }
  return "?";
}
std::string_view to_string(BlockShape b) {
  switch (b) {
    case BlockShape::per_tensor: return "tensor";
    case BlockShape::row_1x16: return "1x16";
    case BlockShape::tile_16x16: return "16x16";
    case BlockShape::row_1x32: return "1x32";
  }
  return "?";
}
std::string_view to_string(Rounding r) { return r == Rounding::nearest ? "rn" : "sr"; }

std::string_view to_string(FourOverSixError e) { return e == FourOverSixError::mse ? "mse" : "mae"; }

FourOverSixError parse_four_over_six_error(std::string_view s, std::string_view what) {
  if (s == "mae") return FourOverSixError::mae;
  if (s == "mse") return FourOverSixError::mse;
  throw UsageError(std::string(what) + " '" + std::string(s) +
                   "' is not a Four Over Six error measure: use mae (sum of |error|, TE's default) or mse (sum of "
                   "squared errors)");
}

void check_four_over_six_e4m3_max(int v, std::string_view what) {
  if (v != 448 && v != 256)
    throw UsageError(std::string(what) + " " + std::to_string(v) +
                     " is not a valid E4M3 ceiling for the Four Over Six global scale: use 448 (TE's default, "
                     "S_enc = 2688 / amax) or 256 (the paper's, S_enc = 1536 / amax)");
}

int parse_four_over_six_e4m3_max(std::string_view s, std::string_view what) {
  if (s == "448") return 448;
  if (s == "256") return 256;
  throw UsageError(std::string(what) + " '" + std::string(s) +
                   "' is not a valid E4M3 ceiling for the Four Over Six global scale: use 448 (TE's default, "
                   "S_enc = 2688 / amax) or 256 (the paper's, S_enc = 1536 / amax)");
}

Format parse_format(std::string_view s) {
  for (Format f : {Format::nvfp4, Format::mxfp4, Format::mxfp8, Format::fp8_e4m3, Format::fp8_e5m2})
    if (s == to_string(f)) return f;
  throw UsageError("unknown format '" + std::string(s) + "': use one of nvfp4, mxfp4, mxfp8, fp8_e4m3, fp8_e5m2");
}

namespace ref {
namespace {


QuantizedTensor make_header(int64_t rows, int64_t cols, const QuantOptions& o) {
  QuantizedTensor q;
  q.layout() = layout_of(o, rows, cols);
  q.codes.assign(static_cast<size_t>(q.code_bytes()), 0);
  q.scales.assign(static_cast<size_t>(q.scale_bytes()), 0);
  return q;
}

float amax_of(std::span<const float> x) {
  float m = 0.0f;
  for (float v : x) m = std::max(m, std::fabs(v));
  return m;
}

void put_code(QuantizedTensor& q, int64_t i, uint8_t code) {
  if (q.is_4bit()) {
    uint8_t& b = q.codes[static_cast<size_t>(i / 2)];
    b = (i & 1) ? static_cast<uint8_t>((b & 0x0F) | (code << 4)) : static_cast<uint8_t>((b & 0xF0) | code);
  } else {
    q.codes[static_cast<size_t>(i)] = code;
  }
}

uint8_t get_code(const QuantizedTensor& q, int64_t i) {
  if (!q.is_4bit()) return q.codes[static_cast<size_t>(i)];
  uint8_t b = q.codes[static_cast<size_t>(i / 2)];
  return (i & 1) ? unpack_e2m1_hi(b) : unpack_e2m1_lo(b);
}

uint8_t e2m1_encode(float v, Rounding r, uint64_t seed, uint64_t index) {
  // SR: 8 random bits per element, byte `index` of the seed's Philox stream (format/philox.h).
  return r == Rounding::nearest ? e2m1_encode_rn(v) : e2m1_encode_sr(v, sr_threshold(philox_byte(seed, index)));
}

// Row-scaled NVFP4 (spec section 4, TE's row_scaled_nvfp4): section 3's chain on each row alone,
// its global scale from the row's amax. An all-zero row gets S_enc 1 (section 3) and all-zero bytes,
// the bytes TE's reference gives it (its S_enc is FLT_MAX there, which changes no byte).
void quantize_nvfp4_row_scaled(std::span<const float> x, QuantizedTensor& q, const QuantOptions& o) {
  const int64_t cols = q.cols, sc = cols / 16;
  q.row_amax.assign(static_cast<size_t>(q.rows), 0.0f);
  q.row_decode_scale.assign(static_cast<size_t>(q.rows), 1.0f);
  q.amax = 0.0f;
  q.decode_scale = 1.0f;  // unused: every row has its own
  uint8_t codes[16];
  for (int64_t r = 0; r < q.rows; ++r) {
    const float row_amax = amax_of(x.subspan(static_cast<size_t>(r * cols), static_cast<size_t>(cols)));
    const Nvfp4GlobalScale g = nvfp4_global_scale(row_amax, nvfp4_global_numerator(o));
    q.row_amax[static_cast<size_t>(r)] = row_amax;
    q.row_decode_scale[static_cast<size_t>(r)] = g.decode;
    q.amax = std::max(q.amax, row_amax);
    for (int64_t b = 0; b < sc; ++b) {
      const int64_t first = r * cols + b * 16;
      float block_amax = 0.0f;
      for (int k = 0; k < 16; ++k) block_amax = std::max(block_amax, std::fabs(x[first + k]));
      q.scales[r * sc + b] = nvfp4_quantize_block(&x[first], 16, block_amax, g, o.rounding, o.seed,
                                                  o.offset + static_cast<uint64_t>(first), codes);
      for (int k = 0; k < 16; ++k) put_code(q, first + k, codes[k]);
    }
  }
}

// NVFP4, 1x16 or 16x16, on values already transformed (RHT) if requested.
void quantize_nvfp4(std::span<const float> x, QuantizedTensor& q, const QuantOptions& o) {
  if (o.row_scaled) return quantize_nvfp4_row_scaled(x, q, o);
  q.amax = amax_of(x);
  Nvfp4GlobalScale g = nvfp4_global_scale(q.amax, nvfp4_global_numerator(o));
  q.decode_scale = g.decode;
  const int64_t rows = q.rows, cols = q.cols, sc = cols / 16;
  const int64_t tile_rows = o.tile_16x16 ? 16 : 1;
  uint8_t codes[16];
  for (int64_t r0 = 0; r0 < rows; r0 += tile_rows) {
    int64_t r1 = std::min(rows, r0 + tile_rows);
    for (int64_t b = 0; b < sc; ++b) {
      float block_amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int k = 0; k < 16; ++k) block_amax = std::max(block_amax, std::fabs(x[r * cols + b * 16 + k]));
      if (!o.four_over_six) {
        for (int64_t r = r0; r < r1; ++r) {
          int64_t first = r * cols + b * 16;
          uint8_t s = nvfp4_quantize_block(&x[first], 16, block_amax, g, o.rounding, o.seed,
                                           o.offset + static_cast<uint64_t>(first), codes);
          q.scales[r * sc + b] = s;
          for (int k = 0; k < 16; ++k) put_code(q, first + k, codes[k]);
        }
        continue;
      }
      // Four Over Six: both candidates of every row (a 1x16 block is a tile of one row), then one
      // choice per block, or per 16x16 tile from the tree sum of its row errors.
      FourOverSixCandidates c[16];
      float error4[16] = {}, error6[16] = {};  // rows past the end of the tensor count 0
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t first = r * cols + b * 16;
        c[r - r0] = four_over_six_candidates(&x[first], block_amax, g, o.four_over_six_error, o.rounding, o.seed,
                                             o.offset + static_cast<uint64_t>(first));
        error4[r - r0] = c[r - r0].error4;
        error6[r - r0] = c[r - r0].error6;
      }
      const bool tile_map4 = o.tile_16x16 && four_over_six_picks_map4(four_over_six_tile_error(error4),
                                                                      four_over_six_tile_error(error6));
      for (int64_t r = r0; r < r1; ++r) {
        const FourOverSixCandidates& cr = c[r - r0];
        const bool map4 = o.tile_16x16 ? tile_map4 : four_over_six_picks_map4(cr.error4, cr.error6);
        const int64_t first = r * cols + b * 16;
        q.scales[r * sc + b] = map4 ? cr.scales.map4 : cr.scales.map6;
        for (int k = 0; k < 16; ++k) put_code(q, first + k, map4 ? cr.codes4[k] : cr.codes6[k]);
      }
    }
  }
}

// MX formats (OCP MX, scales as Transformer Engine computes them): block 32, E8M0 scale rounded up
// so the block maximum does not saturate.
void quantize_mx(std::span<const float> x, QuantizedTensor& q, const QuantOptions& o) {
  const bool fp4 = o.format == Format::mxfp4;
  const float max_rcp = fp4 ? 1.0f / kE2M1Max : 1.0f / kE4M3Max;
  const int64_t n = q.rows * q.cols;
  q.amax = amax_of(x);
  q.decode_scale = 1.0f;
  for (int64_t first = 0; first < n; first += 32) {
    float b = 0.0f;
    for (int k = 0; k < 32; ++k) b = std::max(b, std::fabs(x[first + k]));
    uint8_t e = e8m0_encode_ceil(b * max_rcp);
    float inv = e8m0_decode_reciprocal(e);
    q.scales[first / 32] = e;
    for (int k = 0; k < 32; ++k) {
      float v = x[first + k] * inv;
      uint8_t c = fp4 ? e2m1_encode(v, o.rounding, o.seed, o.offset + first + k) : e4m3_encode_rn(v);
      put_code(q, first + k, c);
    }
  }
}

// FP8 with one FP32 scale per tensor from the current amax (TE's current scaling, margin 0).
void quantize_fp8_tensor(std::span<const float> x, QuantizedTensor& q, const QuantOptions& o) {
  const bool e4m3 = o.format == Format::fp8_e4m3;
  q.amax = amax_of(x);
  float scale = (e4m3 ? kE4M3Max : kE5M2Max) / q.amax;
  if (q.amax == 0.0f || !(scale > 0.0f)) scale = 1.0f;
  scale = std::min(scale, FLT_MAX);
  q.decode_scale = 1.0f / scale;
  for (size_t i = 0; i < x.size(); ++i) q.codes[i] = e4m3 ? e4m3_encode_rn(x[i] * scale) : e5m2_encode_rn(x[i] * scale);
}

}  // namespace

Nvfp4GlobalScale nvfp4_global_scale(float amax, float numerator) {
  float enc = std::min(numerator / amax, FLT_MAX);
  if (amax == 0.0f || enc == 0.0f) enc = 1.0f;
  return {enc, 1.0f / enc, amax, numerator};
}

namespace {
// Steps 4-5 of the chain for a given scale byte: codes of x * min(1 / (e4m3(s) * S_dec), FLT_MAX).
void nvfp4_encode_with_scale(const float* x, int n, uint8_t s, const Nvfp4GlobalScale& g, Rounding rounding,
                             uint64_t seed, uint64_t first_index, uint8_t* codes) {
  float enc = std::min(1.0f / (e4m3_decode(s) * g.decode), FLT_MAX);
  for (int k = 0; k < n; ++k) codes[k] = e2m1_encode(x[k] * enc, rounding, seed, first_index + k);
}
}  // namespace

uint8_t nvfp4_quantize_block(const float* x, int n, float block_amax, Nvfp4GlobalScale g, Rounding rounding,
                             uint64_t seed, uint64_t first_index, uint8_t* codes_out) {
  // Spec section 3, step 3: sdec = b * (S_enc * (1/6)), in this order.
  uint8_t s = e4m3_encode_rn(block_amax * (g.encode * (1.0f / 6.0f)));
  nvfp4_encode_with_scale(x, n, s, g, rounding, seed, first_index, codes_out);
  return s;
}

FourOverSixScales four_over_six_scales(float block_amax, const Nvfp4GlobalScale& g) {
  // TE: decode_scale_base = (vec_max / 6) * S_enc (the division first, unlike the plain chain),
  // map4 = base * 1.5; each clamped to 448 and cast to E4M3 (RN; the clamp is the saturation).
  const float base = (block_amax / 6.0f) * g.encode;
  const float map4 = base * 1.5f;
  return {e4m3_encode_rn(std::min(base, kE4M3Max)), e4m3_encode_rn(std::min(map4, kE4M3Max))};
}

float four_over_six_error(const float* x, const uint8_t* codes, uint8_t scale, const Nvfp4GlobalScale& g,
                          FourOverSixError measure) {
  const float sf = e4m3_decode(scale);
  float err = 0.0f;
  for (int k = 0; k < 16; ++k) {
    float val = e2m1_decode(codes[k]) * sf;  // exact: at most 2 x 4 significant bits
    val = val * g.amax;
    val = val / g.numerator;
    const float diff = val - x[k];
    err = measure == FourOverSixError::mse ? err + diff * diff : err + std::fabs(diff);
  }
  return err;
}

FourOverSixCandidates four_over_six_candidates(const float* x, float block_amax, const Nvfp4GlobalScale& g,
                                               FourOverSixError measure, Rounding rounding, uint64_t seed,
                                               uint64_t first_index) {
  FourOverSixCandidates c;
  c.scales = four_over_six_scales(block_amax, g);
  nvfp4_encode_with_scale(x, 16, c.scales.map6, g, rounding, seed, first_index, c.codes6);
  nvfp4_encode_with_scale(x, 16, c.scales.map4, g, rounding, seed, first_index, c.codes4);
  c.error6 = four_over_six_error(x, c.codes6, c.scales.map6, g, measure);
  c.error4 = four_over_six_error(x, c.codes4, c.scales.map4, g, measure);
  return c;
}

float four_over_six_tile_error(const float* r) {
  float a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i) a[i] = r[i] + r[i + 8];
  for (int i = 0; i < 4; ++i) b[i] = a[i] + a[i + 4];
  for (int i = 0; i < 2; ++i) c[i] = b[i] + b[i + 2];
  return c[0] + c[1];
}

void check_row_scaled(const QuantOptions& o) {
  if (!o.row_scaled) return;
  // TE refuses the same (NVFP4Quantizer: "Row-scaled NVFP4 quantization does not support RHT / 2D
  // quantization / stochastic rounding"; its row-scaled transpose has no 4over6).
  const char* why = o.format != Format::nvfp4                ? "applies to nvfp4 only"
                    : o.tile_16x16                            ? "needs 1x16 blocks, not 16x16 tiles"
                    : o.rht                                   ? "does not combine with the RHT"
                    : o.rounding == Rounding::stochastic      ? "does not combine with stochastic rounding"
                    : o.four_over_six                         ? "does not combine with Four Over Six"
                                                              : nullptr;
  if (why)
    throw UsageError(std::string("row-scaled quantization (one global scale per row) ") + why +
                     " (as in Transformer Engine's row_scaled_nvfp4); format " + std::string(to_string(o.format)));
}

void validate(std::span<const float> x, int64_t rows, int64_t cols, const QuantOptions& o) {
  if (rows <= 0 || cols <= 0)
    throw UsageError("tensor shape [" + std::to_string(rows) + ", " + std::to_string(cols) + "] is empty");
  if (static_cast<int64_t>(x.size()) != rows * cols)
    throw UsageError("tensor has " + std::to_string(x.size()) + " values but shape [" + std::to_string(rows) +
                     ", " + std::to_string(cols) + "] needs " + std::to_string(rows * cols));
  const std::string fmt(to_string(o.format));
  if (o.format != Format::nvfp4 && (o.rht || o.four_over_six || o.tile_16x16))
    throw UsageError("--rht, --four-over-six and 16x16 blocks apply to nvfp4 only, not " + fmt);
  if (o.rounding == Rounding::stochastic && !is_4bit(o.format))
    throw UsageError("stochastic rounding applies to the 4-bit formats (nvfp4, mxfp4), not " + fmt);
  check_four_over_six_e4m3_max(o.four_over_six_e4m3_max, "four_over_six_e4m3_max");
  if (o.four_over_six_error != FourOverSixError::mae && o.four_over_six_error != FourOverSixError::mse)
    throw UsageError("four_over_six_error " + std::to_string(static_cast<int>(o.four_over_six_error)) +
                     " is not an error measure: use mae or mse");
  check_row_scaled(o);
  int64_t block = o.format == Format::nvfp4 ? 16 : (o.format == Format::mxfp4 || o.format == Format::mxfp8) ? 32 : 1;
  if (cols % block != 0)
    throw UsageError("the last dimension (" + std::to_string(cols) + ") is not a multiple of the " + fmt +
                     " block size " + std::to_string(block) + ": pad or crop the tensor to a multiple of " +
                     std::to_string(block) + " (nibble does not pad silently)");
  if (is_4bit(o.format) && cols % 2 != 0) throw UsageError("4-bit formats need an even number of columns");
  for (size_t i = 0; i < x.size(); ++i)
    if (!std::isfinite(x[i]))
      throw NumericalError("non-finite value " + std::to_string(x[i]) + " at index [" + std::to_string(i / cols) + ", " +
                           std::to_string(i % cols) + "] (flat " + std::to_string(i) +
                           "): quantization needs finite input; fix the producer of the tensor");
}

QuantizedTensor quantize(std::span<const float> x, int64_t rows, int64_t cols, const QuantOptions& o) {
  validate(x, rows, cols, o);
  QuantizedTensor q = make_header(rows, cols, o);
  switch (o.format) {
    case Format::nvfp4:
      if (o.rht) {
        std::vector<float> t(x.size());
        rht_rows(x, rows, cols, t, /*round_bf16=*/true);
        quantize_nvfp4(t, q, o);
      } else {
        quantize_nvfp4(x, q, o);
      }
      break;
    case Format::mxfp4:
    case Format::mxfp8: quantize_mx(x, q, o); break;
    case Format::fp8_e4m3:
    case Format::fp8_e5m2: quantize_fp8_tensor(x, q, o); break;
  }
  return q;
}

QuantizedTensor quantize(std::span<const bf16> x, int64_t rows, int64_t cols, const QuantOptions& o) {
  std::vector<float> f(x.size());
  for (size_t i = 0; i < x.size(); ++i) f[i] = bf16_to_float(x[i]);
  return quantize(f, rows, cols, o);
}

QuantizedTensor transpose_tiles(const QuantizedTensor& q) {
  if (q.format != Format::nvfp4 || q.block != BlockShape::tile_16x16)
    throw UsageError("an exact transpose exists only for nvfp4 16x16 tiles; quantize the transposed tensor instead");
  if (q.rows % 16 != 0)
    throw UsageError("16x16 tiles need a multiple of 16 rows to transpose (got " + std::to_string(q.rows) + ")");
  QuantizedTensor t = q;
  t.rows = q.cols;
  t.cols = q.rows;
  t.codes.assign(q.codes.size(), 0);
  t.scales.assign(static_cast<size_t>(t.rows * (t.cols / 16)), 0);
  for (int64_t r = 0; r < q.rows; ++r)
    for (int64_t c = 0; c < q.cols; ++c) put_code(t, c * t.cols + r, get_code(q, r * q.cols + c));
  for (int64_t r = 0; r < t.rows; ++r)
    for (int64_t b = 0; b < t.cols / 16; ++b) t.scales[r * (t.cols / 16) + b] = q.scales[(b * 16) * (q.cols / 16) + r / 16];
  return t;
}

QuantizedTensor quantize_transposed(std::span<const float> x, int64_t rows, int64_t cols, const QuantOptions& o) {
  if (o.format == Format::nvfp4 && o.tile_16x16 && !o.rht) {
    validate(x, rows, cols, o);
    if (rows % 16 != 0)
      throw UsageError("16x16 tiles need a multiple of 16 rows for the transposed copy (got " + std::to_string(rows) + ")");
    return transpose_tiles(quantize(x, rows, cols, o));
  }
  if (static_cast<int64_t>(x.size()) != rows * cols) validate(x, rows, cols, o);  // reports the size mismatch
  std::vector<float> t(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = x[r * cols + c];
  return quantize(t, cols, rows, o);
}

void dequantize_codes(const QuantizedTensor& q, std::span<float> out) {
  NIBBLE_CHECK(static_cast<int64_t>(out.size()) == q.rows * q.cols,
               "dequantize_codes: the output holds %zu values, the tensor %lld x %lld", out.size(),
               static_cast<long long>(q.rows), static_cast<long long>(q.cols));
  const int64_t n = q.rows * q.cols, bl = q.block_len();
  for (int64_t i = 0; i < n; ++i) {
    uint8_t c = get_code(q, i);
    switch (q.format) {
      case Format::nvfp4:
        out[i] = e2m1_decode(c) * (e4m3_decode(q.scales[i / bl]) * q.decode_scale_of_row(i / q.cols));
        break;
      case Format::mxfp4: out[i] = e2m1_decode(c) * e8m0_decode(q.scales[i / bl]); break;
      case Format::mxfp8: out[i] = e4m3_decode(c) * e8m0_decode(q.scales[i / bl]); break;
      case Format::fp8_e4m3: out[i] = e4m3_decode(c) * q.decode_scale; break;
      case Format::fp8_e5m2: out[i] = e5m2_decode(c) * q.decode_scale; break;
    }
  }
}

void dequantize(const QuantizedTensor& q, std::span<float> out) {
  dequantize_codes(q, out);
  if (q.rht) rht_rows_inverse(out, q.rows, q.cols);
}

}  // namespace ref
}  // namespace nibble
