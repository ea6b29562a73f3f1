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
__global__ void cross_entropy_forward_kernel(const float* logits, const int32_t* targets, int64_t n, int64_t vocab,
                                             float* loss) {
  NIBBLE_GRID_STRIDE(i, n) loss[i] = lm::cross_entropy_row(logits + i * vocab, targets[i], vocab);
}
__global__ void cross_entropy_backward_kernel(const float* logits, const int32_t* targets, int64_t n, int64_t vocab,
                                              float scale, float* dlogits) {
  NIBBLE_GRID_STRIDE(i, n) lm::cross_entropy_backward_row(logits + i * vocab, targets[i], vocab, scale, dlogits + i * vocab);
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

AttentionShape checked(const AttentionShape& s) {
  NIBBLE_CHECK(s.kv_heads > 0 && s.heads % s.kv_heads == 0 && s.head_dim > 0 && s.seq > 0 && s.batch > 0,
               "attention shape: positive sizes and heads a multiple of kv_heads");
  return s;
}
float attention_scale(const AttentionShape& s) { return 1.0f / std::sqrt(static_cast<float>(s.head_dim)); }

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
void attention_forward(const AttentionShape& s, const float* qkv, float* out, float* softmax_stats, Context& ctx) {
  launch(s.batch * s.heads * s.seq, ctx, attention_forward_kernel, checked(s), qkv, out, softmax_stats, attention_scale(s));
}
void attention_backward(const AttentionShape& s, const float* qkv, const float* softmax_stats, const float* dout,
                        float* dqkv, Context& ctx) {
  DeviceBuffer<float> row_dot(static_cast<size_t>(s.batch * s.heads * s.seq), ctx.stream());
  launch(s.batch * s.heads * s.seq, ctx, attention_backward_query_kernel, checked(s), qkv, softmax_stats, dout, dqkv,
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

std::vector<double> sum_of_squares_by_chunk(const float* g, int64_t n, Context& ctx) {
  const int64_t chunks = (n + lm::kSumOfSquaresChunk - 1) / lm::kSumOfSquaresChunk;
  if (chunks == 0) return {};
  DeviceBuffer<double> partial(static_cast<size_t>(chunks), ctx.stream());
  launch(chunks, ctx, sum_of_squares_kernel, g, n, chunks, partial.data());
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
