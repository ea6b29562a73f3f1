// Causal GQA attention as tiled, flash-style kernels on BF16 tensor cores (mma.h), for shapes with
// bf16_matmuls (the quantized recipes keep attention in BF16) and head_dim 32 or 64; layers.cu keeps
// the per-row kernels (layer_math.h, the CPU's bits) for FP32 attention and other head dims.
//
// Semantics are layer_math.h's: qkv [batch*seq, (heads + 2 kv_heads) head_dim] FP32, query head h
// reads key/value head h / group, score = (Q K^T) scale, causal, softmax stats per query row saved
// as (max, 1/sum), products' operands (Q, K, V, P, dO, dS) rounded to BF16 (nearest even) with FP32
// accumulation. What differs from the CPU is the order of the FP32 additions (the tensor cores' own,
// tiles of 64 keys) and where P is rounded: forward rounds exp(score - running max) before the final
// 1/sum, as FlashAttention does. Bounds on the differences: tests/emulated/test_cuda_model_kernels.cpp.
//
// Tiles: a block of 4 warps takes 64 query rows (forward, dQ) or 64 key rows (dK/dV), 16 per warp,
// and loops over 64-row tiles of the other side staged in shared memory as BF16. Rows of a staged
// tile are padded by 8 BF16 (16 bytes): a row is then 4 banks from the next, so the 32 lanes'
// fragment reads (rows g = 0..7, 32-bit words t = 0..3) hit 32 different banks. Operands that a
// product needs with the other index contiguous are staged transposed as well ([head_dim][64 + 8]).
//
// Backward (FlashAttention-2's split, deterministic, no atomics):
//   pre-pass  D_t = rowsum(bf16(dO_t) * O_t), from O as the forward stored it when attention_backward
//             is given it (row_dot_kernel: a quad per row), else O recomputed by the forward kernel
//             (two of the backward's nine tile products);
//   dK/dV     a block per key tile of a key/value head: the group's query heads in order, each
//             over the query tiles at or past the key tile: P^T = exp(K Q^T scale - max) / sum,
//             dP^T = V dO^T, dS^T = P^T (dP^T - D) scale, dV += P^T dO, dK += dS^T Q;
//   dQ        a block per query tile: over the key tiles up to the diagonal, dQ += dS K.
// Every sum has one fixed order (warp, lane, tile loop), so the bits are the same run to run.
#pragma once
#include <cmath>
#include <cstdint>

#include "format/attention_shape.h"
#include "kernels/cuda/device_math.h"
#include "kernels/cuda/layer_math.h"
#include "kernels/cuda/mma.h"

namespace nibble::cuda::flash {

constexpr int kTile = 64;                   // query or key rows per tile
constexpr int kWarps = kTile / 16;          // a warp per 16 rows (the mma's M)
constexpr int kThreads = 32 * kWarps;
constexpr int kPad = 8;                     // BF16 per padded shared row: consecutive rows 4 banks apart
constexpr int kColumnRow = kTile + kPad;    // row length of a transposed tile [head_dim][64 + 8]
constexpr unsigned kFullWarp = 0xFFFFFFFFu;

// The tiled path: BF16 products, a head_dim it is built for, and BF16 mma.sync (sm_80 and newer).
inline bool supports(const AttentionShape& s, int cc_major) { return tiled_on_gpu(s, cc_major); }
NIBBLE_HD int64_t tiles(const AttentionShape& s) { return (s.seq + kTile - 1) / kTile; }

// Rows [row0, row0 + 64) of the head_dim columns at `src` (a [rows, stride] FP32 matrix) as BF16 into
// `rows` ([64][HD + 8]) and/or transposed into `cols` ([HD][64 + 8]); rows past `count` as zeros.
// Consecutive threads read consecutive columns (coalesced), four at a time (one 16-byte load, two
// conversions of a BF16 pair, one 8-byte store) where `src` and `stride` allow, which is the usual
// case (qkv's columns are whole heads): the staging's instructions, not the tensor cores, bound
// these kernels.
struct alignas(16) FourFloats {
  float v[4];
};
template <int HD>
__device__ void stage_tile(const float* src, int64_t stride, int64_t row0, int64_t count, uint16_t* rows, uint16_t* cols) {
  if (reinterpret_cast<uintptr_t>(src) % 16 != 0 || stride % 4 != 0) {
    for (int i = static_cast<int>(threadIdx.x); i < kTile * HD; i += kThreads) {
      const int r = i / HD, c = i % HD;
      const uint16_t v = dm::bf16_bits_rn(row0 + r < count ? src[(row0 + r) * stride + c] : 0.0f);
      if (rows != nullptr) rows[r * (HD + kPad) + c] = v;
      if (cols != nullptr) cols[c * kColumnRow + r] = v;
    }
    return;
  }
  NIBBLE_UNROLL
  for (int i = static_cast<int>(threadIdx.x); i < kTile * HD / 4; i += kThreads) {
    const int r = i / (HD / 4), c = 4 * (i % (HD / 4));
    FourFloats f = {{0.0f, 0.0f, 0.0f, 0.0f}};
    if (row0 + r < count) f = *reinterpret_cast<const FourFloats*>(src + (row0 + r) * stride + c);
    const uint32_t lo = mma::pack_bf16(f.v[0], f.v[1]), hi = mma::pack_bf16(f.v[2], f.v[3]);
    if (rows != nullptr) {
      uint32_t* dst = reinterpret_cast<uint32_t*>(rows + r * (HD + kPad) + c);  // 8-byte aligned: c % 4 == 0
      dst[0] = lo;
      dst[1] = hi;
    }
    if (cols != nullptr) {
      cols[c * kColumnRow + r] = static_cast<uint16_t>(lo);
      cols[(c + 1) * kColumnRow + r] = static_cast<uint16_t>(lo >> 16);
      cols[(c + 2) * kColumnRow + r] = static_cast<uint16_t>(hi);
      cols[(c + 3) * kColumnRow + r] = static_cast<uint16_t>(hi >> 16);
    }
  }
}

// Two adjacent BF16 of a staged row as one register (the lower index in the low half).
__device__ __forceinline__ uint32_t pair_at(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// The A fragment (mma.h's layout) of rows [row0, row0 + 16) x columns [k0, k0 + 16) of a staged tile
// with rows of `ld` BF16.
__device__ __forceinline__ void a_fragment(const uint16_t* tile, int ld, int row0, int k0, int g, int t, uint32_t a[4]) {
  a[0] = pair_at(tile + (row0 + g) * ld + k0 + 2 * t);
  a[1] = pair_at(tile + (row0 + g + 8) * ld + k0 + 2 * t);
  a[2] = pair_at(tile + (row0 + g) * ld + k0 + 8 + 2 * t);
  a[3] = pair_at(tile + (row0 + g + 8) * ld + k0 + 8 + 2 * t);
}
// The B fragment of B[k][n] = tile[n0 + n][k0 + k] (a staged row is a column of B).
__device__ __forceinline__ void b_fragment(const uint16_t* tile, int ld, int n0, int k0, int g, int t, uint32_t b[2]) {
  b[0] = pair_at(tile + (n0 + g) * ld + k0 + 2 * t);
  b[1] = pair_at(tile + (n0 + g) * ld + k0 + 8 + 2 * t);
}
// The A fragment of a 16 x 16 block held as two accumulators of 16 x 8 (columns 0-7, 8-15): the C
// layout of a product is the A layout of the next one, rounded to BF16.
__device__ __forceinline__ void a_from_accumulators(const float left[4], const float right[4], uint32_t a[4]) {
  a[0] = mma::pack_bf16(left[0], left[1]);
  a[1] = mma::pack_bf16(left[2], left[3]);
  a[2] = mma::pack_bf16(right[0], right[1]);
  a[3] = mma::pack_bf16(right[2], right[3]);
}

// Accumulator element i of a lane: row g + 8 (i / 2) of the warp's 16, column 2t + i % 2 of its 8.
__device__ __forceinline__ int accumulator_row(int g, int i) { return g + 8 * (i / 2); }
__device__ __forceinline__ int accumulator_column(int t, int i) { return 2 * t + i % 2; }

// x reduced over the 4 lanes of a quad (the lanes holding one accumulator row), the same value in each.
__device__ __forceinline__ float quad_max(float x) {
  x = dm::max_f(x, __shfl_xor_sync(kFullWarp, x, 1));
  return dm::max_f(x, __shfl_xor_sync(kFullWarp, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x = dm::nb_add(x, __shfl_xor_sync(kFullWarp, x, 1));
  return dm::nb_add(x, __shfl_xor_sync(kFullWarp, x, 2));
}

// acc[n] (+)= A B over k: A = rows of a staged tile (fragments a[k16]), B from the staged tile `tile`
// whose rows are B's columns: acc[n] covers B's columns 8n..8n+7.
template <int KSTEPS, int NTILES>
__device__ __forceinline__ void multiply(const uint32_t (&a)[KSTEPS][4], const uint16_t* tile, int ld, int g, int t,
                                         float (&acc)[NTILES][4]) {
  NIBBLE_UNROLL
  for (int kk = 0; kk < KSTEPS; ++kk) {
    NIBBLE_UNROLL
    for (int n = 0; n < NTILES; ++n) {
      uint32_t b[2];
      b_fragment(tile, ld, n * 8, kk * 16, g, t, b);
      mma::mma_bf16_16x8x16(acc[n], a[kk], b);
    }
  }
}
// acc[n] += P B where P (16 x 64) is held as 8 accumulators of 16 x 8 and B's 64 rows are the
// columns of the transposed staged tile `cols` ([HD][64 + 8]).
template <int NTILES>
__device__ __forceinline__ void multiply_held(const float (&p)[kTile / 8][4], const uint16_t* cols, int g, int t,
                                              float (&acc)[NTILES][4]) {
  NIBBLE_UNROLL
  for (int kk = 0; kk < kTile / 16; ++kk) {
    uint32_t a[4];
    a_from_accumulators(p[2 * kk], p[2 * kk + 1], a);
    NIBBLE_UNROLL
    for (int n = 0; n < NTILES; ++n) {
      uint32_t b[2];
      b_fragment(cols, kColumnRow, n * 8, kk * 16, g, t, b);
      mma::mma_bf16_16x8x16(acc[n], a, b);
    }
  }
}

// ------------------------------------------------------------------ forward -----------------------
// grid: tiles x heads x batch blocks, the longest query tiles first; block: kThreads.
// ROW_DOT false: O into out [batch*seq, heads*HD], (max, 1/sum) into stats. ROW_DOT true (backward's
// pre-pass): row_dot[(b, h, t)] = sum_i bf16(dO_ti) O_ti instead, O never stored.
template <int HD, bool ROW_DOT>
__global__ void __launch_bounds__(kThreads) forward_kernel(AttentionShape s, const float* qkv, float* out, float* stats,
                                                           const float* dout, float* row_dot, float scale) {
  alignas(16) __shared__ uint16_t q_rows[kTile * (HD + kPad)];
  alignas(16) __shared__ uint16_t k_rows[kTile * (HD + kPad)];
  alignas(16) __shared__ uint16_t v_cols[HD * kColumnRow];
  constexpr int kLd = HD + kPad;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  const int64_t n_tiles = tiles(s), item = blockIdx.x, qt = n_tiles - 1 - item % n_tiles;
  const int64_t h = item / n_tiles % s.heads, b = item / n_tiles / s.heads, kv = h / s.group();
  const int64_t S = s.seq, stride = s.qkv_stride(), q0 = qt * kTile;
  const float* seq_qkv = qkv + b * S * stride;
  stage_tile<HD>(seq_qkv + h * HD, stride, q0, S, q_rows, nullptr);
  __syncthreads();
  uint32_t qa[HD / 16][4];
  NIBBLE_UNROLL
  for (int kk = 0; kk < HD / 16; ++kk) a_fragment(q_rows, kLd, warp * 16, kk * 16, g, t, qa[kk]);
  const int64_t row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  float o[HD / 8][4] = {}, running_max[2] = {-INFINITY, -INFINITY}, sum[2] = {0.0f, 0.0f};
  for (int64_t kt = 0; kt <= qt; ++kt) {  // key tiles up to the diagonal
    __syncthreads();  // every warp is done with the previous key tile
    stage_tile<HD>(seq_qkv + (s.heads + kv) * HD, stride, kt * kTile, S, k_rows, nullptr);
    stage_tile<HD>(seq_qkv + (s.heads + s.kv_heads + kv) * HD, stride, kt * kTile, S, nullptr, v_cols);
    __syncthreads();
    float p[kTile / 8][4] = {};
    multiply(qa, k_rows, kLd, g, t, p);  // scores of the warp's 16 rows x 64 keys
    float tile_max[2] = {running_max[0], running_max[1]};
    NIBBLE_UNROLL
    for (int n = 0; n < kTile / 8; ++n)
      NIBBLE_UNROLL
      for (int i = 0; i < 4; ++i) {
        const int64_t key = kt * kTile + n * 8 + accumulator_column(t, i);
        // Causal: keys past the row are out (and so are the zero-filled keys past seq).
        p[n][i] = key <= row[i / 2] ? dm::nb_mul(p[n][i], scale) : -INFINITY;
        tile_max[i / 2] = dm::max_f(tile_max[i / 2], p[n][i]);
      }
    // Every row sees key kt * 64 <= row in every tile it visits, so the new maximum is finite.
    float rescale[2];
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = quad_max(tile_max[r]);
      rescale[r] = lm::nb_exp(dm::nb_sub(running_max[r], tile_max[r]));  // exp(-inf) = 0 on the first tile
      sum[r] = dm::nb_mul(sum[r], rescale[r]);
      running_max[r] = tile_max[r];
    }
    NIBBLE_UNROLL
    for (int n = 0; n < HD / 8; ++n)
      NIBBLE_UNROLL
      for (int i = 0; i < 4; ++i) o[n][i] = dm::nb_mul(o[n][i], rescale[i / 2]);
    NIBBLE_UNROLL
    for (int n = 0; n < kTile / 8; ++n)
      NIBBLE_UNROLL
      for (int i = 0; i < 4; ++i) {
        p[n][i] = lm::nb_exp(dm::nb_sub(p[n][i], running_max[i / 2]));
        sum[i / 2] = dm::nb_add(sum[i / 2], p[n][i]);  // the lane's share of the row's sum
      }
    multiply_held(p, v_cols, g, t, o);
  }
  float inverse[2], dot[2] = {0.0f, 0.0f};
  for (int r = 0; r < 2; ++r) inverse[r] = dm::nb_div(1.0f, quad_sum(sum[r]));
  const int64_t ow = s.out_width();
  NIBBLE_UNROLL
  for (int n = 0; n < HD / 8; ++n)
    NIBBLE_UNROLL
    for (int i = 0; i < 4; ++i) {
      const int64_t r = row[i / 2], at = (b * S + r) * ow + h * HD + n * 8 + accumulator_column(t, i);
      const float value = dm::nb_mul(o[n][i], inverse[i / 2]);
      if (ROW_DOT) {
        if (r < S) dot[i / 2] = dm::nb_add(dot[i / 2], dm::nb_mul(dm::round_to_bf16(dout[at]), value));
      } else if (r < S) {
        out[at] = value;
      }
    }
  for (int r = 0; r < 2; ++r) {
    const float total = quad_sum(dot[r]);
    const int64_t at = (b * s.heads + h) * S + row[r];
    if (t != 0 || row[r] >= S) continue;
    if (ROW_DOT) {
      row_dot[at] = total;
    } else {
      stats[2 * at] = running_max[r];
      stats[2 * at + 1] = inverse[r];
    }
  }
}

// The backward's pre-pass from O as the forward stored it (attention_backward given `out`): D of each
// query row in forward_kernel<HD, true>'s order (lane t of a quad adds columns n * 8 + 2t, then
// n * 8 + 2t + 1, for n in order, then quad_sum), so the same bits without recomputing O. A quad per
// row; every lane of a warp runs the same turns (the shuffles need the whole warp).
template <int HD>
__global__ void __launch_bounds__(kThreads) row_dot_kernel(AttentionShape s, const float* out, const float* dout,
                                                           float* row_dot) {
  const int t = static_cast<int>(threadIdx.x) % 4;
  const int64_t rows = s.batch * s.heads * s.seq, ow = s.out_width();
  const int64_t quads = static_cast<int64_t>(gridDim.x) * (kThreads / 4);
  const int64_t first = (blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x) / 4;
  for (int64_t turn = 0; turn * quads < rows; ++turn) {
    const int64_t q = first + turn * quads;  // (b, h, row) in row_dot's order
    const bool valid = q < rows;
    float dot = 0.0f;
    if (valid) {
      const int64_t row = q % s.seq, h = q / s.seq % s.heads, b = q / s.seq / s.heads;
      const float* o = out + (b * s.seq + row) * ow + h * HD;
      const float* d = dout + (b * s.seq + row) * ow + h * HD;
      NIBBLE_UNROLL
      for (int n = 0; n < HD / 8; ++n)
        NIBBLE_UNROLL
        for (int i = 0; i < 2; ++i) {
          const int c = n * 8 + accumulator_column(t, i);
          dot = dm::nb_add(dot, dm::nb_mul(dm::round_to_bf16(d[c]), o[c]));
        }
    }
    const float total = quad_sum(dot);
    if (valid && t == 0) row_dot[q] = total;
  }
}

// ------------------------------------------------------------------ backward ----------------------
// P and dS of one (row, key) pair from the score and dP accumulators, layer_math.h's expressions:
// P = exp(score scale - max) / sum, dS = P (dP - D) scale.
struct RowStats {
  float max, inverse, dot;
};
__device__ __forceinline__ RowStats row_stats(const AttentionShape& s, const float* stats, const float* row_dot,
                                               int64_t b, int64_t h, int64_t row) {
  if (row >= s.seq) return {0.0f, 0.0f, 0.0f};  // a zero-filled row past seq: P = 0
  const int64_t at = (b * s.heads + h) * s.seq + row;
  return {stats[2 * at], stats[2 * at + 1], row_dot[at]};
}
__device__ __forceinline__ void probability_and_ds(float& score_to_p, float& dp_to_ds, const RowStats& r, bool visible,
                                                   float scale) {
  const float p = visible ? dm::nb_mul(lm::nb_exp(dm::nb_sub(dm::nb_mul(score_to_p, scale), r.max)), r.inverse) : 0.0f;
  dp_to_ds = dm::nb_mul(dm::nb_mul(p, dm::nb_sub(dp_to_ds, r.dot)), scale);
  score_to_p = p;
}

// dK and dV: grid tiles x kv_heads x batch blocks (the longest key tiles first); warp w owns keys
// 16w..16w+15 of its tile and adds the group's query heads in order, each over its query tiles in order.
template <int HD>
__global__ void __launch_bounds__(kThreads) backward_kv_kernel(AttentionShape s, const float* qkv, const float* stats,
                                                               const float* dout, const float* row_dot, float* dqkv,
                                                               float scale) {
  alignas(16) __shared__ uint16_t q_rows[kTile * (HD + kPad)];  // K first, to take its fragments
  alignas(16) __shared__ uint16_t q_cols[HD * kColumnRow];
  alignas(16) __shared__ uint16_t do_rows[kTile * (HD + kPad)];  // V first
  alignas(16) __shared__ uint16_t do_cols[HD * kColumnRow];
  __shared__ RowStats query_stats[kTile];
  constexpr int kLd = HD + kPad;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  const int64_t n_tiles = tiles(s), item = blockIdx.x, kt = n_tiles - 1 - item % n_tiles;
  const int64_t kv = item / n_tiles % s.kv_heads, b = item / n_tiles / s.kv_heads;
  const int64_t S = s.seq, stride = s.qkv_stride(), ow = s.out_width(), k_col = (s.heads + kv) * HD,
                v_col = (s.heads + s.kv_heads + kv) * HD;
  const float* seq_qkv = qkv + b * S * stride;
  stage_tile<HD>(seq_qkv + k_col, stride, kt * kTile, S, q_rows, nullptr);
  stage_tile<HD>(seq_qkv + v_col, stride, kt * kTile, S, do_rows, nullptr);
  __syncthreads();
  uint32_t ka[HD / 16][4], va[HD / 16][4];
  NIBBLE_UNROLL
  for (int kk = 0; kk < HD / 16; ++kk) {
    a_fragment(q_rows, kLd, warp * 16, kk * 16, g, t, ka[kk]);
    a_fragment(do_rows, kLd, warp * 16, kk * 16, g, t, va[kk]);
  }
  const int64_t key[2] = {kt * kTile + warp * 16 + g, kt * kTile + warp * 16 + g + 8};
  float dk[HD / 8][4] = {}, dv[HD / 8][4] = {};
  for (int64_t h = kv * s.group(); h < (kv + 1) * s.group(); ++h)
    for (int64_t qt = kt; qt < n_tiles; ++qt) {
      __syncthreads();  // every warp is done with the previous query tile (and with K, V's staging)
      stage_tile<HD>(seq_qkv + h * HD, stride, qt * kTile, S, q_rows, q_cols);
      stage_tile<HD>(dout + b * S * ow + h * HD, ow, qt * kTile, S, do_rows, do_cols);
      for (int i = static_cast<int>(threadIdx.x); i < kTile; i += kThreads)
        query_stats[i] = row_stats(s, stats, row_dot, b, h, qt * kTile + i);
      __syncthreads();
      float p[kTile / 8][4] = {}, ds[kTile / 8][4] = {};  // transposed: the warp's 16 keys x 64 queries
      multiply(ka, q_rows, kLd, g, t, p);
      multiply(va, do_rows, kLd, g, t, ds);
      NIBBLE_UNROLL
      for (int n = 0; n < kTile / 8; ++n)
        NIBBLE_UNROLL
        for (int i = 0; i < 4; ++i) {
          const int column = n * 8 + accumulator_column(t, i);
          const int64_t query = qt * kTile + column;
          probability_and_ds(p[n][i], ds[n][i], query_stats[column], key[i / 2] <= query && query < S, scale);
        }
      multiply_held(p, do_cols, g, t, dv);   // dV += P^T dO
      multiply_held(ds, q_cols, g, t, dk);   // dK += dS^T Q
    }
  NIBBLE_UNROLL
  for (int n = 0; n < HD / 8; ++n)
    NIBBLE_UNROLL
    for (int i = 0; i < 4; ++i) {
      const int64_t j = key[i / 2], c = n * 8 + accumulator_column(t, i);
      if (j >= S) continue;
      dqkv[(b * S + j) * stride + k_col + c] = dk[n][i];
      dqkv[(b * S + j) * stride + v_col + c] = dv[n][i];
    }
}

// dQ: grid tiles x heads x batch blocks (the longest query tiles first); warp w owns rows 16w..16w+15
// of its query tile and walks the key tiles up to the diagonal in order.
template <int HD>
__global__ void __launch_bounds__(kThreads) backward_q_kernel(AttentionShape s, const float* qkv, const float* stats,
                                                              const float* dout, const float* row_dot, float* dqkv,
                                                              float scale) {
  alignas(16) __shared__ uint16_t k_rows[kTile * (HD + kPad)];  // Q first, to take its fragments
  alignas(16) __shared__ uint16_t v_rows[kTile * (HD + kPad)];  // dO first
  alignas(16) __shared__ uint16_t k_cols[HD * kColumnRow];
  constexpr int kLd = HD + kPad;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  const int64_t n_tiles = tiles(s), item = blockIdx.x, qt = n_tiles - 1 - item % n_tiles;
  const int64_t h = item / n_tiles % s.heads, b = item / n_tiles / s.heads, kv = h / s.group();
  const int64_t S = s.seq, stride = s.qkv_stride(), ow = s.out_width(), q0 = qt * kTile;
  const float* seq_qkv = qkv + b * S * stride;
  stage_tile<HD>(seq_qkv + h * HD, stride, q0, S, k_rows, nullptr);
  stage_tile<HD>(dout + b * S * ow + h * HD, ow, q0, S, v_rows, nullptr);
  __syncthreads();
  uint32_t qa[HD / 16][4], doa[HD / 16][4];
  NIBBLE_UNROLL
  for (int kk = 0; kk < HD / 16; ++kk) {
    a_fragment(k_rows, kLd, warp * 16, kk * 16, g, t, qa[kk]);
    a_fragment(v_rows, kLd, warp * 16, kk * 16, g, t, doa[kk]);
  }
  const int64_t row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  const RowStats mine[2] = {row_stats(s, stats, row_dot, b, h, row[0]), row_stats(s, stats, row_dot, b, h, row[1])};
  float dq[HD / 8][4] = {};
  for (int64_t kt = 0; kt <= qt; ++kt) {
    __syncthreads();  // every warp is done with the previous key tile (and with Q, dO's staging)
    stage_tile<HD>(seq_qkv + (s.heads + kv) * HD, stride, kt * kTile, S, k_rows, k_cols);
    stage_tile<HD>(seq_qkv + (s.heads + s.kv_heads + kv) * HD, stride, kt * kTile, S, v_rows, nullptr);
    __syncthreads();
    float p[kTile / 8][4] = {}, ds[kTile / 8][4] = {};
    multiply(qa, k_rows, kLd, g, t, p);
    multiply(doa, v_rows, kLd, g, t, ds);
    NIBBLE_UNROLL
    for (int n = 0; n < kTile / 8; ++n)
      NIBBLE_UNROLL
      for (int i = 0; i < 4; ++i) {
        const int64_t key = kt * kTile + n * 8 + accumulator_column(t, i);
        probability_and_ds(p[n][i], ds[n][i], mine[i / 2], key <= row[i / 2] && row[i / 2] < S, scale);
      }
    multiply_held(ds, k_cols, g, t, dq);  // dQ += dS K
  }
  NIBBLE_UNROLL
  for (int n = 0; n < HD / 8; ++n)
    NIBBLE_UNROLL
    for (int i = 0; i < 4; ++i)
      if (row[i / 2] < S) dqkv[(b * S + row[i / 2]) * stride + h * HD + n * 8 + accumulator_column(t, i)] = dq[n][i];
}

}  // namespace nibble::cuda::flash
