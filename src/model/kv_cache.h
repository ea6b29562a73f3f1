// Incremental decoding for sampling (`nibble generate`): one token at a time, with the keys and
// values of earlier positions cached per block, so producing token t costs O(t) attention work
// instead of re-running the whole prefix. It reads the Transformer's FP32 master weights and
// computes in FP32 (the recipe quantizes training GEMMs; sampling uses the weights as trained,
// as any tool reading the Hugging Face checkpoint would). Same equations as Transformer::forward:
// RMSNorm, fused QKV with half-split RoPE at the token's position, causal GQA attention, SwiGLU.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/cpu/rope.h"
#include "model/transformer.h"

namespace nibble::model {

class KvCacheDecoder {
 public:
  // Keeps a reference to `model`: its weights must outlive the decoder and not change under it.
  explicit KvCacheDecoder(const Transformer& model);
  void reset();                               // forget every position
  int64_t position() const { return length_; }  // tokens fed so far
  int64_t capacity() const;                   // the model's context
  // Feeds `token` at position(); returns the logits of the next token [vocab] (valid until the
  // next call). UsageError for a token outside the vocabulary or a full context.
  std::span<const float> step(int32_t token);

 private:
  struct BlockWeights {
    const float *norm1, *qkv, *attn_out, *norm2, *gate_up, *down;
  };
  const Transformer& model_;
  ModelConfig config_;
  cpu::RopeTable<float> rope_;
  const float *embedding_, *final_norm_, *head_;
  std::vector<BlockWeights> blocks_;
  std::vector<std::vector<float>> keys_, values_;  // per block: [context, kv_heads * head_dim]
  int64_t length_ = 0;
  std::vector<float> x_, normed_, qkv_, attn_, proj_, gate_up_, act_, scores_, logits_;
};

}  // namespace nibble::model
