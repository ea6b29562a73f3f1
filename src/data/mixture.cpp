#include "data/mixture.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "common/hash.h"

namespace nibble::train {

namespace {
// Keeps the mixture's offset apart from the window offsets, which also hash the seed.
constexpr uint64_t kMixSalt = 0x4D49585455524553ull;  // "MIXTURES"
}  // namespace

SourceMix::SourceMix(const std::vector<double>& weights, uint64_t seed) : offset_(mix64(seed ^ kMixSalt)) {
  if (weights.empty()) throw std::logic_error("SourceMix: no sources");
  long double total = 0;
  for (double w : weights) {
    if (!(w > 0) || !std::isfinite(w)) throw std::logic_error("SourceMix: weights are positive and finite");
    total += w;
  }
  long double cumulative = 0;
  for (size_t s = 0; s + 1 < weights.size(); ++s) {
    cumulative += weights[s];
    // cumulative / total < 1 here, so the end fits below 2^64.
    ends_.push_back(static_cast<uint64_t>(std::ldexp(cumulative / total, 64)));
  }
}

size_t SourceMix::source_of(uint64_t row) const {
  if (ends_.empty()) return 0;
  const uint64_t u = offset_ + row * kGoldenStep;  // mod 2^64
  return static_cast<size_t>(std::upper_bound(ends_.begin(), ends_.end(), u) - ends_.begin());
}

double SourceMix::share(size_t s) const {
  const long double begin = s == 0 ? 0.0L : static_cast<long double>(ends_[s - 1]);
  const long double end = s == ends_.size() ? std::ldexp(1.0L, 64) : static_cast<long double>(ends_[s]);
  return static_cast<double>(std::ldexp(end - begin, -64));
}

MixtureSampler::MixtureSampler(std::vector<TokenStream> sources, const std::vector<double>& weights, int64_t seq,
                               uint64_t seed, int64_t batch)
    : mix_(weights, seed), seq_(seq), batch_(batch) {
  if (sources.size() != weights.size()) throw std::logic_error("MixtureSampler: one weight per source");
  for (TokenStream& s : sources) samplers_.emplace_back(std::move(s), seq, seed);
}

void MixtureSampler::sample_rows(int64_t index, int64_t first_row, int64_t rows, std::vector<int32_t>& inputs,
                                 std::vector<int32_t>& targets) const {
  if (samplers_.size() == 1) return samplers_[0].sample_rows(index, first_row, rows, inputs, targets);
  inputs.resize(static_cast<size_t>(rows * seq_));
  targets.resize(inputs.size());
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = first_row + r;
    const BatchSampler& source = samplers_[mix_.source_of(global_row(index, row))];
    source.read_row(index, row, inputs.data() + r * seq_, targets.data() + r * seq_);
  }
}

}  // namespace nibble::train
