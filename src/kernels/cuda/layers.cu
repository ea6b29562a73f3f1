// The model's layers on the GPU (layers.h). One thread per output row or element, each output summed
// in a fixed order by one thread: deterministic, no atomics. The per-row arithmetic of RMSNorm, RoPE,
// AdamW and the gradient norm is layer_math.h's (the CPU's operation order).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/layer_math.h"
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
  kernel<<<grid_for(n, ctx), kThreads, 0, ctx.stream()>>>(args...);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
}

__device__ float bf16_operand(float x, bool bf16) { return bf16 ? dm::round_to_bf16(x) : x; }

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

// One output byte of the transposed codes (two rows of the source column), or one scale.
__global__ void transpose_tiles_kernel(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols,
                                       uint8_t* t_codes, uint8_t* t_scales) {
  const int64_t t_row_bytes = rows / 2, n_bytes = cols * t_row_bytes;
  NIBBLE_GRID_STRIDE(i, n_bytes) {
    const int64_t c = i / t_row_bytes, r = (i % t_row_bytes) * 2;  // transposed row c, columns r and r + 1
    auto code = [&](int64_t row) {
      const uint8_t byte = codes[row * (cols / 2) + c / 2];
      return static_cast<uint8_t>((c % 2) ? byte >> 4 : byte & 0x0F);
    };
    t_codes[i] = static_cast<uint8_t>(code(r) | (code(r + 1) << 4));
  }
  const int64_t n_scales = cols * (rows / 16);
  NIBBLE_GRID_STRIDE(i, n_scales) {
    const int64_t c = i / (rows / 16), b = i % (rows / 16);
    t_scales[i] = scales[(b * 16) * (cols / 16) + c / 16];
  }
}

// ------------------------------------------------------------------ layers ------------------------
__global__ void embedding_forward_kernel(const int32_t* tokens, int64_t n, const float* table, int64_t width, float* out) {
  NIBBLE_GRID_STRIDE(i, n * width) out[i] = table[static_cast<int64_t>(tokens[i / width]) * width + i % width];
}
// One thread per column, tokens in order (the CPU's order).
__global__ void embedding_backward_kernel(const int32_t* tokens, int64_t n, const float* dout, int64_t width, float* dtable) {
  NIBBLE_GRID_STRIDE(c, width)
  for (int64_t i = 0; i < n; ++i) {
    float* d = dtable + static_cast<int64_t>(tokens[i]) * width + c;
    *d = dm::nb_add(*d, dout[i * width + c]);
  }
}

__global__ void rmsnorm_forward_kernel(const float* x, const float* gain, int64_t n, int64_t width, float eps, float* y,
                                       float* rstd) {
  NIBBLE_GRID_STRIDE(i, n) rstd[i] = lm::rmsnorm_row_forward(x + i * width, gain, width, eps, y + i * width);
}
__global__ void rmsnorm_backward_rows_kernel(const float* x, const float* gain, const float* rstd, const float* dy,
                                             int64_t n, int64_t width, float* dx) {
  NIBBLE_GRID_STRIDE(i, n) lm::rmsnorm_row_backward(x + i * width, gain, rstd[i], dy + i * width, width, dx + i * width);
}
__global__ void rmsnorm_gain_kernel(const float* x, const float* rstd, const float* dy, int64_t n, int64_t width,
                                    float* dgain) {
  NIBBLE_GRID_STRIDE(c, width) lm::rmsnorm_gain_column(x, rstd, dy, n, width, c, dgain);
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

// Scores of query row t against key j: scale * (q . k) as an FMA chain in k order (the CPU's product).
__device__ float score(const float* q, const float* k, int64_t hd, bool bf16, float scale) {
  float dot = 0.0f;
  for (int64_t i = 0; i < hd; ++i) dot = fmaf(bf16_operand(q[i], bf16), bf16_operand(k[i], bf16), dot);
  return dm::nb_mul(dot, scale);
}

// One thread per (sequence, head, query row): max and sum of the row's exponentials, then O = P V.
__global__ void attention_forward_kernel(DeviceAttentionShape s, const float* qkv, float* out, float* stats, float scale) {
  const int64_t S = s.seq, hd = s.head_dim, stride = s.qkv_stride(), ow = s.heads * hd, group = s.heads / s.kv_heads;
  NIBBLE_GRID_STRIDE(row, s.batch * s.heads * S) {
    const int64_t b = row / (s.heads * S), h = (row / S) % s.heads, t = row % S;
    const float* base = qkv + b * S * stride;
    const float* q = base + t * stride + h * hd;
    const int64_t kcol = (s.heads + h / group) * hd, vcol = (s.heads + s.kv_heads + h / group) * hd;
    float maxv = -INFINITY;
    for (int64_t j = 0; j <= t; ++j) maxv = fmaxf(maxv, score(q, base + j * stride + kcol, hd, s.bf16_matmuls, scale));
    float sum = 0.0f;
    for (int64_t j = 0; j <= t; ++j)
      sum = dm::nb_add(sum, expf(dm::nb_sub(score(q, base + j * stride + kcol, hd, s.bf16_matmuls, scale), maxv)));
    const float inv_sum = dm::nb_div(1.0f, sum);
    stats[row * 2] = maxv;
    stats[row * 2 + 1] = inv_sum;
    float* o = out + (b * S + t) * ow + h * hd;
    for (int64_t i = 0; i < hd; ++i) o[i] = 0.0f;
    for (int64_t j = 0; j <= t; ++j) {
      const float p = bf16_operand(
          dm::nb_mul(expf(dm::nb_sub(score(q, base + j * stride + kcol, hd, s.bf16_matmuls, scale), maxv)), inv_sum),
          s.bf16_matmuls);
      const float* v = base + j * stride + vcol;
      for (int64_t i = 0; i < hd; ++i) o[i] = fmaf(p, bf16_operand(v[i], s.bf16_matmuls), o[i]);
    }
  }
}

// P[t][j] from the saved (max, 1/sum), as forward computed it.
__device__ float probability(const float* q, const float* k, int64_t hd, bool bf16, float scale, const float* stats) {
  return dm::nb_mul(expf(dm::nb_sub(score(q, k, hd, bf16, scale), stats[0])), stats[1]);
}
__device__ float dot_product(const float* a, const float* b, int64_t hd, bool bf16) {
  float d = 0.0f;
  for (int64_t i = 0; i < hd; ++i) d = fmaf(bf16_operand(a[i], bf16), bf16_operand(b[i], bf16), d);
  return d;
}

// Backward, per query row: D_t = sum_j P_tj dP_tj (saved for the key-row kernel) and
// dQ_t = sum_j dS_tj K_j with dS_tj = P_tj (dP_tj - D_t) scale, dP_tj = dO_t . V_j.
__global__ void attention_backward_query_kernel(DeviceAttentionShape s, const float* qkv, const float* stats,
                                                const float* dout, float* dqkv, float* row_dot, float scale) {
  const int64_t S = s.seq, hd = s.head_dim, stride = s.qkv_stride(), ow = s.heads * hd, group = s.heads / s.kv_heads;
  const bool bf = s.bf16_matmuls;
  NIBBLE_GRID_STRIDE(row, s.batch * s.heads * S) {
    const int64_t b = row / (s.heads * S), h = (row / S) % s.heads, t = row % S;
    const float* base = qkv + b * S * stride;
    const float* q = base + t * stride + h * hd;
    const float* dO = dout + (b * S + t) * ow + h * hd;
    const int64_t kcol = (s.heads + h / group) * hd, vcol = (s.heads + s.kv_heads + h / group) * hd;
    float d = 0.0f;
    for (int64_t j = 0; j <= t; ++j) {
      const float p = probability(q, base + j * stride + kcol, hd, bf, scale, stats + row * 2);
      d = dm::nb_add(d, dm::nb_mul(p, dot_product(dO, base + j * stride + vcol, hd, bf)));
    }
    row_dot[row] = d;
    float* dq = dqkv + (b * S + t) * stride + h * hd;
    for (int64_t i = 0; i < hd; ++i) dq[i] = 0.0f;
    for (int64_t j = 0; j <= t; ++j) {
      const float* k = base + j * stride + kcol;
      const float p = probability(q, k, hd, bf, scale, stats + row * 2);
      const float ds = bf16_operand(
          dm::nb_mul(dm::nb_mul(p, dm::nb_sub(dot_product(dO, base + j * stride + vcol, hd, bf), d)), scale), bf);
      for (int64_t i = 0; i < hd; ++i) dq[i] = fmaf(ds, bf16_operand(k[i], bf), dq[i]);
    }
  }
}

// Backward, per key row j of a key/value head: dK_j = sum_h sum_{t >= j} dS_tj Q_t and
// dV_j = sum_h sum_{t >= j} P_tj dO_t over the group's query heads, heads then rows in order.
__global__ void attention_backward_key_kernel(DeviceAttentionShape s, const float* qkv, const float* stats,
                                              const float* dout, float* dqkv, const float* row_dot, float scale) {
  const int64_t S = s.seq, hd = s.head_dim, stride = s.qkv_stride(), ow = s.heads * hd, group = s.heads / s.kv_heads;
  const bool bf = s.bf16_matmuls;
  NIBBLE_GRID_STRIDE(krow, s.batch * s.kv_heads * S) {
    const int64_t b = krow / (s.kv_heads * S), g = (krow / S) % s.kv_heads, j = krow % S;
    const float* base = qkv + b * S * stride;
    const int64_t kcol = (s.heads + g) * hd, vcol = (s.heads + s.kv_heads + g) * hd;
    const float* k = base + j * stride + kcol;
    const float* v = base + j * stride + vcol;
    float* dk = dqkv + (b * S + j) * stride + kcol;
    float* dv = dqkv + (b * S + j) * stride + vcol;
    for (int64_t i = 0; i < hd; ++i) dk[i] = dv[i] = 0.0f;
    for (int64_t h = g * group; h < (g + 1) * group; ++h)
      for (int64_t t = j; t < S; ++t) {
        const int64_t row = (b * s.heads + h) * S + t;
        const float* q = base + t * stride + h * hd;
        const float* dO = dout + (b * S + t) * ow + h * hd;
        const float p = probability(q, k, hd, bf, scale, stats + row * 2);
        const float ds =
            bf16_operand(dm::nb_mul(dm::nb_mul(p, dm::nb_sub(dot_product(dO, v, hd, bf), row_dot[row])), scale), bf);
        const float pb = bf16_operand(p, bf);
        for (int64_t i = 0; i < hd; ++i) {
          dk[i] = fmaf(ds, bf16_operand(q[i], bf), dk[i]);
          dv[i] = fmaf(pb, bf16_operand(dO[i], bf), dv[i]);
        }
      }
  }
}

__global__ void kv_append_kernel(DeviceAttentionShape s, int64_t past, const float* qkv, float* k_cache, float* v_cache) {
  const int64_t kv_width = s.kv_heads * s.head_dim, stride = s.qkv_stride(), first = s.heads * s.head_dim;
  NIBBLE_GRID_STRIDE(e, s.seq * kv_width) {
    const int64_t t = e / kv_width, c = e % kv_width;
    k_cache[(past + t) * kv_width + c] = qkv[t * stride + first + c];
    v_cache[(past + t) * kv_width + c] = qkv[t * stride + first + kv_width + c];
  }
}
// One thread per (new token, head): kernels/cpu/attention_decode.cpp's loops.
__global__ void attention_decode_kernel(DeviceAttentionShape s, int64_t past, const float* qkv, const float* k_cache,
                                        const float* v_cache, float* out, float scale) {
  const int64_t H = s.heads, hd = s.head_dim, kv_width = s.kv_heads * hd, stride = s.qkv_stride(), group = H / s.kv_heads;
  NIBBLE_GRID_STRIDE(e, s.seq * H) {
    const int64_t t = e / H, h = e % H, g = h / group, last = past + t;
    const float* q = qkv + t * stride + h * hd;
    auto sc = [&](int64_t j) {
      float dot = 0.0f;
      for (int64_t i = 0; i < hd; ++i) dot = dm::nb_add(dot, dm::nb_mul(q[i], k_cache[j * kv_width + g * hd + i]));
      return dm::nb_mul(dot, scale);
    };
    float maxv = -INFINITY;
    for (int64_t j = 0; j <= last; ++j) maxv = fmaxf(maxv, sc(j));
    float sum = 0.0f;
    for (int64_t j = 0; j <= last; ++j) sum = dm::nb_add(sum, expf(dm::nb_sub(sc(j), maxv)));
    float* o = out + t * H * hd + h * hd;
    for (int64_t i = 0; i < hd; ++i) o[i] = 0.0f;
    for (int64_t j = 0; j <= last; ++j) {
      const float p = dm::nb_div(expf(dm::nb_sub(sc(j), maxv)), sum);
      for (int64_t i = 0; i < hd; ++i) o[i] = dm::nb_add(o[i], dm::nb_mul(p, v_cache[j * kv_width + g * hd + i]));
    }
  }
}

__global__ void swiglu_forward_kernel(const float* gate_up, int64_t n, int64_t hidden, float* a) {
  NIBBLE_GRID_STRIDE(e, n * hidden) {
    const int64_t i = e / hidden, c = e % hidden;
    const float g = gate_up[i * 2 * hidden + c], u = gate_up[i * 2 * hidden + hidden + c];
    a[e] = dm::nb_mul(dm::nb_div(g, dm::nb_add(1.0f, expf(-g))), u);
  }
}
__global__ void swiglu_backward_kernel(const float* gate_up, const float* da, int64_t n, int64_t hidden, float* dgate_up) {
  NIBBLE_GRID_STRIDE(e, n * hidden) {
    const int64_t i = e / hidden, c = e % hidden;
    const float g = gate_up[i * 2 * hidden + c], u = gate_up[i * 2 * hidden + hidden + c], d = da[e];
    const float sig = dm::nb_div(1.0f, dm::nb_add(1.0f, expf(-g)));
    const float silu = dm::nb_mul(g, sig);
    dgate_up[i * 2 * hidden + c] =
        dm::nb_mul(dm::nb_mul(dm::nb_mul(d, u), sig), dm::nb_add(1.0f, dm::nb_mul(g, dm::nb_sub(1.0f, sig))));
    dgate_up[i * 2 * hidden + hidden + c] = dm::nb_mul(d, silu);
  }
}

__global__ void cross_entropy_forward_kernel(const float* logits, const int32_t* targets, int64_t n, int64_t vocab,
                                             float* loss) {
  NIBBLE_GRID_STRIDE(i, n) {
    const float* l = logits + i * vocab;
    float m = l[0];
    for (int64_t v = 1; v < vocab; ++v) m = fmaxf(m, l[v]);
    float sum = 0.0f;
    for (int64_t v = 0; v < vocab; ++v) sum = dm::nb_add(sum, expf(dm::nb_sub(l[v], m)));
    loss[i] = dm::nb_sub(dm::nb_add(logf(sum), m), l[targets[i]]);
  }
}
// dlogits may alias logits: each element is read before it is written, as on the CPU.
__global__ void cross_entropy_backward_kernel(const float* logits, const int32_t* targets, int64_t n, int64_t vocab,
                                              float scale, float* dlogits) {
  NIBBLE_GRID_STRIDE(i, n) {
    const float* l = logits + i * vocab;
    float* d = dlogits + i * vocab;
    float m = l[0];
    for (int64_t v = 1; v < vocab; ++v) m = fmaxf(m, l[v]);
    float sum = 0.0f;
    for (int64_t v = 0; v < vocab; ++v) {
      d[v] = expf(dm::nb_sub(l[v], m));
      sum = dm::nb_add(sum, d[v]);
    }
    const float inv = dm::nb_div(1.0f, sum);
    for (int64_t v = 0; v < vocab; ++v) d[v] = dm::nb_mul(dm::nb_mul(d[v], inv), scale);
    d[targets[i]] = dm::nb_sub(d[targets[i]], scale);
  }
}

__global__ void sum_of_squares_kernel(const float* g, int64_t n, int64_t chunks, double* partial) {
  NIBBLE_GRID_STRIDE(c, chunks) {
    const int64_t begin = c * lm::kSumOfSquaresChunk, end = begin + lm::kSumOfSquaresChunk < n ? begin + lm::kSumOfSquaresChunk : n;
    partial[c] = lm::sum_of_squares_chunk(g, begin, end);
  }
}
__global__ void adamw_kernel(lm::AdamWScalars k, const float* g, float* m, float* v, float* w, const uint8_t* mask, int64_t n) {
  NIBBLE_GRID_STRIDE(i, n) lm::adamw_element(k, g[i], m + i, v + i, w + i, mask[i]);
}

DeviceAttentionShape checked(const DeviceAttentionShape& s) {
  NIBBLE_CHECK(s.kv_heads > 0 && s.heads % s.kv_heads == 0 && s.head_dim > 0 && s.seq > 0 && s.batch > 0);
  return s;
}
float attention_scale(const DeviceAttentionShape& s) { return 1.0f / std::sqrt(static_cast<float>(s.head_dim)); }

}  // namespace

void add(float* y, const float* x, int64_t n, Context& ctx) { launch(n, ctx, add_kernel, y, x, n); }
void round_to_bf16(const float* x, uint16_t* y, int64_t n, Context& ctx) { launch(n, ctx, round_bf16_kernel, x, y, n); }
void widen_bf16(const uint16_t* x, float* y, int64_t n, Context& ctx) { launch(n, ctx, widen_bf16_kernel, x, y, n); }

void transpose_nvfp4_tiles(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, uint8_t* t_codes,
                           uint8_t* t_scales, Context& ctx) {
  NIBBLE_CHECK(rows % 16 == 0 && cols % 16 == 0);
  launch(rows * cols / 2, ctx, transpose_tiles_kernel, codes, scales, rows, cols, t_codes, t_scales);
}

void embedding_forward(const int32_t* tokens, int64_t n, const float* table, int64_t width, float* out, Context& ctx) {
  launch(n * width, ctx, embedding_forward_kernel, tokens, n, table, width, out);
}
void embedding_backward(const int32_t* tokens, int64_t n, const float* dout, int64_t width, float* dtable, Context& ctx) {
  launch(width, ctx, embedding_backward_kernel, tokens, n, dout, width, dtable);
}
void rmsnorm_forward(const float* x, const float* gain, int64_t n, int64_t width, float eps, float* y, float* rstd,
                     Context& ctx) {
  launch(n, ctx, rmsnorm_forward_kernel, x, gain, n, width, eps, y, rstd);
}
void rmsnorm_backward(const float* x, const float* gain, const float* rstd, const float* dy, int64_t n, int64_t width,
                      float* dx, float* dgain, Context& ctx) {
  launch(n, ctx, rmsnorm_backward_rows_kernel, x, gain, rstd, dy, n, width, dx);
  launch(width, ctx, rmsnorm_gain_kernel, x, rstd, dy, n, width, dgain);
}
void rope(float* x, int64_t tokens, int64_t seq, int64_t stride, int64_t first_col, int64_t heads, int64_t head_dim,
          const float* cos, const float* sin, int64_t first_position, float direction, Context& ctx) {
  launch(tokens * heads * (head_dim / 2), ctx, rope_kernel, x, tokens, seq, stride, first_col, heads, head_dim, cos, sin,
         first_position, direction);
}
void attention_forward(const DeviceAttentionShape& s, const float* qkv, float* out, float* softmax_stats, Context& ctx) {
  launch(s.batch * s.heads * s.seq, ctx, attention_forward_kernel, checked(s), qkv, out, softmax_stats, attention_scale(s));
}
void attention_backward(const DeviceAttentionShape& s, const float* qkv, const float* softmax_stats, const float* dout,
                        float* dqkv, Context& ctx) {
  DeviceBuffer<float> row_dot(static_cast<size_t>(s.batch * s.heads * s.seq), ctx.stream());
  launch(s.batch * s.heads * s.seq, ctx, attention_backward_query_kernel, checked(s), qkv, softmax_stats, dout, dqkv,
         row_dot.data(), attention_scale(s));
  launch(s.batch * s.kv_heads * s.seq, ctx, attention_backward_key_kernel, s, qkv, softmax_stats, dout, dqkv,
         static_cast<const float*>(row_dot.data()), attention_scale(s));
}
void attention_decode(const DeviceAttentionShape& s, int64_t past, const float* qkv, float* k_cache, float* v_cache,
                      float* out, Context& ctx) {
  NIBBLE_CHECK(s.batch == 1 && !s.bf16_matmuls);
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
                             Context& ctx) {
  launch(n, ctx, cross_entropy_forward_kernel, logits, targets, n, vocab, loss);
  std::vector<float> host(static_cast<size_t>(n));
  NIBBLE_CUDA_CHECK(cudaMemcpyAsync(host.data(), loss, host.size() * sizeof(float), cudaMemcpyDeviceToHost, ctx.stream()));
  ctx.synchronize();
  double total = 0;
  for (float l : host) total += static_cast<double>(l);
  return total;
}
void cross_entropy_backward(const float* logits, const int32_t* targets, int64_t n, int64_t vocab, float scale,
                            float* dlogits, Context& ctx) {
  launch(n, ctx, cross_entropy_backward_kernel, logits, targets, n, vocab, scale, dlogits);
}

double sum_of_squares(const float* g, int64_t n, Context& ctx) {
  const int64_t chunks = (n + lm::kSumOfSquaresChunk - 1) / lm::kSumOfSquaresChunk;
  if (chunks == 0) return 0.0;
  DeviceBuffer<double> partial(static_cast<size_t>(chunks), ctx.stream());
  launch(chunks, ctx, sum_of_squares_kernel, g, n, chunks, partial.data());
  double total = 0;
  for (double p : partial.download()) total += p;  // in chunk order, as the CPU
  return total;
}
void adamw_update(const AdamWArgs& k, const float* g, float* m, float* v, float* w, const uint8_t* decay_mask, int64_t n,
                  Context& ctx) {
  launch(n, ctx, adamw_kernel, lm::AdamWScalars{k.clip, k.b1, k.b2, k.bias1, k.bias2, k.decay, k.lr, k.eps}, g, m, v, w,
         decay_mask, n);
}

}  // namespace nibble::cuda
