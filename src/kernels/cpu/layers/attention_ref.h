// Causal scaled-dot-product attention core with grouped-query heads (GQA), kept in high precision
// (spec section 5: QK^T, softmax and PV are not quantized). The projections around it are Linears.
//
// qkv: [batch*seq, stride] holding, per token, `heads` query heads, then `kv_heads` key heads, then
// `kv_heads` value heads, each head_dim wide (the output of one fused QKV linear, after RoPE).
// Query head h attends with key/value head h / (heads / kv_heads).
#pragma once
#include <cstdint>

#include "kernels/cpu/layers/attention.h"

namespace nibble::ref {

// (AttentionShape: format/attention_shape.h; bf16_matmuls is ignored here: the loops are exact in T.)

// out: [batch*seq, heads*head_dim]; softmax_stats: [batch, heads, seq, 2], per query row the
// score maximum and 1 / sum of exp(score - maximum), saved for backward.
template <typename T>
void attention_forward(const AttentionShape& s, const T* qkv, T* out, T* softmax_stats);
// dqkv: [batch*seq, qkv_stride] overwritten with the gradients of the (post-RoPE) q, k, v.
//   dP = dO V^T;  dS = P * (dP - rowsum(P * dP));  dQ = scale dS K;  dK = scale dS^T Q;  dV = P^T dO
template <typename T>
void attention_backward(const AttentionShape& s, const T* qkv, const T* softmax_stats, const T* dout, T* dqkv);

// The plain loops: the finite-difference reference (double) of the fused kernels
// cpu::attention_forward/backward (kernels/cpu/layers/attention.h), which tests check against them.

}  // namespace nibble::ref
