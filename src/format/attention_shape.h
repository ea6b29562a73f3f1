// The shape of the causal attention core, the contract every backend shares (as gemm_rules.h is for
// the GEMMs): kernels/cpu, kernels/cuda (whose device code calls the members, hence the qualifiers)
// and the seam above them.
//
// qkv: [batch*seq, qkv_stride] holding, per token, `heads` query heads, then `kv_heads` key heads,
// then `kv_heads` value heads, each head_dim wide. Query head h attends with key/value head
// h / (heads / kv_heads) (GQA/MQA).
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define NIBBLE_SHAPE_FN __host__ __device__
#else
#define NIBBLE_SHAPE_FN
#endif

namespace nibble {

struct AttentionShape {
  int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  // Round the products' operands (Q, K, V, P; dO, dS in backward) to BF16, accumulate in FP32, as
  // Transformer Engine's recipes keep attention in BF16. Softmax and its backward stay in FP32.
  bool bf16_matmuls = false;
  NIBBLE_SHAPE_FN int64_t qkv_stride() const { return (heads + 2 * kv_heads) * head_dim; }
  NIBBLE_SHAPE_FN int64_t out_width() const { return heads * head_dim; }
  NIBBLE_SHAPE_FN int64_t group() const { return heads / kv_heads; }  // query heads per key/value head
  // Saved for backward, per (sequence, head, query row): the row's score maximum and 1 / sum of
  // exp(score - maximum), so backward recomputes the forward's probabilities bit for bit.
  NIBBLE_SHAPE_FN int64_t softmax_stats_size() const { return batch * heads * seq * 2; }
};

// Whether a GPU of compute capability `cc_major` runs this attention as the tiled BF16 tensor-core
// kernels (kernels/cuda/flash_attention.cuh: BF16 products, head_dim 32 or 64, mma.sync from sm_80),
// whose backward reads the forward's output. The CUDA backend dispatches on it; the memory plan,
// which runs without a GPU, asks it too (for sm_80 and newer), so the two cannot drift apart.
NIBBLE_SHAPE_FN inline bool tiled_on_gpu(const AttentionShape& s, int cc_major) {
  return cc_major >= 8 && s.bf16_matmuls && (s.head_dim == 32 || s.head_dim == 64);
}

}  // namespace nibble
