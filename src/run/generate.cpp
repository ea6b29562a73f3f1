#include "run/generate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "common/error.h"
#include "model/kv_cache.h"

namespace nibble::train {

void SamplingOptions::validate() const {
  if (max_tokens < 0 || max_tokens > 1'000'000)
    throw UsageError(fmt::format("--max-tokens {} is outside [0, 1000000]", max_tokens));
  if (!(temperature >= 0) || !std::isfinite(temperature))
    throw UsageError(fmt::format("--temperature {} must be a finite number >= 0 (0: greedy)", temperature));
  if (top_k < 0) throw UsageError(fmt::format("--top-k {} is negative: give k >= 1, or 0 to sample among all tokens", top_k));
}

int32_t sample_token(std::span<const float> logits, const SamplingOptions& o, std::mt19937_64& rng) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  NIBBLE_CHECK(vocab > 0, "sample_token from empty logits");
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, vocab) : vocab;
  auto higher = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), higher);
  if (o.temperature == 0 || !std::isfinite(logits[order[0]])) return order[0];
  // Probabilities in double, relative to the largest logit so exp never overflows.
  std::vector<double> weight(static_cast<size_t>(k));
  double total = 0;
  for (int64_t i = 0; i < k; ++i) {
    const double z = (static_cast<double>(logits[order[i]]) - logits[order[0]]) / o.temperature;
    total += weight[i] = std::isfinite(z) ? std::exp(z) : 0.0;
  }
  // A uniform draw from the raw 64-bit output: std::uniform_real_distribution is not specified
  // bit for bit across standard libraries, the generator is.
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * total;
  double cumulative = 0;
  for (int64_t i = 0; i < k; ++i) {
    cumulative += weight[i];
    if (u < cumulative) return order[i];
  }
  return order[k - 1];
}

std::vector<int32_t> generate_tokens(model::Transformer& model, std::span<const int32_t> prompt,
                                     const SamplingOptions& options, const std::function<void(int32_t)>& on_token) {
  options.validate();
  if (prompt.empty()) throw UsageError("the prompt is empty: give at least one character (e.g. --prompt \"\\n\")");
  model::KvCacheDecoder decoder(model);
  std::vector<int32_t> history(prompt.begin(), prompt.end());
  const int64_t context = decoder.capacity();
  // A prompt longer than the context keeps its newest tokens.
  const size_t first = history.size() > static_cast<size_t>(context) ? history.size() - static_cast<size_t>(context) : 0;
  std::span<const float> logits = decoder.feed(std::span<const int32_t>(history).subspan(first));
  std::mt19937_64 rng(options.seed);
  std::vector<int32_t> produced;
  for (int64_t n = 0; n < options.max_tokens; ++n) {
    const int32_t next = sample_token(logits, options, rng);
    produced.push_back(next);
    history.push_back(next);
    if (on_token) on_token(next);
    if (n + 1 == options.max_tokens) break;
    if (decoder.position() == context) {
      // Context full: restart on the newest half so generation continues with real context.
      decoder.reset();
      const size_t keep = static_cast<size_t>(std::max<int64_t>(1, context / 2));
      if (keep > 1) decoder.feed(std::span<const int32_t>(history).subspan(history.size() - keep, keep - 1));
    }
    logits = decoder.step(next);
  }
  return produced;
}

}  // namespace nibble::train
