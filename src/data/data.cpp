#include "data/data.h"

#include <algorithm>
#include <filesystem>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "common/hash.h"
#include "format/quantized_tensor.h"
#include "common/error.h"

namespace nibble::train {

CharTokenizer::CharTokenizer(std::string_view text) {
  bool present[256] = {};
  for (unsigned char c : text) present[c] = true;
  std::fill(std::begin(id_of_), std::end(id_of_), -1);
  for (int c = 0; c < 256; ++c)
    if (present[c]) {
      id_of_[c] = static_cast<int32_t>(chars_.size());
      chars_.push_back(static_cast<char>(c));
    }
  if (chars_.empty()) throw UsageError("the corpus is empty: a tokenizer needs at least one character");
}

std::vector<int32_t> CharTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    int32_t id = id_of_[static_cast<unsigned char>(text[i])];
    if (id < 0)
      throw UsageError("character code " + std::to_string(static_cast<unsigned char>(text[i])) + " at offset " +
                       std::to_string(i) + " is not in the tokenizer's vocabulary");
    ids[i] = id;
  }
  return ids;
}

std::string CharTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string s;
  for (int32_t id : ids) s.push_back(id >= 0 && id < vocab_size() ? chars_[id] : '?');
  return s;
}

std::string read_text_file(const std::string& path) {
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  if (std::filesystem::is_directory(status))
    throw UsageError("'" + path + "' is a directory, not a file: give the path of a file in it");
  // A device (/dev/zero) has no end and would be read until memory runs out; a FIFO is a stream
  // with an end (`nibble train <(...)`, `prepare <(zcat x.gz)`), read as one.
  if (std::filesystem::is_character_file(status) || std::filesystem::is_block_file(status) ||
      std::filesystem::is_socket(status))
    throw UsageError("'" + path + "' is a device or socket, not a text file: give the path of a file");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw UsageError("cannot open '" + path + "': check the path");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TokenSplit split_tokens(const std::vector<int32_t>& tokens, double train_fraction) {
  if (!(train_fraction > 0 && train_fraction < 1))
    throw UsageError("train fraction " + std::to_string(train_fraction) + " must lie in (0, 1)");
  const size_t cut = static_cast<size_t>(static_cast<double>(tokens.size()) * train_fraction);
  return {std::vector<int32_t>(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(cut)),
          std::vector<int32_t>(tokens.begin() + static_cast<std::ptrdiff_t>(cut), tokens.end())};
}

BatchSampler::BatchSampler(TokenStream tokens, int64_t seq, uint64_t seed)
    : tokens_(std::move(tokens)), seq_(seq), seed_(seed) {
  if (tokens_.size() < static_cast<uint64_t>(seq) + 2)
    throw UsageError("a split has " + std::to_string(tokens_.size()) + " tokens, too few for windows of " +
                     std::to_string(seq + 1) + ": use a longer corpus or a shorter context");
}

BatchSampler::BatchSampler(const std::vector<int32_t>* tokens, int64_t seq, uint64_t seed)
    : BatchSampler(TokenStream::view(*tokens), seq, seed) {}

void BatchSampler::sample(int64_t index, int64_t batch, std::vector<int32_t>& inputs,
                          std::vector<int32_t>& targets) const {
  sample_rows(index, 0, batch, inputs, targets);
}

void BatchSampler::sample_rows(int64_t index, int64_t first_row, int64_t rows, std::vector<int32_t>& inputs,
                               std::vector<int32_t>& targets) const {
  inputs.resize(static_cast<size_t>(rows * seq_));
  targets.resize(inputs.size());
  for (int64_t r = 0; r < rows; ++r) read_row(index, first_row + r, inputs.data() + r * seq_, targets.data() + r * seq_);
}

void BatchSampler::read_row(int64_t index, int64_t row, int32_t* inputs, int32_t* targets) const {
  const uint64_t windows = tokens_.size() - static_cast<uint64_t>(seq_);
  const uint64_t b = static_cast<uint64_t>(row);
  const uint64_t start = mix64(mix64(seed_ ^ mix64(static_cast<uint64_t>(index))) + b) % windows;
  // The window's seq + 1 tokens: the first seq are the inputs, the last seq the targets.
  const size_t seq = static_cast<size_t>(seq_);
  tokens_.read(start, seq, inputs);
  std::copy(inputs + 1, inputs + seq, targets);
  targets[seq - 1] = tokens_.at(start + seq);
}

}  // namespace nibble::train
