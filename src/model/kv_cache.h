// Incremental decoding for sampling (`nibble generate`): one token at a time, with the keys and
// values of earlier positions cached per block, so producing token t costs O(t) attention work
// instead of re-running the whole prefix. It runs the model's own blocks (Transformer::decode) from
// its FP32 master weights in FP32 (the recipe quantizes training GEMMs; sampling uses the weights as
// trained, as any tool reading the Hugging Face checkpoint would).
#pragma once
#include <cstdint>
#include <span>

#include "model/transformer.h"

namespace nibble::model {

class KvCacheDecoder {
 public:
  // Keeps a reference to `model`: it must outlive the decoder, and its weights must not change
  // under it. Decoding replaces the model's forward state (a training step needs a new forward).
  explicit KvCacheDecoder(Transformer& model) : model_(model), cache_(model.config(), model.backend()) {}
  void reset() { cache_.length = 0; }               // forget every position
  int64_t position() const { return cache_.length; }  // tokens fed so far
  int64_t capacity() const { return cache_.capacity; }  // the model's context
  // Feeds `token` at position(); returns the logits of the next token [vocab] (valid until the
  // next call). UsageError for a token outside the vocabulary or a full context.
  std::span<const float> step(int32_t token) { return feed(std::span<const int32_t>(&token, 1)); }
  // Feeds several tokens at once (a prompt: one pass through the blocks instead of one per token);
  // returns the logits after the last of them.
  std::span<const float> feed(std::span<const int32_t> tokens) { return model_.decode(cache_, tokens); }

 private:
  Transformer& model_;
  KvCache cache_;
};

}  // namespace nibble::model
