// Causal GQA attention in FP32 (recipe none: bf16_matmuls false) at head_dim 32 or 64, with the CPU
// kernel's bits: every output is layer_math.h's row function (attention_forward_row,
// attention_backward_query_row, attention_backward_key_row) in its operation order, so each thread
// still owns one query (or key) row and walks the keys (or queries) in order. What changes is where
// the operands live: the row's own vectors (q, dO, k, v) and its accumulators (o, dq, dk, dv) stay in
// registers, written once at the end, and the other side's rows are staged 32 at a time into shared
// memory by the whole block, whose 128 threads are consecutive rows of one (sequence, head): they all
// need the same keys, so a staged row is read by every lane at once (a broadcast). lane_sum16's 16
// partial sums are registers too: tiles start at multiples of 32, so key j's lane j % 16 is fixed
// per unrolled step.
//
// Backward: the query pass (D = row_dot and dQ) as before, then dV and dK as two kernels (a key row's
// k, v, dk and dv together would not fit in registers): dV recomputes P, dK recomputes P and dP.
#pragma once
#include <cmath>
#include <cstdint>

#include "format/attention_shape.h"
#include "kernels/cuda/device_math.h"
#include "kernels/cuda/layer_math.h"

namespace nibble::cuda::fp32_attention {

constexpr int kRows = 128;  // rows per block, a thread each
constexpr int kStaged = 32;  // other-side rows per staged tile (a multiple of 16: lane_sum16's lanes)

inline bool supports(const AttentionShape& s) { return !s.bf16_matmuls && (s.head_dim == 32 || s.head_dim == 64); }
NIBBLE_HD int64_t tiles(const AttentionShape& s) { return (s.seq + kRows - 1) / kRows; }

// Rows [r0, r0 + 32) of the HD columns at `src` (a [rows, stride] matrix) into tile; rows past
// `count` as zeros (never read: every use is guarded by the causal bound).
template <int HD>
__device__ void stage(const float* src, int64_t stride, int64_t r0, int64_t count, float (*tile)[HD]) {
  for (int e = static_cast<int>(threadIdx.x); e < kStaged * HD; e += kRows) {
    const int r = e / HD, c = e % HD;
    tile[r][c] = r0 + r < count ? src[(r0 + r) * stride + c] : 0.0f;
  }
}
// The keys (and values, when `values` is given) of rows [k0, k0 + 32), once every row of the block is
// done with the previous tile.
template <int HD>
__device__ void restage(const float* kcol, const float* vcol, int64_t stride, int64_t k0, int64_t count,
                        float (*keys)[HD], float (*values)[HD]) {
  __syncthreads();  // every row is done with the previous tile
  stage<HD>(kcol, stride, k0, count, keys);
  if (values != nullptr) stage<HD>(vcol, stride, k0, count, values);
  __syncthreads();
}
template <int HD>
__device__ void load_row(const float* src, bool valid, float (&row)[HD]) {
  NIBBLE_UNROLL
  for (int i = 0; i < HD; ++i) row[i] = valid ? src[i] : 0.0f;
}
// attention_dot (FP32 operands): d = fma(a_i, b_i, d) for i ascending.
template <int HD>
__device__ __forceinline__ float dot(const float (&a)[HD], const float* b) {
  float d = 0.0f;
  NIBBLE_UNROLL
  for (int i = 0; i < HD; ++i) d = dm::nb_fma(a[i], b[i], d);
  return d;
}
// lane_sum16's fold of its 16 partial sums.
__device__ __forceinline__ float fold16(float (&lanes)[16]) {
  NIBBLE_UNROLL
  for (int half = 8; half >= 1; half /= 2)
    NIBBLE_UNROLL
    for (int l = 0; l < half; ++l) lanes[l] = dm::nb_add(lanes[l], lanes[l + half]);
  return lanes[0];
}

// The block's (sequence, head, tile): the longest tiles first. Query tiles end at their last row, so
// the longest are the last; key tiles see the queries at or after them, so the longest are the first.
struct RowBlock {
  int64_t b, h, tile;
};
__device__ __forceinline__ RowBlock row_block(const AttentionShape& s, int64_t heads, bool longest_last) {
  const int64_t n = tiles(s), item = blockIdx.x;
  return {item / n / heads, item / n % heads, longest_last ? n - 1 - item % n : item % n};
}

// This thread's query row t of its block's (sequence b, head h), the block's last row (its keys run
// 0..last), the row's index in stats and row_dot, and where the sequence's rows and its key and
// value head start.
struct QueryRow {
  int64_t b, h, t, last, row;
  bool valid;
  const float *base, *keys, *values;
};
template <int HD>
__device__ __forceinline__ QueryRow query_row(const AttentionShape& s, const float* qkv) {
  const RowBlock rb = row_block(s, s.heads, true);
  const int64_t S = s.seq, kv = rb.h / s.group(), end = (rb.tile + 1) * kRows < S ? (rb.tile + 1) * kRows : S;
  const int64_t t = rb.tile * kRows + threadIdx.x;
  const float* base = qkv + rb.b * S * s.qkv_stride();
  return {rb.b,     rb.h, t, end - 1, (rb.b * s.heads + rb.h) * S + t, t < S, base, base + (s.heads + kv) * HD,
          base + (s.heads + s.kv_heads + kv) * HD};
}

// ------------------------------------------------------------------ forward -----------------------
// attention_forward_row for rows t = 128 tile + threadIdx.x of (b, h): the max over its scores, their
// exp's sum in lane_sum16's order, then O = sum_j P_tj V_j; three walks over the keys 0..t.
template <int HD>
__global__ void __launch_bounds__(kRows) forward_kernel(AttentionShape s, const float* qkv, float* out, float* stats,
                                                        float scale) {
  __shared__ float keys[kStaged][HD], values[kStaged][HD];
  const QueryRow r = query_row<HD>(s, qkv);
  const int64_t S = s.seq, stride = s.qkv_stride(), t = r.t, last = r.last;
  const bool valid = r.valid;
  const float *kcol = r.keys, *vcol = r.values;
  float q[HD];
  load_row(r.base + t * stride + r.h * HD, valid, q);
  float maxv = -INFINITY;
  for (int64_t k0 = 0; k0 <= last; k0 += kStaged) {
    restage<HD>(kcol, vcol, stride, k0, S, keys, nullptr);
    for (int jj = 0; jj < kStaged; ++jj)
      if (valid && k0 + jj <= t) maxv = dm::max_f(maxv, dm::nb_mul(dot(q, keys[jj]), scale));
  }
  float lanes[16] = {};
  for (int64_t k0 = 0; k0 <= last; k0 += kStaged) {
    restage<HD>(kcol, vcol, stride, k0, S, keys, nullptr);
    NIBBLE_UNROLL
    for (int jj = 0; jj < kStaged; ++jj)
      if (valid && k0 + jj <= t)
        lanes[jj % 16] = dm::nb_add(lanes[jj % 16], lm::nb_exp(dm::nb_sub(dm::nb_mul(dot(q, keys[jj]), scale), maxv)));
  }
  const float inverse = dm::nb_div(1.0f, fold16(lanes));
  float o[HD] = {};
  for (int64_t k0 = 0; k0 <= last; k0 += kStaged) {
    restage<HD>(kcol, vcol, stride, k0, S, keys, values);
    for (int jj = 0; jj < kStaged; ++jj) {
      if (!valid || k0 + jj > t) continue;
      const float p =
          dm::nb_mul(lm::nb_exp(dm::nb_sub(dm::nb_mul(dot(q, keys[jj]), scale), maxv)), inverse);
      NIBBLE_UNROLL
      for (int i = 0; i < HD; ++i) o[i] = dm::nb_fma(p, values[jj][i], o[i]);
    }
  }
  if (!valid) return;
  float* orow = out + (r.b * S + t) * s.out_width() + r.h * HD;
  NIBBLE_UNROLL
  for (int i = 0; i < HD; ++i) orow[i] = o[i];
  stats[2 * r.row] = maxv;
  stats[2 * r.row + 1] = inverse;
}

// ------------------------------------------------------------------ backward ----------------------
// attention_backward_query_row: D_t = sum_j P_tj dP_tj (lane_sum16's order) into row_dot, then
// dQ_t = sum_j dS_tj K_j.
template <int HD>
__global__ void __launch_bounds__(kRows) backward_query_kernel(AttentionShape s, const float* qkv, const float* stats,
                                                               const float* dout, float* dqkv, float* row_dot,
                                                               float scale) {
  __shared__ float keys[kStaged][HD], values[kStaged][HD];
  const QueryRow r = query_row<HD>(s, qkv);
  const int64_t S = s.seq, stride = s.qkv_stride(), t = r.t, last = r.last, row = r.row;
  const bool valid = r.valid;
  const float *kcol = r.keys, *vcol = r.values;
  float q[HD], dO[HD];
  load_row(r.base + t * stride + r.h * HD, valid, q);
  load_row(dout + (r.b * S + t) * s.out_width() + r.h * HD, valid, dO);
  const float row_max = valid ? stats[2 * row] : 0.0f, row_inverse = valid ? stats[2 * row + 1] : 0.0f;
  const auto p_of = [&](const float* k) {
    return dm::nb_mul(lm::nb_exp(dm::nb_sub(dm::nb_mul(dot(q, k), scale), row_max)), row_inverse);
  };
  float lanes[16] = {};
  for (int64_t k0 = 0; k0 <= last; k0 += kStaged) {
    restage<HD>(kcol, vcol, stride, k0, S, keys, values);
    NIBBLE_UNROLL
    for (int jj = 0; jj < kStaged; ++jj)
      if (valid && k0 + jj <= t)
        lanes[jj % 16] = dm::nb_add(lanes[jj % 16], dm::nb_mul(p_of(keys[jj]), dot(dO, values[jj])));
  }
  const float d = fold16(lanes);
  float dq[HD] = {};
  for (int64_t k0 = 0; k0 <= last; k0 += kStaged) {
    restage<HD>(kcol, vcol, stride, k0, S, keys, values);
    for (int jj = 0; jj < kStaged; ++jj) {
      if (!valid || k0 + jj > t) continue;
      const float ds = dm::nb_mul(dm::nb_mul(p_of(keys[jj]), dm::nb_sub(dot(dO, values[jj]), d)), scale);
      NIBBLE_UNROLL
      for (int i = 0; i < HD; ++i) dq[i] = dm::nb_fma(ds, keys[jj][i], dq[i]);
    }
  }
  if (!valid) return;
  row_dot[row] = d;
  float* dqrow = dqkv + (r.b * S + t) * stride + r.h * HD;
  NIBBLE_UNROLL
  for (int i = 0; i < HD; ++i) dqrow[i] = dq[i];
}

// attention_backward_key_row's dV (DK false) or dK (DK true) of key rows j = 128 tile + threadIdx.x of
// key/value head (b, g): the group's query heads in order, each over its queries t >= j in order.
template <int HD, bool DK>
__global__ void __launch_bounds__(kRows) backward_key_kernel(AttentionShape s, const float* qkv, const float* stats,
                                                             const float* dout, const float* row_dot, float* dqkv,
                                                             float scale) {
  __shared__ float queries[kStaged][HD], grads[kStaged][HD];
  __shared__ float query_stats[kStaged][3];  // max, 1/sum, D of each staged query row
  const RowBlock rb = row_block(s, s.kv_heads, false);
  const int64_t S = s.seq, stride = s.qkv_stride(), ow = s.out_width(), first = rb.tile * kRows;
  const int64_t j = first + threadIdx.x;
  const bool valid = j < S;
  const float* base = qkv + rb.b * S * stride;
  const int64_t kcol = (s.heads + rb.h) * HD, vcol = (s.heads + s.kv_heads + rb.h) * HD;
  float k[HD], v[HD], acc[HD] = {};
  load_row(base + j * stride + kcol, valid, k);
  if (DK) load_row(base + j * stride + vcol, valid, v);
  for (int64_t h = rb.h * s.group(); h < (rb.h + 1) * s.group(); ++h)
    for (int64_t q0 = first; q0 < S; q0 += kStaged) {
      __syncthreads();
      stage<HD>(base + h * HD, stride, q0, S, queries);
      stage<HD>(dout + rb.b * S * ow + h * HD, ow, q0, S, grads);
      if (threadIdx.x < kStaged && q0 + threadIdx.x < S) {
        const int64_t row = (rb.b * s.heads + h) * S + q0 + threadIdx.x;
        query_stats[threadIdx.x][0] = stats[2 * row];
        query_stats[threadIdx.x][1] = stats[2 * row + 1];
        query_stats[threadIdx.x][2] = row_dot[row];
      }
      __syncthreads();
      for (int tt = 0; tt < kStaged; ++tt) {
        const int64_t t = q0 + tt;
        if (!valid || t < j || t >= S) continue;
        const float p = dm::nb_mul(
            lm::nb_exp(dm::nb_sub(dm::nb_mul(dot(queries[tt], k), scale), query_stats[tt][0])), query_stats[tt][1]);
        if (DK) {
          const float ds = dm::nb_mul(dm::nb_mul(p, dm::nb_sub(dot(v, grads[tt]), query_stats[tt][2])), scale);
          NIBBLE_UNROLL
          for (int i = 0; i < HD; ++i) acc[i] = dm::nb_fma(ds, queries[tt][i], acc[i]);
        } else {
          NIBBLE_UNROLL
          for (int i = 0; i < HD; ++i) acc[i] = dm::nb_fma(p, grads[tt][i], acc[i]);
        }
      }
    }
  if (!valid) return;
  float* dst = dqkv + (rb.b * S + j) * stride + (DK ? kcol : vcol);
  NIBBLE_UNROLL
  for (int i = 0; i < HD; ++i) dst[i] = acc[i];
}

}  // namespace nibble::cuda::fp32_attention
