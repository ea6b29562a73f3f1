// Causal scaled-dot-product attention core with grouped-query heads (GQA), kept in high precision
// (spec section 5: QK^T, softmax and PV are not quantized). The projections around it are Linears.
//
// qkv: [batch*seq, stride] holding, per token, `heads` query heads, then `kv_heads` key heads, then
// `kv_heads` value heads, each head_dim wide (the output of one fused QKV linear, after RoPE).
// Query head h attends with key/value head h / (heads / kv_heads).
#pragma once
#include <cstdint>

namespace nibble::model {

struct AttentionShape {
  int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  // FP32 versions: run the per-head products (QK^T, PV and the four of backward) with BF16 operands
  // and FP32 accumulation (cpu::gemm_bf16), as Transformer Engine's recipes keep attention in BF16.
  // Softmax and its backward stay in FP32. Ignored by the double versions.
  bool bf16_matmuls = false;
  int64_t qkv_stride() const { return (heads + 2 * kv_heads) * head_dim; }
  int64_t out_width() const { return heads * head_dim; }
  int64_t probs_size() const { return batch * heads * seq * seq; }
};

// out: [batch*seq, heads*head_dim]; probs: [batch, heads, seq, seq] softmax rows (saved for
// backward; entries above the diagonal are 0).
template <typename T>
void attention_forward(const AttentionShape& s, const T* qkv, T* out, T* probs);
// dqkv: [batch*seq, qkv_stride] overwritten with the gradients of the (post-RoPE) q, k, v.
//   dP = dO V^T;  dS = P * (dP - rowsum(P * dP));  dQ = scale dS K;  dK = scale dS^T Q;  dV = P^T dO
template <typename T>
void attention_backward(const AttentionShape& s, const T* qkv, const T* probs, const T* dout, T* dqkv);

// The FP32 versions run the per-head products as GEMMs; the double versions are plain loops (the
// finite-difference reference). Tests check that the two agree.
template <>
void attention_forward<float>(const AttentionShape& s, const float* qkv, float* out, float* probs);
template <>
void attention_backward<float>(const AttentionShape& s, const float* qkv, const float* probs, const float* dout,
                               float* dqkv);

}  // namespace nibble::model
