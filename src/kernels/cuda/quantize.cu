// Portable (sm_90) quantization kernels and their host drivers. See quantize.h for the contract and
// device_math.h for why every FP32 operation here is bit-identical to the CPU reference.
#include <cuda_bf16.h>

#include <algorithm>
#include <array>
#include <string>
#include <type_traits>
#include <vector>

#include "format/quantize.h"
#include "kernels/cuda/nvfp4_kernels.cuh"
#include "kernels/cuda/quantize.h"

namespace nibble::cuda {

using detail::ColumnMode;
using detail::EncoderSet;
using detail::Nvfp4Side;
using detail::Nvfp4TileParams;

namespace {

constexpr int kThreads = 256;
constexpr unsigned long long kNoNonFinite = ~0ull;
// Deferred checks: the k-th quantization's first non-finite index i becomes k << 40 | i in the
// context's sticky word (atomicMin: the first quantization, then its first index).
constexpr int kDeferredIndexBits = 40;
constexpr size_t kMaxDeferredChecks = size_t{1} << (64 - kDeferredIndexBits);

int grid_for(int64_t work_items, const Context& ctx, int threads = kThreads) {
  const int64_t wanted = (work_items + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(std::max(ctx.device().sm_count, 1)) * 16;
  return static_cast<int>(std::max<int64_t>(1, std::min(wanted, cap)));
}

// ------------------------------------------------------------------ amax ---------------------------
// max |x| over the values the chain sees: x itself, or the RHT of 16-element blocks along rows, or
// along columns (for the column-wise copy). Also records the smallest flat index of a non-finite x.
enum class AmaxOver : int { values, rht_rows, rht_columns };

__device__ __forceinline__ void note_nonfinite(float v, int64_t index, unsigned long long* first_bad) {
  if (!isfinite(v)) atomicMin(first_bad, static_cast<unsigned long long>(index));
}

// The maximum of m over the block, valid in thread 0. Every thread passes the trailing barrier, so
// the shared scratch may serve the next reduction at once.
__device__ __forceinline__ float block_max(float m) {
  for (int offset = 16; offset > 0; offset >>= 1) m = dm::max_f(m, __shfl_xor_sync(0xFFFFFFFFu, m, offset));
  __shared__ float warp_max[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = lane < static_cast<int>(blockDim.x / 32) ? warp_max[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset >>= 1) m = dm::max_f(m, __shfl_xor_sync(0xFFFFFFFFu, m, offset));
  }
  __syncthreads();  // warp_max may be reused by a second reduction in the same kernel
  return m;
}

__device__ __forceinline__ void block_max_to_global(float m, float* out) {
  m = block_max(m);
  // Non-negative floats order like their bit patterns, so an integer max is a float max.
  if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned int*>(out), __float_as_uint(m));
}

// Where an amax pass folds its finite check when the check is deferred (word null: it is not): the
// context's sticky word, this quantization's number k, and the context's count of the pass's blocks
// that are done (0 between passes: the last block's atomicInc wraps it back, graph replays included).
struct DeferredFold {
  unsigned long long* word = nullptr;
  unsigned long long k = 0;
  unsigned* blocks_done = nullptr;
};

// Every thread of the grid calls this after its last note_nonfinite (f is the same for all). The
// last block to finish folds first_bad, by then complete, into the word: no kernel of its own.
__device__ __forceinline__ void fold_if_last_block(unsigned long long* first_bad, const DeferredFold& f) {
  if (f.word == nullptr) return;
  __threadfence();  // this thread's atomicMin on first_bad is visible before its block counts itself
  __syncthreads();
  if (threadIdx.x != 0 || atomicInc(f.blocks_done, gridDim.x - 1) != gridDim.x - 1) return;
  __threadfence();  // the other blocks' notes, ordered before their counts, are read after ours
  const unsigned long long bad = *static_cast<volatile unsigned long long*>(first_bad);
  if (bad != kNoNonFinite) atomicMin(f.word, (f.k << kDeferredIndexBits) | bad);
}

// plain_out (RHT modes only, may be null): also max |x| of the untransformed values, so that a
// row-wise copy without RHT and a column-wise copy with it share one read of x.
template <typename InT, AmaxOver kOver>
__global__ void __launch_bounds__(kThreads) amax_kernel(const InT* x, int64_t rows, int64_t cols, float* out,
                                                        unsigned long long* first_bad, float* plain_out,
                                                        DeferredFold fold) {
  float m = 0.0f, plain = 0.0f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if constexpr (kOver == AmaxOver::values) {
    // 16 values per step with vector loads (every caller's data is 16-byte aligned), then the tail.
    const int64_t n = rows * cols, units = n / 16;
    for (int64_t u = first; u < units; u += stride) {
      float v[16];
      detail::load16(x + u * 16, v);
      for (int k = 0; k < 16; ++k) note_nonfinite(v[k], u * 16 + k, first_bad);
      m = dm::max_f(m, dm::block_amax16(v));
    }
    for (int64_t idx = units * 16 + first; idx < n; idx += stride) {
      const float v = detail::load1(x + idx);
      note_nonfinite(v, idx, first_bad);
      m = dm::max_f(m, dm::abs_f(v));
    }
  } else if constexpr (kOver == AmaxOver::rht_rows) {
    const int64_t units = rows * cols / 16;
    for (int64_t u = first; u < units; u += stride) {
      float v[16];
      detail::load16(x + u * 16, v);
      for (int k = 0; k < 16; ++k) note_nonfinite(v[k], u * 16 + k, first_bad);
      plain = dm::max_f(plain, dm::block_amax16(v));
      dm::rht16_forward_bf16(v);
      m = dm::max_f(m, dm::block_amax16(v));
    }
  } else {
    const int64_t units = rows / 16 * cols;  // (tile row, column) pairs; consecutive threads: columns
    for (int64_t u = first; u < units; u += stride) {
      const int64_t tr = u / cols, c = u % cols;
      float v[16];
      for (int k = 0; k < 16; ++k) {
        const int64_t idx = (tr * 16 + k) * cols + c;
        v[k] = detail::load1(x + idx);
        note_nonfinite(v[k], idx, first_bad);
      }
      plain = dm::max_f(plain, dm::block_amax16(v));
      dm::rht16_forward_bf16(v);
      m = dm::max_f(m, dm::block_amax16(v));
    }
  }
  block_max_to_global(m, out);
  if (kOver != AmaxOver::values && plain_out != nullptr) block_max_to_global(plain, plain_out);
  fold_if_last_block(first_bad, fold);
}

// Row-scaled NVFP4: max |x| of each row into row_amax[r] (one thread block per row, grid-striding
// over rows), the tensor's maximum into globals[0] and 1 into globals[1] (the per-row S_dec carry the
// global scale), and the first non-finite index as amax_kernel records it (and folds it).
template <typename InT>
__global__ void __launch_bounds__(kThreads) row_amax_kernel(const InT* x, int64_t rows, int64_t cols, float* row_amax,
                                                            float* globals, unsigned long long* first_bad,
                                                            DeferredFold fold) {
  if (blockIdx.x == 0 && threadIdx.x == 0) globals[1] = 1.0f;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float m = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float v = detail::load1(x + r * cols + c);
      note_nonfinite(v, r * cols + c, first_bad);
      m = dm::max_f(m, dm::abs_f(v));
    }
    m = block_max(m);  // its trailing barrier lets the next row reuse the scratch
    if (threadIdx.x == 0) {
      row_amax[r] = m;  // a maximum: the same value in any reduction order
      atomicMax(reinterpret_cast<unsigned int*>(globals), __float_as_uint(m));
    }
  }
  fold_if_last_block(first_bad, fold);
}

// ------------------------------------------------------------------ MX and FP8 ---------------------
template <typename InT>
__global__ void __launch_bounds__(kThreads) mx_kernel(const InT* x, int64_t n, bool fp4, bool stochastic,
                                                      uint64_t seed, const uint64_t* step_hash, uint64_t offset,
                                                      uint8_t* codes, uint8_t* scales, float* globals) {
  if (blockIdx.x == 0 && threadIdx.x == 0) globals[1] = 1.0f;  // MX has no tensor-wide scale
  const float max_rcp = fp4 ? 1.0f / 6.0f : 1.0f / 448.0f;
  const int64_t blocks = n / 32;
  for (int64_t blk = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; blk < blocks;
       blk += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t first = blk * 32;
    float v[32];
    detail::load16(x + first, v);
    detail::load16(x + first + 16, v + 16);
    float b = 0.0f;
    for (int k = 0; k < 32; ++k) b = dm::max_f(b, dm::abs_f(v[k]));
    const uint8_t e = dm::e8m0_encode_ceil(dm::nb_mul(b, max_rcp));
    const float inv = dm::e8m0_decode_reciprocal(e);
    scales[blk] = e;
    if (fp4) {
      uint8_t c[16];
      dm::PhiloxStream stream(step_hash ? sr_seed_of(*step_hash, seed) : seed);
      for (int half = 0; half < 2; ++half) {
        for (int k = 0; k < 16; ++k) {
          const int64_t idx = first + 16 * half + k;
          const float s = dm::nb_mul(v[16 * half + k], inv);
          c[k] = stochastic ? dm::e2m1_encode_sr(s, dm::sr_threshold(stream.byte(offset + static_cast<uint64_t>(idx))))
                            : dm::e2m1_encode_rn(s);
        }
        detail::store_codes16(codes + first / 2 + 8 * half, c);
      }
    } else {
      uint32_t words[8];
      for (int w = 0; w < 8; ++w) {
        uint32_t word = 0;
        for (int k = 0; k < 4; ++k)
          word |= static_cast<uint32_t>(dm::e4m3_encode_rn(dm::nb_mul(v[4 * w + k], inv))) << (8 * k);
        words[w] = word;
      }
      uint4* dst = reinterpret_cast<uint4*>(codes + first);
      dst[0] = make_uint4(words[0], words[1], words[2], words[3]);
      dst[1] = make_uint4(words[4], words[5], words[6], words[7]);
    }
  }
}

template <typename InT>
__global__ void __launch_bounds__(kThreads) fp8_tensor_kernel(const InT* x, int64_t n, bool e4m3, float* globals,
                                                              uint8_t* codes) {
  const float scale = dm::fp8_tensor_scale(globals[0], e4m3);
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float s = dm::nb_mul(detail::load1(x + idx), scale);
    codes[idx] = e4m3 ? dm::e4m3_encode_rn(s) : dm::e5m2_encode_rn(s);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) globals[1] = dm::nb_div(1.0f, scale);
}

// ------------------------------------------------------------------ dequantize ---------------------
struct DequantParams {
  Format format;
  int64_t n, block_len;
  const uint8_t* codes;
  const uint8_t* scales;
  const float* globals;
  bool inverse_rht;
  const float* row_decode = nullptr;  // row-scaled NVFP4: [rows] S_dec, else null (globals[1])
  int64_t cols = 0;
};

__device__ __forceinline__ uint8_t code_at(const DequantParams& p, int64_t i) {
  if (p.format == Format::nvfp4 || p.format == Format::mxfp4) {
    const uint8_t b = p.codes[i / 2];
    return (i & 1) ? (b >> 4) : (b & 0xF);
  }
  return p.codes[i];
}

// The reference's dequantize_codes, element by element, in its order of operations. With
// global == false the tensor-wide factor is left out (the emulated GEMM puts it into alpha).
__device__ __forceinline__ float dequantize_one(const DequantParams& p, int64_t i, bool global) {
  const uint8_t c = code_at(p, i);
  switch (p.format) {
    case Format::nvfp4: {
      const float s = dm::e4m3_decode(p.scales[i / p.block_len]);
      const float decode = p.row_decode != nullptr ? p.row_decode[i / p.cols] : p.globals[1];
      return dm::nb_mul(dm::e2m1_value(c), global ? dm::nb_mul(s, decode) : s);
    }
    case Format::mxfp4: return dm::nb_mul(dm::e2m1_value(c), dm::e8m0_decode(p.scales[i / p.block_len]));
    case Format::mxfp8: return dm::nb_mul(dm::e4m3_decode(c), dm::e8m0_decode(p.scales[i / p.block_len]));
    case Format::fp8_e4m3: return global ? dm::nb_mul(dm::e4m3_decode(c), p.globals[1]) : dm::e4m3_decode(c);
    case Format::fp8_e5m2: return global ? dm::nb_mul(dm::e5m2_decode(c), p.globals[1]) : dm::e5m2_decode(c);
  }
  return 0.0f;
}

__global__ void __launch_bounds__(kThreads) dequantize_f32_kernel(DequantParams p, float* out) {
  const int64_t groups = (p.n + 15) / 16;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v[16];
    const int64_t first = g * 16, count = p.n - first < 16 ? p.n - first : 16;
    for (int k = 0; k < count; ++k) v[k] = dequantize_one(p, first + k, true);
    if (p.inverse_rht) dm::rht16_inverse(v);  // RHT tensors are NVFP4, n % 16 == 0
    for (int k = 0; k < count; ++k) out[first + k] = v[k];
  }
}

// 16 elements per thread. For the 4-bit formats (the emulated GEMM's hot path) the 16 codes are one
// 8-byte load and share one block scale (16 divides the block length); other formats go element by
// element.
__global__ void __launch_bounds__(kThreads) dequantize_bf16_kernel(DequantParams p, uint16_t* out) {
  const bool four_bit = p.format == Format::nvfp4 || p.format == Format::mxfp4;
  const int64_t groups = (p.n + 15) / 16;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t first = g * 16;
    if (first + 16 > p.n) {
      for (int64_t i = first; i < p.n; ++i) out[i] = dm::bf16_bits_rn(dequantize_one(p, i, false));
      continue;
    }
    uint32_t words[8];
    if (four_bit) {
      const uint2 packed = *reinterpret_cast<const uint2*>(p.codes + first / 2);
      const uint8_t s = p.scales[first / p.block_len];
      const float scale = p.format == Format::nvfp4 ? dm::e4m3_decode(s) : dm::e8m0_decode(s);
      for (int w = 0; w < 8; ++w) {
        const uint32_t half = w < 4 ? packed.x : packed.y;
        const uint32_t pair = (half >> (8 * (w % 4))) & 0xFFu;
        const uint16_t lo = dm::bf16_bits_rn(dm::nb_mul(dm::e2m1_value(static_cast<uint8_t>(pair & 0xF)), scale));
        const uint16_t hi = dm::bf16_bits_rn(dm::nb_mul(dm::e2m1_value(static_cast<uint8_t>(pair >> 4)), scale));
        words[w] = lo | (static_cast<uint32_t>(hi) << 16);
      }
    } else {
      for (int w = 0; w < 8; ++w)
        words[w] = dm::bf16_bits_rn(dequantize_one(p, first + 2 * w, false)) |
                   (static_cast<uint32_t>(dm::bf16_bits_rn(dequantize_one(p, first + 2 * w + 1, false))) << 16);
    }
    uint4* dst = reinterpret_cast<uint4*>(out + first);
    dst[0] = make_uint4(words[0], words[1], words[2], words[3]);
    dst[1] = make_uint4(words[4], words[5], words[6], words[7]);
  }
}

// ------------------------------------------------------------------ swizzle, transpose -------------
__global__ void __launch_bounds__(kThreads) swizzle_kernel(const uint8_t* scales, int64_t rows, int64_t scale_cols,
                                                           int64_t total, uint8_t* out) {
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < total;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const dm::ScaleIndex at = dm::swizzled_scale_position(o, scale_cols);
    out[o] = (at.row < rows && at.col < scale_cols) ? scales[at.row * scale_cols + at.col] : 0;
  }
}

template <typename InT>
__global__ void transpose_kernel(const InT* x, int64_t rows, int64_t cols, InT* out) {
  __shared__ InT tile[32][33];
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * 32;
  // Row tiles stride by gridDim.y: grid.y is capped (NIBBLE_CUDA_MAX_GRID_Y), which 32-row tiles pass at ~2.1M rows.
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * 32; r0 < rows; r0 += static_cast<int64_t>(gridDim.y) * 32) {
    for (int k = threadIdx.y; k < 32; k += blockDim.y) {
      const int64_t r = r0 + k, c = c0 + threadIdx.x;
      if (r < rows && c < cols) tile[k][threadIdx.x] = x[r * cols + c];
    }
    __syncthreads();
    for (int k = threadIdx.y; k < 32; k += blockDim.y) {
      const int64_t c = c0 + k, r = r0 + threadIdx.x;
      if (r < rows && c < cols) out[c * rows + r] = tile[threadIdx.x][k];
    }
    __syncthreads();  // the tile is reused by the next row tile
  }
}

// ------------------------------------------------------------------ host side ----------------------

// bf16_operand: also the BF16 operand of the emulated GEMM (NVFP4 only; the tile kernel writes it).
DeviceQuantized make_header(int64_t rows, int64_t cols, const QuantOptions& o, Context& ctx, bool bf16_operand) {
  DeviceQuantized q;
  q.layout() = layout_of(o, rows, cols);
  q.codes = DeviceBuffer<uint8_t>(static_cast<size_t>(q.code_bytes()), ctx.stream());
  if (q.block != BlockShape::per_tensor) q.scales = DeviceBuffer<uint8_t>(static_cast<size_t>(q.scale_bytes()), ctx.stream());
  q.globals = DeviceBuffer<float>(2, ctx.stream());
  q.globals.fill_zero();  // amax accumulates with atomicMax from 0
  if (q.row_scaled) q.row_globals = DeviceBuffer<float>(static_cast<size_t>(2 * rows), ctx.stream());
  if (bf16_operand && o.format == Format::nvfp4) q.bf16 = DeviceBuffer<uint16_t>(static_cast<size_t>(rows * cols), ctx.stream());
  return q;
}

void require_aligned(const void* p, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
    throw UsageError(std::string(what) + " must be 16-byte aligned (device allocations are); got an offset pointer");
}

std::string nonfinite_message(int64_t i, int64_t cols, const std::string& which) {
  return "non-finite value at index [" + std::to_string(i / cols) + ", " + std::to_string(i % cols) + "] (flat " +
         std::to_string(i) + ")" + which + ": quantization needs finite input; fix the producer of the tensor";
}

// Finite-check result of one or more amax passes: read back at the end (one synchronisation), or,
// deferred, folded into the context's sticky word by the last of the passes (fold_for_last_pass).
struct FiniteCheck {
  DeviceBuffer<unsigned long long> first_bad;
  int64_t rows, cols;  // of x
  bool deferred;
  FiniteCheck(int64_t rows_, int64_t cols_, const KernelOptions& kopt, Context& ctx)
      : first_bad(1, ctx.stream()), rows(rows_), cols(cols_) {
    NIBBLE_CUDA_CHECK(cudaMemsetAsync(first_bad.data(), 0xFF, sizeof(unsigned long long), ctx.stream()));
    // Deferred unless the index or the count would not fit the word: then checked now.
    deferred = kopt.check_finite && kopt.defer_finite_check && rows * cols < (int64_t{1} << kDeferredIndexBits) &&
               ctx.deferred_finite_checks().shapes.size() + 1 < kMaxDeferredChecks;
  }
  // The fold target of the amax pass that runs last (none when not deferred); registers this
  // quantization among the pending ones.
  DeferredFold fold_for_last_pass(Context& ctx) const {
    if (!deferred) return {};
    Context::DeferredFiniteChecks& d = ctx.deferred_finite_checks();
    if (d.word.empty()) {
      d.word = DeviceBuffer<unsigned long long>(1, ctx.stream());
      NIBBLE_CUDA_CHECK(cudaMemsetAsync(d.word.data(), 0xFF, sizeof(unsigned long long), ctx.stream()));
      d.blocks_done = DeviceBuffer<unsigned>(1, ctx.stream());
      d.blocks_done.fill_zero();
    }
    d.shapes.push_back({rows, cols});
    return {d.word.data(), static_cast<unsigned long long>(d.shapes.size() - 1), d.blocks_done.data()};
  }
  // After the passes: per kopt, nothing (unchecked or deferred) or a read now.
  void finish(const KernelOptions& kopt) const {
    if (!kopt.check_finite || deferred) return;
    const unsigned long long bad = first_bad.download()[0];
    if (bad == kNoNonFinite) return;
    throw NumericalError(nonfinite_message(static_cast<int64_t>(bad), cols, ""));
  }
};

template <typename InT>
void launch_amax(const InT* x, int64_t rows, int64_t cols, AmaxOver over, float* out, unsigned long long* first_bad,
                 Context& ctx, float* plain_out = nullptr, DeferredFold fold = {}) {
  const int64_t units = rows * cols / 16 + 1;
  const int grid = grid_for(units, ctx);
  switch (over) {
    case AmaxOver::values:
      NIBBLE_LAUNCH(grid, kThreads, 0, ctx.stream(), amax_kernel<InT, AmaxOver::values>)(x, rows, cols, out, first_bad, plain_out, fold);
      break;
    case AmaxOver::rht_rows:
      NIBBLE_LAUNCH(grid, kThreads, 0, ctx.stream(), amax_kernel<InT, AmaxOver::rht_rows>)(x, rows, cols, out, first_bad, plain_out, fold);
      break;
    case AmaxOver::rht_columns:
      NIBBLE_LAUNCH(grid, kThreads, 0, ctx.stream(), amax_kernel<InT, AmaxOver::rht_columns>)(x, rows, cols, out, first_bad, plain_out, fold);
      break;
  }
  NIBBLE_CUDA_CHECK_LAUNCH();
}

Nvfp4Side side_for(DeviceQuantized& q, const QuantOptions& o, const KernelOptions& kopt) {
  Nvfp4Side s;
  s.codes = q.codes.data();
  s.scales = q.scales.data();
  s.amax = q.globals.data();
  s.decode_out = q.globals.data() + 1;
  s.bf16_out = q.bf16.empty() ? nullptr : q.bf16.data();
  s.rht = o.rht;
  s.stochastic = o.rounding == Rounding::stochastic;
  s.four_over_six = !o.four_over_six                            ? dm::FourOverSix::off
                     : o.four_over_six_error == FourOverSixError::mse ? dm::FourOverSix::mse
                                                                     : dm::FourOverSix::mae;
  s.numerator = dm::nvfp4_global_numerator(o.four_over_six, o.four_over_six_e4m3_max);
  s.seed = o.seed;
  s.offset = o.offset;
  s.step_hash = kopt.sr_step_hash;
  return s;
}

void launch_nvfp4(const Nvfp4TileParams& p, bool bf16_input, Context& ctx, const KernelOptions& kopt) {
  const bool sr = (p.row_enabled && p.row.stochastic) || (p.col_mode == ColumnMode::independent && p.col.stochastic);
#if defined(NIBBLE_HAVE_SM100_KERNELS)
  if (kopt.allow_sm100_kernels && runs_sm100a_kernels(ctx.device().cc_major, ctx.device().cc_minor)) {
    detail::launch_nvfp4_tile_kernel_sm100(p, bf16_input, sr && kopt.hardware_stochastic_rounding, ctx.stream());
    NIBBLE_CUDA_CHECK_LAUNCH();
    return;
  }
#endif
  if (sr && kopt.hardware_stochastic_rounding)
    throw UsageError("hardware stochastic rounding needs an sm_100/sm_103 GPU and a build with the sm_100a kernels; "
                     "this device is sm_" + std::to_string(ctx.device().compute_capability()));
  detail::launch_nvfp4_tile_kernel_reference(p, bf16_input, ctx.stream());
  NIBBLE_CUDA_CHECK_LAUNCH();
}

template <typename InT>
DeviceQuantized quantize_rowwise(const InT* x, int64_t rows, int64_t cols, const QuantOptions& o, Context& ctx,
                                 const KernelOptions& kopt) {
  static_assert(std::is_same_v<InT, float> || std::is_same_v<InT, __nv_bfloat16>);
  validate_shape(rows, cols, o);
  require_aligned(x, "the input tensor");
  DeviceQuantized q = make_header(rows, cols, o, ctx, kopt.write_bf16_operand);
  FiniteCheck check(rows, cols, kopt, ctx);
  const bool rht_amax = o.format == Format::nvfp4 && o.rht;
  // Row-scaled tensors always take their own per-row amax pass (a given amax is a tensor's).
  const bool amax_given = kopt.given_amax != nullptr && !o.row_scaled;
  if (o.row_scaled) {
    NIBBLE_LAUNCH(grid_for(rows * kThreads, ctx), kThreads, 0, ctx.stream(), row_amax_kernel<InT>)(
        x, rows, cols, q.row_globals.data(), q.globals.data(), check.first_bad.data(), check.fold_for_last_pass(ctx));
    NIBBLE_CUDA_CHECK_LAUNCH();
  } else if (amax_given)
    NIBBLE_CUDA_CHECK(cudaMemcpyAsync(q.globals.data(), kopt.given_amax, sizeof(float), cudaMemcpyDeviceToDevice,
                                      ctx.stream()));
  else
    launch_amax(x, rows, cols, rht_amax ? AmaxOver::rht_rows : AmaxOver::values, q.globals.data(),
                check.first_bad.data(), ctx, nullptr, check.fold_for_last_pass(ctx));
  const int64_t n = rows * cols;
  switch (o.format) {
    case Format::nvfp4: {
      Nvfp4TileParams p;
      p.x = x;
      p.rows = rows;
      p.cols = cols;
      p.row_tile16 = o.tile_16x16;
      p.row = side_for(q, o, kopt);
      if (o.row_scaled) {
        p.row.row_amax = q.row_globals.data();
        p.row.row_decode_out = q.row_globals.data() + rows;
        p.row.decode_out = nullptr;  // globals[1] stays 1 (row_amax_kernel)
      }
      launch_nvfp4(p, std::is_same_v<InT, __nv_bfloat16>, ctx, kopt);
      break;
    }
    case Format::mxfp4:
    case Format::mxfp8: {
      NIBBLE_LAUNCH(grid_for(n / 32, ctx), kThreads, 0, ctx.stream(), mx_kernel<InT>)(
          x, n, o.format == Format::mxfp4, o.rounding == Rounding::stochastic, o.seed, kopt.sr_step_hash, o.offset, q.codes.data(),
          q.scales.data(), q.globals.data());
      NIBBLE_CUDA_CHECK_LAUNCH();
      break;
    }
    case Format::fp8_e4m3:
    case Format::fp8_e5m2:
      NIBBLE_LAUNCH(grid_for(n, ctx), kThreads, 0, ctx.stream(), fp8_tensor_kernel<InT>)(
          x, n, o.format == Format::fp8_e4m3, q.globals.data(), q.codes.data());
      NIBBLE_CUDA_CHECK_LAUNCH();
      break;
  }
  if (!amax_given) check.finish(kopt);
  return q;
}

template <typename InT>
DeviceQuantized transpose_then_quantize(const InT* x, int64_t rows, int64_t cols, const QuantOptions& o, Context& ctx,
                                        const KernelOptions& kopt) {
  require_aligned(x, "the input tensor");
  DeviceBuffer<InT> t(static_cast<size_t>(rows * cols), ctx.stream());
  const dim3 grid(static_cast<unsigned>((cols + 31) / 32),
                  static_cast<unsigned>(std::min<int64_t>((rows + 31) / 32, NIBBLE_CUDA_MAX_GRID_Y)));
  NIBBLE_LAUNCH(grid, dim3(32, 8), 0, ctx.stream(), transpose_kernel<InT>)(x, rows, cols, t.data());
  NIBBLE_CUDA_CHECK_LAUNCH();
  KernelOptions column_kopt = kopt;
  column_kopt.given_amax = kopt.given_column_amax;
  return quantize_rowwise(static_cast<const InT*>(t.data()), cols, rows, o, ctx, column_kopt);
}

// Either side row-scaled (TE's row_scaled_activation: X and X^T): each copy on its own, the
// column-wise one as the row-wise quantization of x^T (its rows are the columns of x, each with
// its own amax), the reference's definition of the column-wise copy.
template <typename InT>
QuantizedPair quantize_pair_row_scaled(const InT* x, int64_t rows, int64_t cols, const QuantOptions& row_opt,
                                       const QuantOptions& col_opt, bool want_rows, Context& ctx,
                                       const KernelOptions& kopt) {
  QuantizedPair out;
  if (want_rows) out.rowwise = quantize_rowwise(x, rows, cols, row_opt, ctx, kopt);
  out.columnwise = transpose_then_quantize(x, rows, cols, col_opt, ctx, kopt);
  return out;
}

template <typename InT>
QuantizedPair quantize_pair(const InT* x, int64_t rows, int64_t cols, const QuantOptions& row_opt,
                            const QuantOptions& col_opt, bool want_rows, Context& ctx, const KernelOptions& kopt) {
  if (row_opt.format != Format::nvfp4 || col_opt.format != Format::nvfp4)
    throw UsageError("the fused row-wise + column-wise quantization is for nvfp4; quantize other formats twice");
  if (row_opt.row_scaled || col_opt.row_scaled) return quantize_pair_row_scaled(x, rows, cols, row_opt, col_opt, want_rows, ctx, kopt);
  if (want_rows) validate_shape(rows, cols, row_opt);
  validate_shape(cols, rows, col_opt);  // the column-wise copy is [cols, rows]: blocks run along rows
  if (rows % 16 != 0 || cols % 16 != 0)
    throw UsageError("the column-wise copy needs both dimensions to be multiples of 16 (got [" + std::to_string(rows) +
                     ", " + std::to_string(cols) + "])");
  const bool tile_transpose = col_opt.tile_16x16;
  if (tile_transpose) {
    if (!row_opt.tile_16x16 || row_opt.rht || col_opt.rht || row_opt.four_over_six != col_opt.four_over_six ||
        four_over_six_error_of(row_opt) != four_over_six_error_of(col_opt) ||
        four_over_six_e4m3_max_of(row_opt) != four_over_six_e4m3_max_of(col_opt) ||
        row_opt.rounding != col_opt.rounding || row_opt.seed != col_opt.seed || row_opt.offset != col_opt.offset)
      throw UsageError("16x16 tiles give the column-wise copy as the exact transpose of the row-wise one: use the same "
                       "options on both sides, without RHT");
  } else if (row_opt.tile_16x16 && want_rows) {
    throw UsageError("16x16 row-wise blocks with a 1x16 column-wise copy: quantize the two separately");
  }
  require_aligned(x, "the input tensor");
  QuantizedPair out;
  FiniteCheck check(rows, cols, kopt, ctx);
  out.columnwise = make_header(cols, rows, col_opt, ctx, kopt.write_bf16_operand);
  Nvfp4TileParams p;
  p.x = x;
  p.rows = rows;
  p.cols = cols;
  p.row_enabled = want_rows || tile_transpose;
  p.row_tile16 = row_opt.tile_16x16;
  if (p.row_enabled) {
    out.rowwise = make_header(rows, cols, row_opt, ctx, want_rows && kopt.write_bf16_operand);
    p.row = side_for(out.rowwise, row_opt, kopt);
  }
  p.col = side_for(out.columnwise, col_opt, kopt);
  p.col_mode = tile_transpose ? ColumnMode::tile_transpose : ColumnMode::independent;
  // The amax passes, reading x as few times as the transforms allow.
  float* row_amax = p.row_enabled ? out.rowwise.globals.data() : nullptr;
  float* col_amax = tile_transpose ? nullptr : out.columnwise.globals.data();
  unsigned long long* bad = check.first_bad.data();
  const bool amax_given = (!row_amax || kopt.given_amax) && (!col_amax || kopt.given_column_amax);
  if (amax_given) {
    if (row_amax)
      NIBBLE_CUDA_CHECK(cudaMemcpyAsync(row_amax, kopt.given_amax, sizeof(float), cudaMemcpyDeviceToDevice, ctx.stream()));
    if (col_amax)
      NIBBLE_CUDA_CHECK(
          cudaMemcpyAsync(col_amax, kopt.given_column_amax, sizeof(float), cudaMemcpyDeviceToDevice, ctx.stream()));
  } else if (!col_amax) {  // 16x16: the column-wise copy takes the row-wise amax and decode scale after the kernel
    launch_amax(x, rows, cols, row_opt.rht ? AmaxOver::rht_rows : AmaxOver::values, row_amax, bad, ctx, nullptr,
                check.fold_for_last_pass(ctx));
  } else if (!row_amax) {
    launch_amax(x, rows, cols, col_opt.rht ? AmaxOver::rht_columns : AmaxOver::values, col_amax, bad, ctx, nullptr,
                check.fold_for_last_pass(ctx));
  } else if (!row_opt.rht && !col_opt.rht) {
    launch_amax(x, rows, cols, AmaxOver::values, row_amax, bad, ctx, nullptr, check.fold_for_last_pass(ctx));
    NIBBLE_CUDA_CHECK(cudaMemcpyAsync(col_amax, row_amax, sizeof(float), cudaMemcpyDeviceToDevice, ctx.stream()));
  } else if (!row_opt.rht) {  // the wgrad case: one pass gives both
    launch_amax(x, rows, cols, AmaxOver::rht_columns, col_amax, bad, ctx, row_amax, check.fold_for_last_pass(ctx));
  } else if (!col_opt.rht) {
    launch_amax(x, rows, cols, AmaxOver::rht_rows, row_amax, bad, ctx, col_amax, check.fold_for_last_pass(ctx));
  } else {
    launch_amax(x, rows, cols, AmaxOver::rht_rows, row_amax, bad, ctx);
    launch_amax(x, rows, cols, AmaxOver::rht_columns, col_amax, bad, ctx, nullptr, check.fold_for_last_pass(ctx));
  }
  launch_nvfp4(p, std::is_same_v<InT, __nv_bfloat16>, ctx, kopt);
  if (tile_transpose)
    NIBBLE_CUDA_CHECK(cudaMemcpyAsync(out.columnwise.globals.data(), out.rowwise.globals.data(), 2 * sizeof(float),
                                      cudaMemcpyDeviceToDevice, ctx.stream()));
  if (!amax_given) check.finish(kopt);
  return out;
}

DequantParams dequant_params(const DeviceQuantized& q) {
  return {q.format,         q.rows * q.cols, q.block_len(),
          q.codes.data(),   q.scales.data(), q.globals.data(),
          q.rht,            q.row_scaled ? q.row_globals.data() + q.rows : nullptr,
          q.cols};
}

}  // namespace

// ------------------------------------------------------------------ public API --------------------
namespace detail {
void launch_nvfp4_tile_kernel_reference(const Nvfp4TileParams& p, bool input_is_bf16, cudaStream_t stream) {
  if (input_is_bf16)
    launch_nvfp4_tile_kernel<__nv_bfloat16, EncoderSet::reference>(p, stream);
  else
    launch_nvfp4_tile_kernel<float, EncoderSet::reference>(p, stream);
}
}  // namespace detail

void validate_shape(int64_t rows, int64_t cols, const QuantOptions& o) {
  if (rows <= 0 || cols <= 0)
    throw UsageError("tensor shape [" + std::to_string(rows) + ", " + std::to_string(cols) + "] is empty");
  const std::string fmt(to_string(o.format));
  if (o.format != Format::nvfp4 && (o.rht || o.four_over_six || o.tile_16x16))
    throw UsageError("--rht, --four-over-six and 16x16 blocks apply to nvfp4 only, not " + fmt);
  if (o.rounding == Rounding::stochastic && !is_4bit(o.format))
    throw UsageError("stochastic rounding applies to the 4-bit formats (nvfp4, mxfp4), not " + fmt);
  check_four_over_six_e4m3_max(o.four_over_six_e4m3_max, "four_over_six_e4m3_max");
  if (o.four_over_six_error != FourOverSixError::mae && o.four_over_six_error != FourOverSixError::mse)
    throw UsageError("four_over_six_error " + std::to_string(static_cast<int>(o.four_over_six_error)) +
                     " is not an error measure: use mae or mse");
  const int64_t block = o.format == Format::nvfp4 ? 16 : (o.format == Format::mxfp4 || o.format == Format::mxfp8) ? 32 : 1;
  if (cols % block != 0)
    throw UsageError("the last dimension (" + std::to_string(cols) + ") is not a multiple of the " + fmt +
                     " block size " + std::to_string(block) + ": pad or crop the tensor to a multiple of " +
                     std::to_string(block) + " (nibble does not pad silently)");
  if (is_4bit(o.format) && cols % 2 != 0) throw UsageError("4-bit formats need an even number of columns");
  ref::check_row_scaled(o);  // the reference's refusals and message
}

DeviceQuantized quantize(const float* x, int64_t rows, int64_t cols, const QuantOptions& opt, Context& ctx,
                         const KernelOptions& kopt) {
  return quantize_rowwise(x, rows, cols, opt, ctx, kopt);
}
DeviceQuantized quantize(const bf16* x, int64_t rows, int64_t cols, const QuantOptions& opt, Context& ctx,
                         const KernelOptions& kopt) {
  return quantize_rowwise(reinterpret_cast<const __nv_bfloat16*>(x), rows, cols, opt, ctx, kopt);
}

QuantizedPair quantize_both(const float* x, int64_t rows, int64_t cols, const QuantOptions& row_opt,
                            const QuantOptions& col_opt, Context& ctx, const KernelOptions& kopt) {
  return quantize_pair(x, rows, cols, row_opt, col_opt, true, ctx, kopt);
}
QuantizedPair quantize_both(const bf16* x, int64_t rows, int64_t cols, const QuantOptions& row_opt,
                            const QuantOptions& col_opt, Context& ctx, const KernelOptions& kopt) {
  return quantize_pair(reinterpret_cast<const __nv_bfloat16*>(x), rows, cols, row_opt, col_opt, true, ctx, kopt);
}

DeviceQuantized quantize_transposed(const float* x, int64_t rows, int64_t cols, const QuantOptions& opt,
                                    Context& ctx, const KernelOptions& kopt) {
  if (opt.format == Format::nvfp4 && rows % 16 == 0 && cols % 16 == 0 && !(opt.tile_16x16 && opt.rht)) {
    KernelOptions column_kopt = kopt;  // the caller's given amax is the column-wise copy's
    column_kopt.given_column_amax = kopt.given_amax;
    QuantizedPair pair = quantize_pair(x, rows, cols, opt, opt, /*want_rows=*/false, ctx, column_kopt);
    return std::move(pair.columnwise);
  }
  // Other formats and shapes: transpose on the device, then quantize row-wise (what the reference does).
  KernelOptions column_kopt = kopt;  // transpose_then_quantize reads the column-wise amax
  column_kopt.given_column_amax = kopt.given_amax;
  return transpose_then_quantize(x, rows, cols, opt, ctx, column_kopt);
}

void amax(const float* x, int64_t n, float* amax_out, Context& ctx) {
  NIBBLE_CUDA_CHECK(cudaMemsetAsync(amax_out, 0, sizeof(float), ctx.stream()));
  DeviceBuffer<unsigned long long> ignored(1, ctx.stream());  // non-finite position: not asked for here
  NIBBLE_CUDA_CHECK(cudaMemsetAsync(ignored.data(), 0xFF, sizeof(unsigned long long), ctx.stream()));
  launch_amax(x, 1, n, AmaxOver::values, amax_out, ignored.data(), ctx);
}

void dequantize(const DeviceQuantized& q, float* out, Context& ctx) {
  const DequantParams p = dequant_params(q);
  NIBBLE_LAUNCH(grid_for((p.n + 15) / 16, ctx), kThreads, 0, ctx.stream(), dequantize_f32_kernel)(p, out);
  NIBBLE_CUDA_CHECK_LAUNCH();
}

void dequantize_block_scaled_bf16(const DeviceQuantized& q, uint16_t* out, Context& ctx) {
  require_aligned(out, "the BF16 output");
  DequantParams p = dequant_params(q);
  p.inverse_rht = false;  // the GEMM multiplies in the transformed domain
  NIBBLE_LAUNCH(grid_for((p.n + 15) / 16, ctx), kThreads, 0, ctx.stream(), dequantize_bf16_kernel)(p, out);
  NIBBLE_CUDA_CHECK_LAUNCH();
}

void transpose_bf16_operand(const DeviceQuantized& s, DeviceQuantized& t, Context& ctx) {
  if (s.bf16.empty()) return;
  t.bf16 = DeviceBuffer<uint16_t>(s.bf16.size(), ctx.stream());
  const auto* x = reinterpret_cast<const __nv_bfloat16*>(s.bf16.data());  // 16-bit words moved as they are
  const dim3 grid(static_cast<unsigned>((s.cols + 31) / 32),
                  static_cast<unsigned>(std::min<int64_t>((s.rows + 31) / 32, NIBBLE_CUDA_MAX_GRID_Y)));
  NIBBLE_LAUNCH(grid, dim3(32, 8), 0, ctx.stream(), transpose_kernel<__nv_bfloat16>)(
      x, s.rows, s.cols, reinterpret_cast<__nv_bfloat16*>(t.bf16.data()));
  NIBBLE_CUDA_CHECK_LAUNCH();
}

void swizzle_scales(const uint8_t* scales, int64_t rows, int64_t scale_cols, uint8_t* out, Context& ctx) {
  const int64_t total = dm::swizzled_scale_bytes(rows, scale_cols);
  NIBBLE_LAUNCH(grid_for(total, ctx), kThreads, 0, ctx.stream(), swizzle_kernel)(scales, rows, scale_cols, total, out);
  NIBBLE_CUDA_CHECK_LAUNCH();
}
void swizzle_scales(const DeviceQuantized& q, uint8_t* out, Context& ctx) {
  if (q.block == BlockShape::per_tensor) throw UsageError("a per-tensor FP8 tensor has no block scales to swizzle");
  swizzle_scales(q.scales.data(), q.rows, q.scale_cols(), out, ctx);
}

void throw_deferred_nonfinite(Context& ctx) {
  Context::DeferredFiniteChecks& d = ctx.deferred_finite_checks();
  if (d.shapes.empty()) return;
  const unsigned long long word = d.word.download()[0];
  NIBBLE_CUDA_CHECK(cudaMemsetAsync(d.word.data(), 0xFF, sizeof(unsigned long long), ctx.stream()));
  const std::vector<std::array<int64_t, 2>> shapes = std::move(d.shapes);
  d.shapes.clear();
  if (word == kNoNonFinite) return;
  const size_t k = static_cast<size_t>(word >> kDeferredIndexBits);
  const auto i = static_cast<int64_t>(word & ((uint64_t{1} << kDeferredIndexBits) - 1));
  const auto [rows, cols] = shapes.at(k);
  throw NumericalError(nonfinite_message(i, cols,
                                         " of quantization " + std::to_string(k + 1) + " of " +
                                             std::to_string(shapes.size()) + " since the last check (a [" +
                                             std::to_string(rows) + ", " + std::to_string(cols) + "] input)"));
}

QuantizedTensor to_host(const DeviceQuantized& q) {
  QuantizedTensor h;
  h.layout() = q.layout();
  h.codes = q.codes.download();
  h.scales = q.scales.download();
  const std::vector<float> globals = q.globals.download();
  h.amax = globals[0];
  h.decode_scale = globals[1];
  if (q.row_scaled) {
    const std::vector<float> rg = q.row_globals.download();  // [row amax..., row S_dec...]
    h.row_amax.assign(rg.begin(), rg.begin() + q.rows);
    h.row_decode_scale.assign(rg.begin() + q.rows, rg.end());
  }
  return h;
}

DeviceQuantized to_device(const QuantizedTensor& h, Context& ctx) {
  DeviceQuantized q;
  q.layout() = h.layout();
  q.codes = DeviceBuffer<uint8_t>::from_host(h.codes, ctx.stream());
  q.scales = DeviceBuffer<uint8_t>::from_host(h.scales, ctx.stream());
  const float globals[2] = {h.amax, h.decode_scale};
  q.globals = DeviceBuffer<float>::from_host(std::span<const float>(globals, 2), ctx.stream());
  if (h.row_scaled) {
    if (static_cast<int64_t>(h.row_amax.size()) != h.rows || static_cast<int64_t>(h.row_decode_scale.size()) != h.rows)
      throw UsageError("a row-scaled tensor needs one amax and one decode scale per row (" + std::to_string(h.rows) +
                       " rows)");
    std::vector<float> rg(h.row_amax);
    rg.insert(rg.end(), h.row_decode_scale.begin(), h.row_decode_scale.end());
    q.row_globals = DeviceBuffer<float>::from_host(std::span<const float>(rg), ctx.stream());
  }
  return q;
}

}  // namespace nibble::cuda
