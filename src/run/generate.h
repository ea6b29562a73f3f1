// Sampling text from a trained model (`nibble generate`): temperature and top-k over the logits of
// the KV-cache decoder (model/kv_cache.h), reproducible from a seed.
#pragma once
#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <vector>

#include "model/transformer.h"

namespace nibble::train {

struct SamplingOptions {
  int64_t max_tokens = 256;
  double temperature = 0.8;  // 0: always the most likely token
  int64_t top_k = 40;        // <= 0: the whole vocabulary
  uint64_t seed = 1;
  void validate() const;     // UsageError naming the option
};

// Draws one token id from `logits`. Ties in top-k are broken by the lower id, so the result
// depends only on the logits, the options and the generator's state.
int32_t sample_token(std::span<const float> logits, const SamplingOptions& options, std::mt19937_64& rng);

// Feeds `prompt` (at least one token) and samples max_tokens more; `on_token` sees each new id as
// it is drawn. Past the model's context the decoder restarts on the newest half-context of tokens.
std::vector<int32_t> generate_tokens(model::Transformer& model, std::span<const int32_t> prompt,
                                     const SamplingOptions& options,
                                     const std::function<void(int32_t)>& on_token = nullptr);

}  // namespace nibble::train
