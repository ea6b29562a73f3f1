// Character-level data: a tokenizer over the corpus's characters, the 90/10 train/validation
// split, and deterministic batch sampling (batch k depends only on the seed and k).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/token_stream.h"

namespace nibble::train {

class CharTokenizer {
 public:
  // The vocabulary is the sorted set of bytes present in `text` (65 for tinyshakespeare).
  explicit CharTokenizer(std::string_view text);
  int64_t vocab_size() const { return static_cast<int64_t>(chars_.size()); }
  std::vector<int32_t> encode(std::string_view text) const;  // UsageError for a byte outside the vocabulary
  std::string decode(const std::vector<int32_t>& ids) const;

 private:
  std::string chars_;
  int32_t id_of_[256];
};

std::string read_text_file(const std::string& path);  // UsageError naming the path

struct TokenSplit {
  std::vector<int32_t> train, val;
};
// The first `train_fraction` of the tokens train, the rest validate (nanoGPT's 90/10 split).
TokenSplit split_tokens(const std::vector<int32_t>& tokens, double train_fraction = 0.9);

class BatchSampler {
 public:
  // Windows of seq+1 tokens: inputs are the first seq, targets the last seq. A window may start
  // anywhere in the stream (across the boundary of two shards, as across two documents).
  BatchSampler(TokenStream tokens, int64_t seq, uint64_t seed);
  // A view of `tokens`, which must outlive the sampler.
  BatchSampler(const std::vector<int32_t>* tokens, int64_t seq, uint64_t seed);
  // Batch number `index` of `batch` windows at offsets drawn from (seed, index, row).
  void sample(int64_t index, int64_t batch, std::vector<int32_t>& inputs, std::vector<int32_t>& targets) const;
  // Rows [first_row, first_row + rows) of that batch: one rank's slice under data parallelism
  // (train/distributed.h); row b is the same window whichever process draws it.
  void sample_rows(int64_t index, int64_t first_row, int64_t rows, std::vector<int32_t>& inputs,
                   std::vector<int32_t>& targets) const;
  // Row `row` of batch `index` alone: seq inputs to `inputs`, seq targets to `targets` (a mixture
  // draws its rows one by one from its sources' samplers, data/mixture.h).
  void read_row(int64_t index, int64_t row, int32_t* inputs, int32_t* targets) const;

 private:
  TokenStream tokens_;
  int64_t seq_;
  uint64_t seed_;
};

}  // namespace nibble::train
