// The NVFP4 quantize kernel, shared by quantize.cu (portable, sm_90) and quantize_sm100.cu
// (sm_100a/103a, which instantiates it with the hardware E2M1 conversions). Internal header.
//
// One thread block covers a 16-row strip of kTilesPerBlock 16x16 tiles; thread (i, t) owns row i
// of tile t (16 contiguous values = one 1x16 block). The row-wise copy is quantized straight from
// registers; a 16x16 tile's amax is a shuffle reduction over the 16 lanes of the tile. The
// column-wise copy goes through shared memory: either the exact transpose of the tile's codes
// (16x16 blocks) or an independent 1x16 quantization of each column (x^T, with its own RHT/SR).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "common/hash.h"
#include "kernels/cuda/device_math.h"
#include "kernels/cuda/launch.h"

namespace nibble::cuda::detail {

inline constexpr int kTilesPerBlock = 8;

enum class ColumnMode : uint8_t { none, tile_transpose, independent };

// Which element encoders a kernel instantiation uses.
enum class EncoderSet : int {
  reference = 0,         // the reference's comparisons (RN) and Philox SR: any architecture
  hardware_rn = 1,       // sm_100a: cvt.rn.satfinite.e2m1x2 for RN (bit-identical); reference SR
  hardware_rn_and_sr = 2 // sm_100a: also cvt.rs for SR (same statistics, different bits)
};

struct Nvfp4Side {
  uint8_t* codes = nullptr;
  uint8_t* scales = nullptr;
  const float* amax = nullptr;  // device scalar written by the amax pass
  float* decode_out = nullptr;  // device scalar: S_dec, written once
  // Row-scaled NVFP4 (the row side only): [rows] device vectors, each row's amax (written by the
  // row amax pass) and its S_dec (written here). Null: one global scale per tensor (amax above).
  const float* row_amax = nullptr;
  float* row_decode_out = nullptr;
  // Optional: this side's codes x block scales as BF16 bits, the global scale left out (layout of the
  // codes: [rows, cols] row side, [cols, rows] column side), i.e. what dequantize_block_scaled_bf16
  // would write from them: the operand of the emulated GEMM, written here so no dequantize pass runs.
  uint16_t* bf16_out = nullptr;
  bool rht = false;
  bool stochastic = false;
  dm::FourOverSix four_over_six = dm::FourOverSix::off;  // with its error measure when on
  float numerator = 2688.0f;  // of S_enc: dm::nvfp4_global_numerator(four_over_six, e4m3_max)
  uint64_t seed = 0;  // the SR seed, or its salt when step_hash is set
  uint64_t offset = 0;
  const uint64_t* step_hash = nullptr;  // device: KernelOptions::sr_step_hash
};

// The side's SR seed (KernelOptions::sr_step_hash).
__device__ __forceinline__ uint64_t side_sr_seed(const Nvfp4Side& side) {
  return side.step_hash ? sr_seed_of(*side.step_hash, side.seed) : side.seed;
}

struct Nvfp4TileParams {
  const void* x = nullptr;
  int64_t rows = 0, cols = 0;
  bool row_enabled = true;
  bool row_tile16 = false;
  Nvfp4Side row;
  ColumnMode col_mode = ColumnMode::none;
  Nvfp4Side col;
};

// ------------------------------------------------------------------ Blackwell encoders ------------
// Compiled into PTX only where instantiated, i.e. in quantize_sm100.cu (arch 100a/103a).
struct HardwareRn {
  __host__ __device__ void operator()(const float* scaled, uint8_t* codes) const {
#if defined(__CUDA_ARCH__) && !defined(NIBBLE_CUDA_MODEL)  // the CUDA model has no PTX
    for (int i = 0; i < 8; ++i) {
      uint16_t pair;
      // cvt.rn.satfinite.e2m1x2.f32 d, a, b puts a in the high nibble: element 2i+1 goes first.
      asm("{ .reg .b8 packed;\n"
          "  cvt.rn.satfinite.e2m1x2.f32 packed, %1, %2;\n"
          "  mov.b16 %0, {packed, 0}; }\n"
          : "=h"(pair)
          : "f"(scaled[2 * i + 1]), "f"(scaled[2 * i]));
      codes[2 * i] = static_cast<uint8_t>(pair & 0xF);
      codes[2 * i + 1] = static_cast<uint8_t>((pair >> 4) & 0xF);
    }
#else
    dm::ReferenceRn{}(scaled, codes);  // never used on the host; keeps the functor host-callable
#endif
  }
};

// cvt.rs gets the block's own 16 random bytes of the stream (8 bits per element, 4 elements per
// 32-bit operand, element 4j+k's byte in bits 8k..8k+7), but applies them its own way: the same
// statistics as the reference's SR, not its bits.
struct HardwareSr {
  uint64_t seed;
  uint64_t first_index;
  __host__ __device__ void operator()(const float* scaled, uint8_t* codes) const {
#if defined(__CUDA_ARCH__) && !defined(NIBBLE_CUDA_MODEL)  // the CUDA model has no PTX
    uint8_t r[16];
    dm::sr_bytes16(seed, first_index, r);
    for (int j = 0; j < 4; ++j) {
      const uint32_t random_bits = static_cast<uint32_t>(r[4 * j]) | (static_cast<uint32_t>(r[4 * j + 1]) << 8) |
                                   (static_cast<uint32_t>(r[4 * j + 2]) << 16) | (static_cast<uint32_t>(r[4 * j + 3]) << 24);
      uint16_t quad;
      // Operands {a, b, e, f} land in bits [15:12], [11:8], [7:4], [3:0]: element 4j is f.
      asm("cvt.rs.satfinite.e2m1x4.f32 %0, {%1, %2, %3, %4}, %5;\n"
          : "=h"(quad)
          : "f"(scaled[4 * j + 3]), "f"(scaled[4 * j + 2]), "f"(scaled[4 * j + 1]), "f"(scaled[4 * j]),
            "r"(random_bits));
      for (int k = 0; k < 4; ++k) codes[4 * j + k] = static_cast<uint8_t>((quad >> (4 * k)) & 0xF);
    }
#else
    dm::ReferenceSr{seed, first_index}(scaled, codes);
#endif
  }
};

// Calls f(encoder) with the element encoder of this set and side (RN or SR).
template <EncoderSet kSet, class F>
__device__ __forceinline__ auto with_encoder(const Nvfp4Side& side, uint64_t first_index, F&& f) {
  if (side.stochastic) {
    if constexpr (kSet == EncoderSet::hardware_rn_and_sr)
      return f(HardwareSr{side_sr_seed(side), first_index});
    else
      return f(dm::ReferenceSr{side_sr_seed(side), first_index});
  }
  if constexpr (kSet == EncoderSet::reference)
    return f(dm::ReferenceRn{});
  else
    return f(HardwareRn{});
}

// One 1x16 block (Four Over Six chooses per block).
template <EncoderSet kSet>
__device__ __forceinline__ uint8_t quantize_block(const float* x, float block_amax, dm::GlobalScale g,
                                                  const Nvfp4Side& side, uint64_t first_index, uint8_t* codes) {
  return with_encoder<kSet>(side, first_index, [&](const auto& encode) {
    return dm::nvfp4_quantize_block16(x, block_amax, g, side.four_over_six, encode, codes);
  });
}

// Both Four Over Six candidates of one row of a 16x16 tile (the tile chooses once, see the kernel).
template <EncoderSet kSet>
__device__ __forceinline__ void four_over_six_row(const float* x, float block_amax, dm::GlobalScale g,
                                                  const Nvfp4Side& side, uint64_t first_index, dm::FourOverSixRow& out) {
  with_encoder<kSet>(side, first_index, [&](const auto& encode) {
    dm::four_over_six_row(x, block_amax, g, side.four_over_six, encode, out);
    return 0;
  });
}

// ------------------------------------------------------------------ loads and stores --------------
__device__ __forceinline__ void load16(const float* src, float* v) {
  const float4* s = reinterpret_cast<const float4*>(src);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float4 f = s[q];
    v[4 * q] = f.x;
    v[4 * q + 1] = f.y;
    v[4 * q + 2] = f.z;
    v[4 * q + 3] = f.w;
  }
}
__device__ __forceinline__ void load16(const __nv_bfloat16* src, float* v) {
  const uint4* s = reinterpret_cast<const uint4*>(src);
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const uint4 w = s[q];
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[8 * q + 2 * k] = dm::bits_float(words[k] << 16);
      v[8 * q + 2 * k + 1] = dm::bits_float(words[k] & 0xFFFF0000u);
    }
  }
}
__device__ __forceinline__ float load1(const float* p) { return *p; }
__device__ __forceinline__ float load1(const __nv_bfloat16* p) {
  return dm::bits_float(static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(p)) << 16);
}
// 16 codes -> 8 packed bytes (element 2i low nibble), one 8-byte store.
__device__ __forceinline__ void store_codes16(uint8_t* dst, const uint8_t* codes) {
  uint32_t lo = 0, hi = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) lo |= static_cast<uint32_t>(codes[k] & 0xF) << (4 * k);
#pragma unroll
  for (int k = 0; k < 8; ++k) hi |= static_cast<uint32_t>(codes[8 + k] & 0xF) << (4 * k);
  *reinterpret_cast<uint2*>(dst) = make_uint2(lo, hi);
}

// 16 codes of one block with their E4M3 block scale -> 16 BF16 values (exact: e2m1 x e4m3 has at
// most 6 significant bits), two 16-byte stores. Element 2w is the low half of word w.
__device__ __forceinline__ void store_bf16_operand16(uint16_t* dst, const uint8_t* codes, uint8_t scale_code) {
  const float scale = dm::e4m3_decode(scale_code);
  uint32_t words[8];
#pragma unroll
  for (int w = 0; w < 8; ++w) {
    const uint32_t lo = dm::bf16_bits_rn(dm::nb_mul(dm::e2m1_value(codes[2 * w]), scale));
    const uint32_t hi = dm::bf16_bits_rn(dm::nb_mul(dm::e2m1_value(codes[2 * w + 1]), scale));
    words[w] = lo | (hi << 16);
  }
  uint4* d = reinterpret_cast<uint4*>(dst);
  d[0] = make_uint4(words[0], words[1], words[2], words[3]);
  d[1] = make_uint4(words[4], words[5], words[6], words[7]);
}

// ------------------------------------------------------------------ the kernel --------------------
template <typename InT, EncoderSet kSet>
__global__ void __launch_bounds__(16 * kTilesPerBlock) nvfp4_tile_kernel(Nvfp4TileParams p) {
  __shared__ float tile_values[kTilesPerBlock][16][17];    // +1: no bank conflicts on column reads
  __shared__ uint8_t tile_codes[kTilesPerBlock][16][17];
  const int i = threadIdx.x, t = threadIdx.y;
  const InT* x = static_cast<const InT*>(p.x);
  const int64_t rows = p.rows, cols = p.cols;
  const int64_t col_blocks = cols / 16;
  const int64_t row_tiles = (rows + 15) / 16;
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kTilesPerBlock + t;
  const bool b_valid = b < col_blocks;
  const dm::GlobalScale row_g = p.row_enabled ? dm::nvfp4_global_scale(*p.row.amax, p.row.numerator)
                                              : dm::GlobalScale{1.0f, 1.0f, 0.0f, 2688.0f};
  const dm::GlobalScale col_g = p.col_mode == ColumnMode::independent
                                    ? dm::nvfp4_global_scale(*p.col.amax, p.col.numerator)
                                    : dm::GlobalScale{1.0f, 1.0f, 0.0f, 2688.0f};
  // 16x16 tiles with Four Over Six: one choice per tile from the sum of its 16 rows' errors.
  const bool tile_four_over_six = p.row_tile16 && p.row.four_over_six != dm::FourOverSix::off;

  for (int64_t tr = blockIdx.y; tr < row_tiles; tr += gridDim.y) {
    const int64_t r0 = tr * 16, r = r0 + i;
    const bool valid = b_valid && r < rows;
    float v[16];
    if (valid) {
      load16(x + r * cols + b * 16, v);
    } else {
#pragma unroll
      for (int k = 0; k < 16; ++k) v[k] = 0.0f;
    }
    if (p.col_mode == ColumnMode::independent) {
#pragma unroll
      for (int k = 0; k < 16; ++k) tile_values[t][i][k] = v[k];
    }
    uint8_t row_scale = 0;
    if (p.row_enabled) {
      float w[16];
#pragma unroll
      for (int k = 0; k < 16; ++k) w[k] = v[k];
      if (p.row.rht) dm::rht16_forward_bf16(w);
      float block_amax = dm::block_amax16(w);
      if (p.row_tile16) {
        // Lanes 0-15 and 16-31 of a warp are two different tiles: xor offsets < 16 stay inside one.
#pragma unroll
        for (int offset = 8; offset > 0; offset >>= 1)
          block_amax = dm::max_f(block_amax, __shfl_xor_sync(0xFFFFFFFFu, block_amax, offset));
      }
      uint8_t codes[16];
      const uint64_t first = p.row.offset + static_cast<uint64_t>(r * cols + b * 16);
      // Row-scaled: this row's own global scale (section 3's chain on the row alone); the thread of
      // the row's first block records its S_dec. (Row scaling has 1x16 blocks and no Four Over Six.)
      dm::GlobalScale g = row_g;
      if (p.row.row_amax != nullptr && valid) {
        g = dm::nvfp4_global_scale(p.row.row_amax[r], p.row.numerator);
        if (b == 0) p.row.row_decode_out[r] = g.decode;
      }
      if (tile_four_over_six) {
        // Every lane of the warp takes part in the shuffles (invalid rows hold zeros and count 0).
        // The xor butterfly sums the row errors in _sum_4over6_2d_error's tree order (see
        // dm::four_over_six_tile_error), so all 16 lanes of a tile reach the same choice.
        dm::FourOverSixRow c;
        four_over_six_row<kSet>(w, block_amax, row_g, p.row, first, c);
        float error4 = valid ? c.error4 : 0.0f, error6 = valid ? c.error6 : 0.0f;
#pragma unroll
        for (int offset = 8; offset > 0; offset >>= 1) {
          error4 = dm::nb_add(error4, __shfl_xor_sync(0xFFFFFFFFu, error4, offset));
          error6 = dm::nb_add(error6, __shfl_xor_sync(0xFFFFFFFFu, error6, offset));
        }
        const bool map4 = dm::four_over_six_picks_map4(error4, error6);
#pragma unroll
        for (int k = 0; k < 16; ++k) codes[k] = map4 ? c.codes4[k] : c.codes6[k];
        row_scale = map4 ? c.scales.map4 : c.scales.map6;
      } else if (valid) {
        row_scale = quantize_block<kSet>(w, block_amax, g, p.row, first, codes);
      }
      if (valid) {
        store_codes16(p.row.codes + r * (cols / 2) + b * 8, codes);
        p.row.scales[r * col_blocks + b] = row_scale;
        if (p.row.bf16_out != nullptr) store_bf16_operand16(p.row.bf16_out + r * cols + b * 16, codes, row_scale);
        if (p.col_mode == ColumnMode::tile_transpose) {
#pragma unroll
          for (int k = 0; k < 16; ++k) tile_codes[t][i][k] = codes[k];
        }
      }
    }
    if (p.col_mode == ColumnMode::none) continue;
    __syncthreads();
    // Column-wise copy: thread i now owns column c = 16 b + i of the tile, i.e. row c of x^T,
    // whose 16 values are x[r0 .. r0+15][c] (rows % 16 == 0 is required for this copy).
    if (b_valid) {
      const int64_t c = b * 16 + i;
      uint8_t codes[16];
      uint8_t scale;
      if (p.col_mode == ColumnMode::tile_transpose) {
#pragma unroll
        for (int k = 0; k < 16; ++k) codes[k] = tile_codes[t][k][i];
        scale = row_scale;  // one scale per 16x16 tile, the same in both orientations
      } else {
        float w[16];
#pragma unroll
        for (int k = 0; k < 16; ++k) w[k] = tile_values[t][k][i];
        if (p.col.rht) dm::rht16_forward_bf16(w);
        scale = quantize_block<kSet>(w, dm::block_amax16(w), col_g, p.col,
                                     p.col.offset + static_cast<uint64_t>(c * rows + r0), codes);
      }
      store_codes16(p.col.codes + c * (rows / 2) + r0 / 2, codes);
      p.col.scales[c * (rows / 16) + tr] = scale;
      if (p.col.bf16_out != nullptr) store_bf16_operand16(p.col.bf16_out + c * rows + r0, codes, scale);
    }
    __syncthreads();  // shared tiles are overwritten by the next strip
  }
  if (blockIdx.x == 0 && blockIdx.y == 0 && i == 0 && t == 0) {
    if (p.row_enabled && p.row.decode_out) *p.row.decode_out = row_g.decode;
    if (p.col_mode == ColumnMode::independent && p.col.decode_out) *p.col.decode_out = col_g.decode;
  }
}

// Launches the kernel for this encoder set on `stream`; defined in quantize.cu (reference) and
// quantize_sm100.cu (Blackwell sets), so the portable file never contains Blackwell PTX.
void launch_nvfp4_tile_kernel_reference(const Nvfp4TileParams& p, bool input_is_bf16, cudaStream_t stream);
void launch_nvfp4_tile_kernel_sm100(const Nvfp4TileParams& p, bool input_is_bf16, bool hardware_sr,
                                    cudaStream_t stream);

template <typename InT, EncoderSet kSet>
void launch_nvfp4_tile_kernel(const Nvfp4TileParams& p, cudaStream_t stream) {
  const int64_t col_blocks = p.cols / 16;
  const int64_t row_tiles = (p.rows + 15) / 16;
  const dim3 block(16, kTilesPerBlock);
  const dim3 grid(static_cast<unsigned>((col_blocks + kTilesPerBlock - 1) / kTilesPerBlock),
                  static_cast<unsigned>(row_tiles < NIBBLE_CUDA_MAX_GRID_Y ? row_tiles : NIBBLE_CUDA_MAX_GRID_Y));
  NIBBLE_LAUNCH(grid, block, 0, stream, nvfp4_tile_kernel<InT, kSet>)(p);
}

}  // namespace nibble::cuda::detail
