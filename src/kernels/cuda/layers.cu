// The model's layers on the GPU (layers.h). Element-wise layers: one thread per element. Row
// reductions (RMSNorm, cross-entropy, the gradient norm): a half-warp or warp per row or chunk whose
// lanes hold exactly the CPU's partial sums (lane_sum16's 16 lanes, the norm's 8 double lanes), folded
// by shuffles in the CPU's tree, so the bits stay the CPU's. Column sums that the CPU adds in token
// order (RMSNorm's gain, the embedding backward) keep that serial order per output and get their
// parallelism elsewhere (many warps staging the terms, a warp per distinct token). Deterministic, no
// atomics. The per-element arithmetic is layer_math.h's (the CPU's operation order).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/attention_fp32.cuh"
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/layer_math.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/layers.h"

namespace nibble::cuda {

namespace {

constexpr int kThreads = 256;

// A grid for n independent items walked with a grid-stride loop.
int grid_for(int64_t n, const Context& ctx) {
  const int64_t wanted = (n + kThreads - 1) / kThreads;
  const int64_t cap = static_cast<int64_t>(std::max(ctx.device().sm_count, 1)) * 32;
  return static_cast<int>(std::max<int64_t>(1, std::min(wanted, cap)));
}

#define NIBBLE_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); i += static_cast<int64_t>(gridDim.x) * blockDim.x)

template <typename Kernel, typename... Args>
void launch(int64_t n, Context& ctx, Kernel kernel, Args... args) {
  if (n <= 0) return;
  NIBBLE_LAUNCH(grid_for(n, ctx), kThreads, 0, ctx.stream(), kernel)(args...);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
}

// ------------------------------------------------------------------ element-wise ------------------
__global__ void add_kernel(float* y, const float* x, int64_t n) {
  NIBBLE_GRID_STRIDE(i, n) y[i] = dm::nb_add(y[i], x[i]);
}
__global__ void round_bf16_kernel(const float* x, uint16_t* y, int64_t n) {
  NIBBLE_GRID_STRIDE(i, n) y[i] = dm::bf16_bits_rn(x[i]);
}
__global__ void widen_bf16_kernel(const uint16_t* x, float* y, int64_t n) {
  NIBBLE_GRID_STRIDE(i, n) y[i] = dm::bf16_bits_to_float(x[i]);
}

__global__ void transpose_tiles_kernel(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols,
                                       uint8_t* t_codes, uint8_t* t_scales) {
  NIBBLE_GRID_STRIDE(i, cols * (rows / 2)) t_codes[i] = lm::transposed_tile_code_byte(codes, rows, cols, i);
  NIBBLE_GRID_STRIDE(i, cols * (rows / 16)) t_scales[i] = lm::transposed_tile_scale(scales, rows, cols, i);
}

// ------------------------------------------------------------------ layers ------------------------
__global__ void embedding_forward_kernel(const int32_t* tokens, int64_t n, const float* table, int64_t width, float* out) {
  NIBBLE_GRID_STRIDE(i, n * width) out[i] = table[static_cast<int64_t>(tokens[i / width]) * width + i % width];
}
// ------------------------------------------------------------------ warp-level reductions ---------
constexpr unsigned kFullWarp = 0xFFFFFFFFu;
constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = kThreads / kWarp;
// lane_sum16's 16 partial sums, one per lane of a half-warp: a block of 256 threads takes 16 rows.
constexpr int kRowLanes = 16;
constexpr int kRowsPerBlock = kThreads / kRowLanes;

// A grid of blocks for `items` rows (or columns, chunks) taken `per_block` at a time, capped as grid_for.
int grid_of(int64_t items, int64_t per_block, const Context& ctx) {
  const int64_t wanted = (items + per_block - 1) / per_block;
  const int64_t cap = static_cast<int64_t>(std::max(ctx.device().sm_count, 1)) * 32;
  return static_cast<int>(std::max<int64_t>(1, std::min(wanted, cap)));
}

// Half-warp rows: row = this half-warp's row of the block's group of kRowsPerBlock, walked with a
// grid stride. The loop bound is the group's, the same for every lane of a warp, so both halves of a
// warp reach every shuffle (rows past n run as `valid` false).
#define NIBBLE_HALF_WARP_ROWS(row, lane, valid, n)                                                      \
  for (int64_t group_ = blockIdx.x * static_cast<int64_t>(kRowsPerBlock); group_ < (n);                \
       group_ += static_cast<int64_t>(gridDim.x) * kRowsPerBlock)                                     \
    if (const int64_t row = group_ + threadIdx.x / kRowLanes; true)                                    \
      if (const int lane = static_cast<int>(threadIdx.x % kRowLanes); true)                           \
        if (const bool valid = row < (n); true)

// lm::lane_sum16 across a half-warp: lane l sums term(c) over c = l, l + 16, ... in order (the CPU's
// lane l, the ragged tail included: its element c lands in lane c % 16 too), then the CPU's tree
// lanes[l] += lanes[l + half] for half = 8, 4, 2, 1 as shuffles down. Every lane of the warp calls it;
// all get lane 0's sum.
template <class Term>
__device__ float half_warp_lane_sum16(int64_t width, int lane, bool valid, Term term) {
  float s = 0.0f;
  if (valid) {
    NIBBLE_UNROLL_BY(4)  // the terms' loads issued ahead of the chain of adds
    for (int64_t c = lane; c < width; c += kRowLanes) s = dm::nb_add(s, term(c));
  }
  for (int half = kRowLanes / 2; half >= 1; half /= 2) s = dm::nb_add(s, __shfl_down_sync(kFullWarp, s, half, kRowLanes));
  return __shfl_sync(kFullWarp, s, 0, kRowLanes);
}
// The row's maximum (lm::cross_entropy_row's max over v in order: the same value for non-NaN rows; a
// NaN makes the row's outputs NaN either way), on every lane of the half-warp.
__device__ float half_warp_row_max(const float* l, int64_t vocab, int lane, bool valid) {
  float m = -INFINITY;
  if (valid)
    for (int64_t c = lane; c < vocab; c += kRowLanes) m = dm::max_f(m, l[c]);
  for (int half = kRowLanes / 2; half >= 1; half /= 2) m = dm::max_f(m, __shfl_xor_sync(kFullWarp, m, half, kRowLanes));
  return __shfl_sync(kFullWarp, m, 0, kRowLanes);
}

// ------------------------------------------------------------------ embedding backward ------------
// A warp per token position i: the warp owns dtable's row tokens[i] when i is that token's first
// position (ballots over the earlier tokens, 32 at a time); it then adds the dout rows of every
// position of the token, in token order, lanes over columns: per element the CPU's order (dtable[t][c]
// += dout[i][c] for i ascending). Distinct tokens run in parallel; no two warps write one row.
__global__ void embedding_backward_kernel(const int32_t* tokens, int64_t n, const float* dout, int64_t width, float* dtable) {
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp; i < n; i += warps) {
    const int32_t t = tokens[i];
    bool seen_before = false;
    for (int64_t j0 = 0; j0 < i && !seen_before; j0 += kWarp) {
      const int64_t j = j0 + lane;
      seen_before = __any_sync(kFullWarp, j < i && tokens[j] == t);
    }
    if (seen_before) continue;
    float* d = dtable + static_cast<int64_t>(t) * width;
    for (int64_t j0 = i; j0 < n; j0 += kWarp) {
      const unsigned hits = __ballot_sync(kFullWarp, j0 + lane < n && tokens[j0 + lane] == t);
      for (int k = 0; k < kWarp; ++k) {
        if (!((hits >> k) & 1u)) continue;
        const float* g = dout + (j0 + k) * width;
        for (int64_t c = lane; c < width; c += kWarp) d[c] = dm::nb_add(d[c], g[c]);
      }
    }
  }
}

// ------------------------------------------------------------------ RMSNorm -----------------------
// A half-warp per row [width]: the sum of squares in lane_sum16's lanes, then y = x r gain by lanes.
__global__ void rmsnorm_forward_kernel(const float* x, const float* gain, int64_t n, int64_t width, float eps, float* y,
                                       float* rstd) {
  NIBBLE_HALF_WARP_ROWS(row, lane, valid, n) {
    const float* xr = x + row * width;
    const float ss = half_warp_lane_sum16(width, lane, valid, [xr](int64_t c) { return dm::nb_mul(xr[c], xr[c]); });
    if (!valid) continue;
    const float r = dm::nb_div(1.0f, dm::nb_sqrt(dm::nb_add(dm::nb_div(ss, static_cast<float>(width)), eps)));
    for (int64_t c = lane; c < width; c += kRowLanes) y[row * width + c] = dm::nb_mul(dm::nb_mul(xr[c], r), gain[c]);
    if (lane == 0) rstd[row] = r;
  }
}
// A half-warp per row: dx += r (dy gain - x r mean(dy gain x r)) (lm::rmsnorm_row_backward's order).
// __restrict__ and the unrolled loops let each lane's loads run ahead of its stores to dx (without
// them every load waited for the previous store: the kernel was latency-bound).
__global__ void rmsnorm_backward_rows_kernel(const float* __restrict__ x, const float* __restrict__ gain,
                                             const float* __restrict__ rstd, const float* __restrict__ dy,
                                             int64_t n, int64_t width, float* __restrict__ dx) {
  NIBBLE_HALF_WARP_ROWS(row, lane, valid, n) {
    const float* xr = x + row * width;
    const float* dyr = dy + row * width;
    const float r = valid ? rstd[row] : 0.0f;
    const float dot = half_warp_lane_sum16(width, lane, valid, [=](int64_t c) {
      return dm::nb_mul(dm::nb_mul(dm::nb_mul(dyr[c], gain[c]), xr[c]), r);
    });
    if (!valid) continue;
    const float mean_dot = dm::nb_div(dot, static_cast<float>(width));
    float* dxr = dx + row * width;
    NIBBLE_UNROLL_BY(4)
    for (int64_t c = lane; c < width; c += kRowLanes)
      dxr[c] = dm::nb_add(dxr[c], dm::nb_mul(r, dm::nb_sub(dm::nb_mul(dyr[c], gain[c]), dm::nb_mul(dm::nb_mul(xr[c], r), mean_dot))));
  }
}

// The gain gradient dgain[c] += the sum over token tiles k in order of (the sum over the tile's
// tokens i in order of dy[i][c] x[i][c] rstd[i]) (lm::rmsnorm_gain_column, the CPU's order). Each tile
// sum is a short serial chain (kGainTileTokens adds), so the tiles run side by side: a warp per (tile,
// 32 columns), lane c its column, the loads of x and dy issued ahead of the adds (128 bytes a row for
// the warp); their sums land in a [tiles, width] scratch, and a second kernel adds them in tile order.
__global__ void rmsnorm_gain_tiles_kernel(const float* __restrict__ x, const float* __restrict__ rstd,
                                          const float* __restrict__ dy, int64_t n, int64_t width, int64_t tiles,
                                          float* __restrict__ partial) {
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const int64_t column_groups = (width + kWarp - 1) / kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t w = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp; w < tiles * column_groups;
       w += warps) {
    const int64_t tile = w / column_groups, c = (w % column_groups) * kWarp + lane;
    if (c >= width) continue;
    const int64_t i0 = tile * lm::kGainTileTokens, i1 = i0 + lm::kGainTileTokens < n ? i0 + lm::kGainTileTokens : n;
    float s = 0.0f;
    NIBBLE_UNROLL_BY(8)
    for (int64_t i = i0; i < i1; ++i) s = dm::nb_add(s, dm::nb_mul(dm::nb_mul(dy[i * width + c], x[i * width + c]), rstd[i]));
    partial[tile * width + c] = s;
  }
}
__global__ void rmsnorm_gain_sum_kernel(const float* __restrict__ partial, int64_t tiles, int64_t width,
                                        float* __restrict__ dgain) {
  NIBBLE_GRID_STRIDE(c, width) {
    float s = 0.0f;
    for (int64_t k = 0; k < tiles; ++k) s = dm::nb_add(s, partial[k * width + c]);
    dgain[c] = dm::nb_add(dgain[c], s);
  }
}

__global__ void rope_kernel(float* x, int64_t tokens, int64_t seq, int64_t stride, int64_t first_col, int64_t heads,
                            int64_t head_dim, const float* cos, const float* sin, int64_t first_position,
                            float direction) {
  const int64_t half = head_dim / 2;
  NIBBLE_GRID_STRIDE(e, tokens * heads * half) {
    const int64_t t = e / (heads * half), h = (e / half) % heads, i = e % half;
    const int64_t pos = first_position + t % seq;
    float* v = x + t * stride + first_col + h * head_dim;
    lm::rope_pair(v + i, v + i + half, cos[pos * half + i], sin[pos * half + i], direction);
  }
}

__global__ void attention_forward_kernel(AttentionShape s, const float* qkv, float* out, float* stats, float scale) {
  NIBBLE_GRID_STRIDE(row, s.batch * s.heads * s.seq) lm::attention_forward_row(s, qkv, row, scale, out, stats);
}
__global__ void attention_backward_query_kernel(AttentionShape s, const float* qkv, const float* stats,
                                                const float* dout, float* dqkv, float* row_dot, float scale) {
  NIBBLE_GRID_STRIDE(row, s.batch * s.heads * s.seq)
  lm::attention_backward_query_row(s, qkv, stats, dout, row, scale, dqkv, row_dot);
}
__global__ void attention_backward_key_kernel(AttentionShape s, const float* qkv, const float* stats,
                                              const float* dout, float* dqkv, const float* row_dot, float scale) {
  NIBBLE_GRID_STRIDE(krow, s.batch * s.kv_heads * s.seq)
  lm::attention_backward_key_row(s, qkv, stats, dout, row_dot, krow, scale, dqkv);
}
__global__ void kv_append_kernel(AttentionShape s, int64_t past, const float* qkv, float* k_cache, float* v_cache) {
  NIBBLE_GRID_STRIDE(e, s.seq * s.kv_heads * s.head_dim) lm::kv_append_element(s, past, qkv, e, k_cache, v_cache);
}
__global__ void attention_decode_kernel(AttentionShape s, int64_t past, const float* qkv, const float* k_cache,
                                        const float* v_cache, float* out, float scale) {
  NIBBLE_GRID_STRIDE(e, s.seq * s.heads) lm::attention_decode_head(s, past, qkv, k_cache, v_cache, e, scale, out);
}

__global__ void swiglu_forward_kernel(const float* gate_up, int64_t n, int64_t hidden, float* a) {
  NIBBLE_GRID_STRIDE(e, n * hidden) a[e] = lm::swiglu_element(gate_up, hidden, e);
}
__global__ void swiglu_backward_kernel(const float* gate_up, const float* da, int64_t n, int64_t hidden, float* dgate_up) {
  NIBBLE_GRID_STRIDE(e, n * hidden) lm::swiglu_backward_element(gate_up, da, hidden, e, dgate_up);
}
// Cross-entropy, a half-warp per row [vocab] (lm::cross_entropy_row's order, its lane_sum16 as lanes):
// log(sum exp(l - max)) + max - l[target].
// row_stats (or null): the row's max and 1 / sum, the backward's factors as it computes them.
__global__ void cross_entropy_forward_kernel(const float* logits, const int32_t* targets, int64_t n, int64_t vocab,
                                             float* loss, float* row_stats) {
  NIBBLE_HALF_WARP_ROWS(row, lane, valid, n) {
    const float* l = logits + row * vocab;
    const float m = half_warp_row_max(l, vocab, lane, valid);
    const float sum = half_warp_lane_sum16(vocab, lane, valid, [=](int64_t c) { return lm::nb_exp(dm::nb_sub(l[c], m)); });
    if (valid && lane == 0) {
      loss[row] = dm::nb_sub(dm::nb_add(lm::nb_log(sum), m), l[targets[row]]);
      if (row_stats) {
        row_stats[2 * row] = m;
        row_stats[2 * row + 1] = dm::nb_div(1.0f, sum);
      }
    }
  }
}
// d = scale (softmax(l) - onehot(target)), a half-warp per row; d may alias l: every lane reads and
// writes only its own columns c = lane + 16k after the row maximum's shuffles (which all lanes reach
// after their reads), and the target's lane subtracts after its own write.
__global__ void cross_entropy_backward_kernel(const float* logits, const int32_t* targets, int64_t n, int64_t vocab,
                                              float scale, float* dlogits) {
  NIBBLE_HALF_WARP_ROWS(row, lane, valid, n) {
    const float* l = logits + row * vocab;
    float* d = dlogits + row * vocab;
    // exp(l - m) is computed twice (for the sum, then for the output) rather than written and read
    // back: three passes over the row instead of five, the same values.
    const float m = half_warp_row_max(l, vocab, lane, valid);
    const float inv = dm::nb_div(
        1.0f, half_warp_lane_sum16(vocab, lane, valid, [=](int64_t c) { return lm::nb_exp(dm::nb_sub(l[c], m)); }));
    if (!valid) continue;
    for (int64_t c = lane; c < vocab; c += kRowLanes)
      d[c] = dm::nb_mul(dm::nb_mul(lm::nb_exp(dm::nb_sub(l[c], m)), inv), scale);
    const int32_t target = targets[row];
    if (target % kRowLanes == lane) d[target] = dm::nb_sub(d[target], scale);
  }
}

// The same from the forward's (max, 1 / sum) per row: one pass over the row, a thread per element.
__global__ void cross_entropy_backward_kept_kernel(const float* logits, const int32_t* targets, int64_t n,
                                                   int64_t vocab, float scale, const float* __restrict__ row_stats,
                                                   float* dlogits) {
  NIBBLE_GRID_STRIDE(e, n * vocab) {
    const int64_t row = e / vocab;
    const float d = dm::nb_mul(dm::nb_mul(lm::nb_exp(dm::nb_sub(logits[e], row_stats[2 * row])), row_stats[2 * row + 1]), scale);
    dlogits[e] = e - row * vocab == targets[row] ? dm::nb_sub(d, scale) : d;
  }
}

// The gradient norm's chunks (lm::sum_of_squares_chunk), a warp per chunk: lane l % 8 holds the CPU's
// double lane l % 8. Each turn the warp loads 32 floats (one coalesced line) and the 8 lanes take them
// as four groups of 8 in order; groups of 8 left, then the ragged tail (into lane 0, as the CPU), then
// the CPU's tree ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) as shuffles down by 1, 2, 4.
__global__ void sum_of_squares_kernel(const float* g, int64_t n, int64_t chunks, double* partial) {
  const int lane = static_cast<int>(threadIdx.x % kWarp), own = lane % 8;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp; c < chunks; c += warps) {
    const int64_t begin = c * lm::kSumOfSquaresChunk;
    const int64_t end = begin + lm::kSumOfSquaresChunk < n ? begin + lm::kSumOfSquaresChunk : n;
    double acc = 0.0;
    int64_t i = begin;
    for (; i + kWarp <= end; i += kWarp) {
      const float line = g[i + lane];
      for (int group = 0; group < kWarp / 8; ++group) {
        const double x = static_cast<double>(__shfl_sync(kFullWarp, line, group * 8 + own));
        acc = dm::nb_add_d(acc, dm::nb_mul_d(x, x));
      }
    }
    for (; i + 8 <= end; i += 8) {
      const double x = static_cast<double>(g[i + own]);
      acc = dm::nb_add_d(acc, dm::nb_mul_d(x, x));
    }
    if (lane == 0)
      for (; i < end; ++i) {
        const double x = static_cast<double>(g[i]);
        acc = dm::nb_add_d(acc, dm::nb_mul_d(x, x));
      }
    for (int offset = 1; offset < 8; offset *= 2) acc = dm::nb_add_d(acc, __shfl_down_sync(kFullWarp, acc, offset));
    if (lane == 0) partial[c] = acc;
  }
}
__global__ void adamw_kernel(lm::AdamWScalars k, const float* g, float* m, float* v, float* w, const uint8_t* mask, int64_t n) {
  NIBBLE_GRID_STRIDE(i, n) lm::adamw_element(k, g[i], m + i, v + i, w + i, mask[i]);
}

AttentionShape checked(const AttentionShape& s) {
  NIBBLE_CHECK(s.kv_heads > 0 && s.heads % s.kv_heads == 0 && s.head_dim > 0 && s.seq > 0 && s.batch > 0,
               "attention shape: positive sizes and heads a multiple of kv_heads");
  return s;
}
float attention_scale(const AttentionShape& s) { return 1.0f / std::sqrt(static_cast<float>(s.head_dim)); }
// Blocks of the tiled attention kernels: a block per tile of `rows` rows (`tiles` of them a sequence)
// of each (sequence, head) of `heads`.
int attention_tile_blocks(const AttentionShape& s, int64_t tiles, int64_t heads, int rows) {
  const int64_t blocks = tiles * heads * s.batch;
  NIBBLE_CHECK(blocks <= 0x7FFFFFFF, "attention: more than 2^31 - 1 tiles of %d rows (batch x heads x seq / %d)", rows,
               rows);
  return static_cast<int>(blocks);
}
int flash_blocks(const AttentionShape& s, int64_t heads) {
  return attention_tile_blocks(s, flash::tiles(s), heads, flash::kTile);
}
int fp32_attention_blocks(const AttentionShape& s, int64_t heads) {
  return attention_tile_blocks(s, fp32_attention::tiles(s), heads, fp32_attention::kRows);
}

}  // namespace

void add(float* y, const float* x, int64_t n, Context& ctx) { launch(n, ctx, add_kernel, y, x, n); }
void round_to_bf16(const float* x, uint16_t* y, int64_t n, Context& ctx) { launch(n, ctx, round_bf16_kernel, x, y, n); }
void widen_bf16(const uint16_t* x, float* y, int64_t n, Context& ctx) { launch(n, ctx, widen_bf16_kernel, x, y, n); }

void transpose_nvfp4_tiles(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, uint8_t* t_codes,
                           uint8_t* t_scales, Context& ctx) {
  NIBBLE_CHECK(rows % 16 == 0 && cols % 16 == 0, "transpose_nvfp4_tiles: a shape of whole 16x16 tiles");
  launch(rows * cols / 2, ctx, transpose_tiles_kernel, codes, scales, rows, cols, t_codes, t_scales);
}

void embedding_forward(const int32_t* tokens, int64_t n, const float* table, int64_t width, float* out, Context& ctx) {
  launch(n * width, ctx, embedding_forward_kernel, tokens, n, table, width, out);
}
void embedding_backward(const int32_t* tokens, int64_t n, const float* dout, int64_t width, float* dtable, Context& ctx) {
  if (n <= 0 || width <= 0) return;
  NIBBLE_LAUNCH(grid_of(n, kWarpsPerBlock, ctx), kThreads, 0, ctx.stream(), embedding_backward_kernel)(tokens, n, dout, width, dtable);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
}
void rmsnorm_forward(const float* x, const float* gain, int64_t n, int64_t width, float eps, float* y, float* rstd,
                     Context& ctx) {
  if (n <= 0) return;
  NIBBLE_LAUNCH(grid_of(n, kRowsPerBlock, ctx), kThreads, 0, ctx.stream(), rmsnorm_forward_kernel)(x, gain, n, width, eps, y, rstd);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
}
void rmsnorm_backward(const float* x, const float* gain, const float* rstd, const float* dy, int64_t n, int64_t width,
                      float* dx, float* dgain, Context& ctx) {
  if (n <= 0 || width <= 0) return;
  NIBBLE_LAUNCH(grid_of(n, kRowsPerBlock, ctx), kThreads, 0, ctx.stream(), rmsnorm_backward_rows_kernel)(x, gain, rstd, dy, n, width, dx);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
  const int64_t tiles = (n + lm::kGainTileTokens - 1) / lm::kGainTileTokens;
  float* partial = reinterpret_cast<float*>(
      ctx.scratch(Context::Scratch::reduction, static_cast<size_t>(tiles * width) * sizeof(float)));
  NIBBLE_LAUNCH(grid_of(tiles * ((width + kWarp - 1) / kWarp), kWarpsPerBlock, ctx), kThreads, 0, ctx.stream(),
                rmsnorm_gain_tiles_kernel)(x, rstd, dy, n, width, tiles, partial);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
  launch(width, ctx, rmsnorm_gain_sum_kernel, partial, tiles, width, dgain);
}
void rope(float* x, int64_t tokens, int64_t seq, int64_t stride, int64_t first_col, int64_t heads, int64_t head_dim,
          const float* cos, const float* sin, int64_t first_position, float direction, Context& ctx) {
  launch(tokens * heads * (head_dim / 2), ctx, rope_kernel, x, tokens, seq, stride, first_col, heads, head_dim, cos, sin,
         first_position, direction);
}
// Shapes with BF16 products and head_dim 32 or 64: the tiled tensor-core kernels (flash_attention.cuh);
// FP32 at head_dim 32 or 64: row-per-thread kernels over staged tiles (attention_fp32.cuh, the CPU's
// bits); the others (other head dims, BF16 before sm_80): a thread per row reading global memory, the
// CPU's bits (layer_math.h).
template <int HD>
void flash_forward(const AttentionShape& s, const float* qkv, float* out, float* softmax_stats, Context& ctx) {
  NIBBLE_LAUNCH(flash_blocks(s, s.heads), flash::kThreads, 0, ctx.stream(), flash::forward_kernel<HD, false>)(
      s, qkv, out, softmax_stats, nullptr, nullptr, attention_scale(s));
  NIBBLE_CUDA_CHECK(cudaGetLastError());
}
template <int HD>
void flash_backward(const AttentionShape& s, const float* qkv, const float* softmax_stats, const float* out,
                    const float* dout, float* dqkv, Context& ctx) {
  DeviceBuffer<float> row_dot(static_cast<size_t>(s.batch * s.heads * s.seq), ctx.stream());
  const float scale = attention_scale(s);
  if (out) {
    NIBBLE_LAUNCH(grid_of(s.batch * s.heads * s.seq, flash::kThreads / 4, ctx), flash::kThreads, 0, ctx.stream(),
                  flash::row_dot_kernel<HD>)(s, out, dout, row_dot.data());
  } else {
    NIBBLE_LAUNCH(flash_blocks(s, s.heads), flash::kThreads, 0, ctx.stream(), flash::forward_kernel<HD, true>)(
        s, qkv, nullptr, nullptr, dout, row_dot.data(), scale);
  }
  NIBBLE_CUDA_CHECK(cudaGetLastError());
  NIBBLE_LAUNCH(flash_blocks(s, s.kv_heads), flash::kThreads, 0, ctx.stream(), flash::backward_kv_kernel<HD>)(
      s, qkv, softmax_stats, dout, static_cast<const float*>(row_dot.data()), dqkv, scale);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
  NIBBLE_LAUNCH(flash_blocks(s, s.heads), flash::kThreads, 0, ctx.stream(), flash::backward_q_kernel<HD>)(
      s, qkv, softmax_stats, dout, static_cast<const float*>(row_dot.data()), dqkv, scale);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
}

// FP32 attention at head_dim 32 or 64: the CPU's bits from row-per-thread kernels that stage the other
// side's rows in shared memory (attention_fp32.cuh).
template <int HD>
void fp32_forward(const AttentionShape& s, const float* qkv, float* out, float* softmax_stats, Context& ctx) {
  NIBBLE_LAUNCH(fp32_attention_blocks(s, s.heads), fp32_attention::kRows, 0, ctx.stream(),
                fp32_attention::forward_kernel<HD>)(s, qkv, out, softmax_stats, attention_scale(s));
  NIBBLE_CUDA_CHECK(cudaGetLastError());
}
template <int HD>
void fp32_backward(const AttentionShape& s, const float* qkv, const float* softmax_stats, const float* dout,
                   float* dqkv, Context& ctx) {
  DeviceBuffer<float> row_dot(static_cast<size_t>(s.batch * s.heads * s.seq), ctx.stream());
  const float scale = attention_scale(s);
  NIBBLE_LAUNCH(fp32_attention_blocks(s, s.heads), fp32_attention::kRows, 0, ctx.stream(),
                fp32_attention::backward_query_kernel<HD>)(s, qkv, softmax_stats, dout, dqkv, row_dot.data(), scale);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
  const float* dots = row_dot.data();
  NIBBLE_LAUNCH(fp32_attention_blocks(s, s.kv_heads), fp32_attention::kRows, 0, ctx.stream(),
                fp32_attention::backward_key_kernel<HD, false>)(s, qkv, softmax_stats, dout, dots, dqkv, scale);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
  NIBBLE_LAUNCH(fp32_attention_blocks(s, s.kv_heads), fp32_attention::kRows, 0, ctx.stream(),
                fp32_attention::backward_key_kernel<HD, true>)(s, qkv, softmax_stats, dout, dots, dqkv, scale);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
}

void attention_forward(const AttentionShape& s, const float* qkv, float* out, float* softmax_stats, Context& ctx) {
  if (flash::supports(checked(s), ctx.device().cc_major)) {
    if (s.head_dim == 64) return flash_forward<64>(s, qkv, out, softmax_stats, ctx);
    return flash_forward<32>(s, qkv, out, softmax_stats, ctx);
  }
  if (fp32_attention::supports(s)) {
    if (s.head_dim == 64) return fp32_forward<64>(s, qkv, out, softmax_stats, ctx);
    return fp32_forward<32>(s, qkv, out, softmax_stats, ctx);
  }
  launch(s.batch * s.heads * s.seq, ctx, attention_forward_kernel, s, qkv, out, softmax_stats, attention_scale(s));
}
bool attention_backward_takes_output(const AttentionShape& s, const Context& ctx) {
  return flash::supports(checked(s), ctx.device().cc_major);
}
void attention_backward(const AttentionShape& s, const float* qkv, const float* softmax_stats, const float* dout,
                        float* dqkv, Context& ctx, const float* out) {
  if (flash::supports(checked(s), ctx.device().cc_major)) {
    if (s.head_dim == 64) return flash_backward<64>(s, qkv, softmax_stats, out, dout, dqkv, ctx);
    return flash_backward<32>(s, qkv, softmax_stats, out, dout, dqkv, ctx);
  }
  if (fp32_attention::supports(s)) {
    if (s.head_dim == 64) return fp32_backward<64>(s, qkv, softmax_stats, dout, dqkv, ctx);
    return fp32_backward<32>(s, qkv, softmax_stats, dout, dqkv, ctx);
  }
  DeviceBuffer<float> row_dot(static_cast<size_t>(s.batch * s.heads * s.seq), ctx.stream());
  launch(s.batch * s.heads * s.seq, ctx, attention_backward_query_kernel, s, qkv, softmax_stats, dout, dqkv,
         row_dot.data(), attention_scale(s));
  launch(s.batch * s.kv_heads * s.seq, ctx, attention_backward_key_kernel, s, qkv, softmax_stats, dout, dqkv,
         static_cast<const float*>(row_dot.data()), attention_scale(s));
}
void attention_decode(const AttentionShape& s, int64_t past, const float* qkv, float* k_cache, float* v_cache,
                      float* out, Context& ctx) {
  NIBBLE_CHECK(s.batch == 1 && !s.bf16_matmuls, "attention_decode: one sequence (batch 1) in FP32");
  launch(s.seq * s.kv_heads * s.head_dim, ctx, kv_append_kernel, checked(s), past, qkv, k_cache, v_cache);
  launch(s.seq * s.heads, ctx, attention_decode_kernel, s, past, qkv, static_cast<const float*>(k_cache),
         static_cast<const float*>(v_cache), out, attention_scale(s));
}
void swiglu_forward(const float* gate_up, int64_t n, int64_t hidden, float* a, Context& ctx) {
  launch(n * hidden, ctx, swiglu_forward_kernel, gate_up, n, hidden, a);
}
void swiglu_backward(const float* gate_up, const float* da, int64_t n, int64_t hidden, float* dgate_up, Context& ctx) {
  launch(n * hidden, ctx, swiglu_backward_kernel, gate_up, da, n, hidden, dgate_up);
}
double cross_entropy_forward(const float* logits, const int32_t* targets, int64_t n, int64_t vocab, float* loss,
                             Context& ctx, float* row_stats) {
  if (n <= 0) return 0.0;
  NIBBLE_LAUNCH(grid_of(n, kRowsPerBlock, ctx), kThreads, 0, ctx.stream(), cross_entropy_forward_kernel)(logits, targets, n, vocab, loss, row_stats);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
  std::vector<float> host(static_cast<size_t>(n));
  NIBBLE_CUDA_CHECK(cudaMemcpyAsync(host.data(), loss, host.size() * sizeof(float), cudaMemcpyDeviceToHost, ctx.stream()));
  ctx.synchronize();
  double total = 0;
  for (float l : host) total += static_cast<double>(l);
  return total;
}
void cross_entropy_backward(const float* logits, const int32_t* targets, int64_t n, int64_t vocab, float scale,
                            float* dlogits, Context& ctx) {
  if (n <= 0) return;
  NIBBLE_LAUNCH(grid_of(n, kRowsPerBlock, ctx), kThreads, 0, ctx.stream(), cross_entropy_backward_kernel)(logits, targets, n, vocab, scale, dlogits);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
}
void cross_entropy_backward_kept(const float* logits, const int32_t* targets, int64_t n, int64_t vocab, float scale,
                                 const float* row_stats, float* dlogits, Context& ctx) {
  if (n <= 0) return;
  launch(n * vocab, ctx, cross_entropy_backward_kept_kernel, logits, targets, n, vocab, scale, row_stats, dlogits);
}

std::vector<double> sum_of_squares_by_chunk(const float* g, int64_t n, Context& ctx) {
  const int64_t chunks = (n + lm::kSumOfSquaresChunk - 1) / lm::kSumOfSquaresChunk;
  if (chunks == 0) return {};
  DeviceBuffer<double> partial(static_cast<size_t>(chunks), ctx.stream());
  NIBBLE_LAUNCH(grid_of(chunks, kWarpsPerBlock, ctx), kThreads, 0, ctx.stream(), sum_of_squares_kernel)(g, n, chunks, partial.data());
  NIBBLE_CUDA_CHECK(cudaGetLastError());
  return partial.download();
}
double sum_of_squares(const float* g, int64_t n, Context& ctx) {
  double total = 0;
  for (double p : sum_of_squares_by_chunk(g, n, ctx)) total += p;  // in chunk order, as the CPU
  return total;
}
void adamw_update(const AdamWArgs& k, const float* g, float* m, float* v, float* w, const uint8_t* decay_mask, int64_t n,
                  Context& ctx) {
  launch(n, ctx, adamw_kernel, lm::AdamWScalars{k.clip, k.b1, k.b2, k.bias1, k.bias2, k.decay, k.lr, k.eps}, g, m, v, w,
         decay_mask, n);
}

}  // namespace nibble::cuda
