// The model's layers on the GPU, forward and backward side by side, on device pointers and the
// context's stream (asynchronous unless said otherwise). Shapes and equations as the CPU kernels of
// the same names (kernels/cpu/layers/<layer>.h). Each kernel maps threads onto a function of layer_math.h,
// which ports the CPU's operation order and which the host tests run against the CPU: the results are
// the CPU's bits for RMSNorm, RoPE, embedding, AdamW, the gradient norm and element-wise ops; with
// exp/log (SwiGLU, cross-entropy, attention) they agree within FP32 rounding bounds, as the device's
// expf/logf are not glibc's.
// Deterministic (a fixed order per output, no atomics). RMSNorm, cross-entropy, the gradient norm and
// the embedding backward run a warp or half-warp per row, column block or chunk (layers.cu); attention
// is still a thread per row.
#pragma once
#include <cstdint>

#include "kernels/cuda/context.h"
#include "kernels/cuda/layer_math.h"

namespace nibble::cuda {

// ---- element-wise --------------------------------------------------------------------------------
void add(float* y, const float* x, int64_t n, Context& ctx);                  // y += x
void round_to_bf16(const float* x, uint16_t* y, int64_t n, Context& ctx);     // RN, BF16 bits
void widen_bf16(const uint16_t* x, float* y, int64_t n, Context& ctx);

// ---- 16x16-tile NVFP4 transpose (ref::transpose_tiles): codes [rows, cols/2] and E4M3 scales
// [rows, cols/16] of a tile-scaled tensor -> those of its transpose. rows, cols multiples of 16.
void transpose_nvfp4_tiles(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols,
                           uint8_t* t_codes, uint8_t* t_scales, Context& ctx);

// ---- layers ----------------------------------------------------------------------------------------
void embedding_forward(const int32_t* tokens, int64_t n, const float* table, int64_t width, float* out, Context& ctx);
void embedding_backward(const int32_t* tokens, int64_t n, const float* dout, int64_t width, float* dtable,
                        Context& ctx);
void rmsnorm_forward(const float* x, const float* gain, int64_t n, int64_t width, float eps, float* y, float* rstd,
                     Context& ctx);
void rmsnorm_backward(const float* x, const float* gain, const float* rstd, const float* dy, int64_t n, int64_t width,
                      float* dx, float* dgain, Context& ctx);
// cos/sin: device tables [positions, head_dim/2]; token t at position first_position + t % seq.
void rope(float* x, int64_t tokens, int64_t seq, int64_t stride, int64_t first_col, int64_t heads, int64_t head_dim,
          const float* cos, const float* sin, int64_t first_position, float direction, Context& ctx);

// Causal GQA attention (kernels/cpu/layers/attention.h's contract; softmax_stats [batch, heads, seq, 2]).
void attention_forward(const AttentionShape& s, const float* qkv, float* out, float* softmax_stats,
                       Context& ctx);
// out (or null): O as attention_forward wrote it, which the tiled kernels then read for the
// backward's row sums of dO * O instead of recomputing it (the same bits); attention_backward_takes_output
// says where that is so.
void attention_backward(const AttentionShape& s, const float* qkv, const float* softmax_stats,
                        const float* dout, float* dqkv, Context& ctx, const float* out = nullptr);
bool attention_backward_takes_output(const AttentionShape& s, const Context& ctx);
void attention_decode(const AttentionShape& s, int64_t past, const float* qkv, float* k_cache, float* v_cache,
                      float* out, Context& ctx);
void swiglu_forward(const float* gate_up, int64_t n, int64_t hidden, float* a, Context& ctx);
void swiglu_backward(const float* gate_up, const float* da, int64_t n, int64_t hidden, float* dgate_up, Context& ctx);
// Per-token losses into loss[n] (device); returns their sum in double, in token order (synchronises).
// row_stats (device, [n, 2], or null): each row's max and 1 / (sum of exp), for the backward_kept.
double cross_entropy_forward(const float* logits, const int32_t* targets, int64_t n, int64_t vocab, float* loss,
                             Context& ctx, float* row_stats = nullptr);
void cross_entropy_backward(const float* logits, const int32_t* targets, int64_t n, int64_t vocab, float scale,
                            float* dlogits, Context& ctx);
// cross_entropy_backward's bits from the forward's row_stats: one pass over the row.
void cross_entropy_backward_kept(const float* logits, const int32_t* targets, int64_t n, int64_t vocab, float scale,
                                 const float* row_stats, float* dlogits, Context& ctx);

// ---- optimizer -------------------------------------------------------------------------------------
// The CPU's fixed-order sum of squares (chunks of 2^14 in eight double lanes, chunks added in order):
// the same bits; synchronises.
double sum_of_squares(const float* g, int64_t n, Context& ctx);
// Its per-chunk partial sums (layer_math.h's kSumOfSquaresChunk), in chunk order.
std::vector<double> sum_of_squares_by_chunk(const float* g, int64_t n, Context& ctx);
struct AdamWArgs {
  float clip, b1, b2, bias1, bias2, decay, lr, eps;
};
void adamw_update(const AdamWArgs& k, const float* g, float* m, float* v, float* w, const uint8_t* decay_mask,
                  int64_t n, Context& ctx);

}  // namespace nibble::cuda
