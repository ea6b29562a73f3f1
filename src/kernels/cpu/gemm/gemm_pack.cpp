// Packing of quantized operands into the panel layouts of gemm_kernels.h. Decoding goes through
// 256-entry tables indexed by a whole packed byte (two E2M1 codes), so a panel costs about one
// lookup per two elements; this is O((M+N)K) work against the GEMM's O(MNK).
#include <algorithm>
#include <array>
#include <cstring>

#include "format/codecs.h"
#include "kernels/cpu/gemm/gemm_kernels.h"

namespace nibble::cpu::gemm_detail {
namespace {

struct DecodeTables {
  std::array<uint16_t, 256> signed_pair;    // byte -> two doubled E2M1 as int8 (low element first)
  std::array<uint16_t, 256> unsigned_pair;  // byte -> two (doubled E2M1 + 12) as uint8
  std::array<int8_t, 256> pair_sum;         // byte -> sum of its two doubled E2M1 values
  std::array<float, 256> e4m3;
  std::array<float, 256> e5m2;
  std::array<float, 256> e8m0;
};

const DecodeTables& tables() {
  static const DecodeTables t = [] {
    DecodeTables d{};
    for (int v = 0; v < 256; ++v) {
      int lo = kE2M1TimesTwo[v & 15], hi = kE2M1TimesTwo[v >> 4];
      d.signed_pair[v] = static_cast<uint16_t>(static_cast<uint8_t>(lo) | (static_cast<uint8_t>(hi) << 8));
      d.unsigned_pair[v] = static_cast<uint16_t>((lo + 12) | ((hi + 12) << 8));
      d.pair_sum[v] = static_cast<int8_t>(lo + hi);
      d.e4m3[v] = e4m3_decode(static_cast<uint8_t>(v));
      d.e5m2[v] = e5m2_decode(static_cast<uint8_t>(v));
      d.e8m0[v] = e8m0_decode(static_cast<uint8_t>(v));
    }
    return d;
  }();
  return t;
}

// Decoded block scale of (row, block): E4M3 for NVFP4, E8M0 for the MX formats, 1 per tensor
// (FP8's per-tensor scale is applied once at the end with the other global factors).
const float* scale_table(const QuantizedTensor& q) {
  const DecodeTables& t = tables();
  return q.format == Format::nvfp4 ? t.e4m3.data() : t.e8m0.data();
}

// A signed int8 panel (gemm_kernels.h) of `rows` rows from row0.
void pack_int8_signed_panel(const QuantizedTensor& q, int64_t row0, int64_t rows, uint8_t* dst) {
  const DecodeTables& t = tables();
  const float* scale_of = scale_table(q);
  const int64_t block_len = q.block_len(), blocks = q.cols / block_len, groups = block_len / 4;
  const int64_t stride = int8_signed_block_bytes(block_len, rows);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = row0 + r;
    const bool inside = row < q.rows;
    const uint8_t* src = inside ? q.codes.data() + row * (q.cols / 2) : nullptr;
    const uint8_t* scales = inside ? q.scales.data() + row * blocks : nullptr;
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* blk = dst + b * stride;
      int32_t init = 0;
      float scale = 0.0f;
      if (inside) {
        int32_t sum = 0;
        for (int64_t g = 0; g < groups; ++g) {
          uint8_t b0 = src[2 * g], b1 = src[2 * g + 1];
          uint32_t word = t.signed_pair[b0] | (static_cast<uint32_t>(t.signed_pair[b1]) << 16);
          std::memcpy(blk + (g * rows + r) * 4, &word, 4);
          sum += t.pair_sum[b0] + t.pair_sum[b1];
        }
        src += block_len / 2;
        init = -12 * sum;
        scale = scale_of[scales[b]];
      } else {
        for (int64_t g = 0; g < groups; ++g) std::memset(blk + (g * rows + r) * 4, 0, 4);
      }
      std::memcpy(blk + block_len * rows + 4 * r, &init, 4);
      std::memcpy(blk + block_len * rows + 4 * rows + 4 * r, &scale, 4);
    }
  }
}

// A biased int8 panel (gemm_kernels.h) of `rows` rows from row0.
void pack_int8_biased_panel(const QuantizedTensor& q, int64_t row0, int64_t rows, uint8_t* dst) {
  const DecodeTables& t = tables();
  const float* scale_of = scale_table(q);
  const int64_t block_len = q.block_len(), blocks = q.cols / block_len, groups = block_len / 4;
  const int64_t stride = int8_biased_block_bytes(block_len, rows);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = row0 + r;
    const bool inside = row < q.rows;
    const uint8_t* src = inside ? q.codes.data() + row * (q.cols / 2) : nullptr;
    const uint8_t* scales = inside ? q.scales.data() + row * blocks : nullptr;
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* blk = dst + b * stride;
      float scale = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        uint32_t word = 0;
        if (inside) word = t.unsigned_pair[src[2 * g]] | (static_cast<uint32_t>(t.unsigned_pair[src[2 * g + 1]]) << 16);
        std::memcpy(blk + (g * rows + r) * 4, &word, 4);
      }
      if (inside) {
        src += block_len / 2;
        scale = scale_of[scales[b]];
      }
      std::memcpy(blk + block_len * rows + 4 * r, &scale, 4);
    }
  }
}

}  // namespace

void pack_int8_a_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst) { pack_int8_signed_panel(q, row0, kMr, dst); }
void pack_int8_b_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst) { pack_int8_biased_panel(q, row0, kNr, dst); }
void pack_int8_biased_a_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst) {
  pack_int8_biased_panel(q, row0, kMr, dst);
}
void pack_int8_signed_b_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst) {
  pack_int8_signed_panel(q, row0, kNr, dst);
}

namespace {
E2m1PanelSource e2m1_source(const QuantizedTensor& q) {
  return {q.codes.data(), q.scales.data(), q.rows, q.cols, q.block_len(), scale_table(q)};
}
}  // namespace

void pack_int8_a_panel_simd(const QuantizedTensor& q, int64_t row0, uint8_t* dst) {
  pack_int8_a_panel_avx2(e2m1_source(q), row0, dst);
}
void pack_int8_a_panel_avx512(const QuantizedTensor& q, int64_t row0, uint8_t* dst) {
  pack_int8_a_panel_avx512(e2m1_source(q), row0, dst);
}
void pack_int8_b_panel_avx512(const QuantizedTensor& q, int64_t row0, uint8_t* dst) {
  pack_int8_b_panel_avx512(e2m1_source(q), row0, dst);
}
void pack_int8_b_panel_simd(const QuantizedTensor& q, int64_t row0, uint8_t* dst) {
  pack_int8_b_panel_avx2(e2m1_source(q), row0, dst);
}
void pack_int8_biased_a_panel_simd(const QuantizedTensor& q, int64_t row0, uint8_t* dst) {
  pack_int8_biased_a_panel_avx2(e2m1_source(q), row0, dst);
}
void pack_int8_signed_b_panel_simd(const QuantizedTensor& q, int64_t row0, uint8_t* dst) {
  pack_int8_signed_b_panel_avx2(e2m1_source(q), row0, dst);
}
void pack_amx_a_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst) { pack_amx_a_panel(e2m1_source(q), row0, dst); }
void pack_amx_b_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst) { pack_amx_b_panel(e2m1_source(q), row0, dst); }
void pack_bf16_a_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst) { pack_bf16_a_panel(e2m1_source(q), row0, dst); }
void pack_bf16_b_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst) { pack_bf16_b_panel(e2m1_source(q), row0, dst); }

namespace {
Fp8PanelSource fp8_source(const QuantizedTensor& q) {
  const DecodeTables& t = tables();
  return {q.codes.data(), q.rows, q.cols, q.format == Format::fp8_e5m2 ? t.e5m2.data() : t.e4m3.data()};
}
}  // namespace
void pack_bf16_fp8_a_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst) { pack_bf16_a_panel(fp8_source(q), row0, dst); }
void pack_bf16_fp8_b_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst) { pack_bf16_b_panel(fp8_source(q), row0, dst); }

namespace {
// Element r of every k of an f32 panel with `width` rows: decoded FP8 times its block scale.
// E8M0 scales are powers of two, so the product is exact while it stays in FP32's range.
void pack_f32_panel(const QuantizedTensor& q, int64_t row0, int width, uint8_t* dst) {
  const DecodeTables& t = tables();
  const float* element = q.format == Format::fp8_e5m2 ? t.e5m2.data() : t.e4m3.data();
  const bool blocked = q.block != BlockShape::per_tensor;
  const int64_t block_len = q.block_len();
  float* out = reinterpret_cast<float*>(dst);
  for (int r = 0; r < width; ++r) {
    const int64_t row = row0 + r;
    if (row >= q.rows) {
      for (int64_t k = 0; k < q.cols; ++k) out[k * width + r] = 0.0f;
      continue;
    }
    const uint8_t* src = q.codes.data() + row * q.cols;
    const uint8_t* scales = blocked ? q.scales.data() + row * (q.cols / block_len) : nullptr;
    for (int64_t k = 0; k < q.cols; ++k) {
      float scale = blocked ? t.e8m0[scales[k / block_len]] : 1.0f;
      out[k * width + r] = element[src[k]] * scale;
    }
  }
}
}  // namespace

void pack_f32_a_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst) { pack_f32_panel(q, row0, kMr, dst); }
void pack_f32_b_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst) { pack_f32_panel(q, row0, kNr, dst); }

namespace {
// Element r of every k of an f32 panel with `width` rows: x(row0 + r, k), 0 past the edge. Both
// loops read the source in its storage order (along k, or across the panel's rows).
template <int Width>
void pack_f32_operand_panel(const F32Operand& x, int64_t row0, uint8_t* dst) {
  float* out = reinterpret_cast<float*>(dst);
  const int rows = static_cast<int>(std::min<int64_t>(Width, x.rows - row0));
  if (x.k_contiguous) {
    for (int r = 0; r < Width; ++r) {
      if (r >= rows) {
        for (int64_t k = 0; k < x.k; ++k) out[k * Width + r] = 0.0f;
        continue;
      }
      const float* src = x.p + (row0 + r) * x.ld;
      for (int64_t k = 0; k < x.k; ++k) out[k * Width + r] = src[k];
    }
    return;
  }
  for (int64_t k = 0; k < x.k; ++k) {
    const float* src = x.p + k * x.ld + row0;
    float* dst_k = out + k * Width;
    for (int r = 0; r < rows; ++r) dst_k[r] = src[r];
    for (int r = rows; r < Width; ++r) dst_k[r] = 0.0f;
  }
}
}  // namespace

void pack_f32_a_panel(const F32Operand& x, int64_t row0, uint8_t* dst) { pack_f32_operand_panel<kMr>(x, row0, dst); }
void pack_f32_b_panel(const F32Operand& x, int64_t row0, uint8_t* dst) { pack_f32_operand_panel<kNr>(x, row0, dst); }

namespace {
uint32_t bf16_pair(float lo, float hi) {
  return static_cast<uint32_t>(bf16_from_float_rn(lo).bits) | static_cast<uint32_t>(bf16_from_float_rn(hi).bits) << 16;
}

// Lane r of every k pair of a BF16-pair panel with `Width` rows; value(r, k) is the element for
// r < rows and k < K (K odd: the last pair's high half is 0).
template <int Width, class Value>
void pack_pairs(int rows, int64_t k_total, uint8_t* dst, Value value) {
  uint32_t* out = reinterpret_cast<uint32_t*>(dst);
  const int64_t pairs = (k_total + 1) / 2;
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t k = 2 * p;
    uint32_t* dst_p = out + p * Width;
    for (int r = 0; r < rows; ++r) dst_p[r] = bf16_pair(value(r, k), k + 1 < k_total ? value(r, k + 1) : 0.0f);
    for (int r = rows; r < Width; ++r) dst_p[r] = 0;
  }
}

template <int Width>
void pack_bf16_pair_panel(const F32Operand& x, int64_t row0, uint8_t* dst) {
  const int rows = static_cast<int>(std::min<int64_t>(Width, x.rows - row0));
  const float* base = x.k_contiguous ? x.p + row0 * x.ld : x.p + row0;
  if (x.k_contiguous)
    pack_pairs<Width>(rows, x.k, dst, [&](int r, int64_t k) { return base[r * x.ld + k]; });
  else
    pack_pairs<Width>(rows, x.k, dst, [&](int r, int64_t k) { return base[k * x.ld + r]; });
}

template <int Width>
void pack_bf16_pair_fp8_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst) {
  const DecodeTables& t = tables();
  const float* value_of = q.format == Format::fp8_e5m2 ? t.e5m2.data() : t.e4m3.data();
  const int rows = static_cast<int>(std::min<int64_t>(Width, q.rows - row0));
  const uint8_t* codes = q.codes.data() + row0 * q.cols;
  pack_pairs<Width>(rows, q.cols, dst, [&](int r, int64_t k) { return value_of[codes[r * q.cols + k]]; });
}
}  // namespace

void pack_bf16_pair_a_panel(const F32Operand& x, int64_t row0, uint8_t* dst) { pack_bf16_pair_panel<kMr>(x, row0, dst); }
void pack_bf16_pair_b_panel(const F32Operand& x, int64_t row0, uint8_t* dst) { pack_bf16_pair_panel<kNr>(x, row0, dst); }
void pack_bf16_pair_fp8_a_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst) {
  pack_bf16_pair_fp8_panel<kMr>(q, row0, dst);
}
void pack_bf16_pair_fp8_b_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst) {
  pack_bf16_pair_fp8_panel<kNr>(q, row0, dst);
}

namespace {
// The FP32 value of a BF16 half-word, a subnormal flushed to a zero of its sign (as vdpbf16ps reads it).
inline uint32_t widened_bf16(uint32_t half) {
  const uint32_t bits = half << 16;
  return (bits & 0x7F800000u) == 0 ? bits & 0x80000000u : bits;
}
}  // namespace

// Unit p's two steps end at byte 8 * width * (p + 1), at or before unit p + 1's pairs (which start at
// 4 * width * (pairs + p + 1)); the last unit overlaps its own pairs, which are read before it is written.
void widen_bf16_pairs(int64_t width, int64_t pairs, uint8_t* dst) {
  uint32_t* out = reinterpret_cast<uint32_t*>(dst);
  const uint32_t* in = out + pairs * width;
  uint32_t unit[kNr];
  for (int64_t p = 0; p < pairs; ++p) {
    std::memcpy(unit, in + p * width, static_cast<size_t>(width) * sizeof(uint32_t));
    for (int64_t r = 0; r < width; ++r) {
      out[(2 * p) * width + r] = widened_bf16(unit[r] >> 16);          // k = 2p + 1 first
      out[(2 * p + 1) * width + r] = widened_bf16(unit[r] & 0xFFFFu);  // then k = 2p
    }
  }
}

namespace {
template <int Width, class Source, class Pack, class Widen>
void pack_widened(const Source& x, int64_t row0, uint8_t* dst, int64_t k, Pack pack, Widen widen) {
  const int64_t pairs = (k + 1) / 2;
  pack(x, row0, dst + pairs * Width * 4);
  widen(Width, pairs, dst);
}
}  // namespace

void pack_bf16_pair_widened_a_panel(const F32Operand& x, int64_t row0, uint8_t* dst) {
  pack_widened<kMr>(x, row0, dst, x.k, &pack_bf16_pair_a_panel, &widen_bf16_pairs);
}
void pack_bf16_pair_widened_b_panel(const F32Operand& x, int64_t row0, uint8_t* dst) {
  pack_widened<kNr>(x, row0, dst, x.k, &pack_bf16_pair_b_panel, &widen_bf16_pairs);
}
// The AVX2 packer and widening (gemm_avx2.cpp), called from here: no AVX2 code is compiled in this file.
void pack_bf16_pair_widened_a_panel_avx2(const F32Operand& x, int64_t row0, uint8_t* dst) {
  pack_widened<kMr>(x, row0, dst, x.k, &pack_bf16_pair_a_panel_avx2, &widen_bf16_pairs_avx2);
}
void pack_bf16_pair_widened_b_panel_avx2(const F32Operand& x, int64_t row0, uint8_t* dst) {
  pack_widened<kNr>(x, row0, dst, x.k, &pack_bf16_pair_b_panel_avx2, &widen_bf16_pairs_avx2);
}
// Only AVX512-BF16 CPUs sum FP8 in pairs (fp32_products), so these widen with AVX2.
void pack_bf16_pair_widened_fp8_a_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst) {
  pack_widened<kMr>(q, row0, dst, q.cols, &pack_bf16_pair_fp8_a_panel, &widen_bf16_pairs_avx2);
}
void pack_bf16_pair_widened_fp8_b_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst) {
  pack_widened<kNr>(q, row0, dst, q.cols, &pack_bf16_pair_fp8_b_panel, &widen_bf16_pairs_avx2);
}

}  // namespace nibble::cpu::gemm_detail
