#include "data/shards.h"

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "io/atomic_file.h"
#include "data/data.h"
#include "data/data_directory.h"

namespace nibble::train {

namespace {

template <typename T>
void put(std::vector<uint8_t>& out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<uint8_t>(static_cast<uint64_t>(value) >> (8 * i)));
}

template <typename T>
T get(std::span<const uint8_t> bytes, size_t offset) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(bytes[offset + i]) << (8 * i);
  return static_cast<T>(v);
}

uint32_t bytes_per_token(int64_t vocab) { return vocab <= 65536 ? 2 : 4; }

}  // namespace

std::vector<uint8_t> serialize_token_shard(std::span<const int32_t> tokens, int64_t vocab_size) {
  if (vocab_size <= 0 || vocab_size > INT32_MAX) throw UsageError(fmt::format("vocab size {} is out of range", vocab_size));
  const uint32_t width = bytes_per_token(vocab_size);
  std::vector<uint8_t> out;
  out.reserve(kShardHeaderBytes + tokens.size() * width);
  for (char c : kShardMagic) out.push_back(static_cast<uint8_t>(c));
  put<uint32_t>(out, kShardVersion);
  put<uint32_t>(out, width);
  put<uint64_t>(out, static_cast<uint64_t>(vocab_size));
  put<uint64_t>(out, tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab_size)
      throw UsageError(fmt::format("token {} at position {} is outside the vocabulary [0, {})", tokens[i], i, vocab_size));
    if (width == 2) put<uint16_t>(out, static_cast<uint16_t>(tokens[i]));
    else put<uint32_t>(out, static_cast<uint32_t>(tokens[i]));
  }
  return out;
}

TokenShard parse_token_shard(std::span<const uint8_t> bytes, const std::string& source) {
  auto fail = [&](const std::string& why) -> TokenShard {
    throw UsageError(fmt::format("{}: not a usable token shard: {} (re-create it with `nibble prepare`)", source, why));
  };
  if (bytes.size() < kShardHeaderBytes)
    return fail(fmt::format("{} bytes is shorter than the {}-byte header", bytes.size(), kShardHeaderBytes));
  if (std::memcmp(bytes.data(), kShardMagic, 8) != 0) return fail("the magic is not NIBTOKNS");
  const uint32_t version = get<uint32_t>(bytes, 8), width = get<uint32_t>(bytes, 12);
  const uint64_t vocab = get<uint64_t>(bytes, 16), count = get<uint64_t>(bytes, 24);
  if (version != kShardVersion)
    return fail(fmt::format("format version {} (this nibble reads version {})", version, kShardVersion));
  if (vocab == 0 || vocab > static_cast<uint64_t>(INT32_MAX)) return fail(fmt::format("vocabulary size {} is out of range", vocab));
  if (width != bytes_per_token(static_cast<int64_t>(vocab)))
    return fail(fmt::format("{} bytes per token does not match vocabulary size {}", width, vocab));
  const uint64_t payload = bytes.size() - kShardHeaderBytes;
  if (count > payload / width || count * width != payload)
    return fail(fmt::format("the header says {} tokens ({} bytes) but the file holds {} bytes after the header", count,
                            count > UINT64_MAX / width ? UINT64_MAX : count * width, payload));
  TokenShard shard;
  shard.vocab_size = static_cast<int64_t>(vocab);
  shard.tokens.resize(count);
  for (uint64_t i = 0; i < count; ++i) {
    const size_t at = kShardHeaderBytes + i * width;
    const uint64_t token = width == 2 ? get<uint16_t>(bytes, at) : get<uint32_t>(bytes, at);
    if (token >= vocab) return fail(fmt::format("token {} at position {} is >= the vocabulary size {}", token, i, vocab));
    shard.tokens[i] = static_cast<int32_t>(token);
  }
  return shard;
}

void write_token_shard(const std::filesystem::path& path, std::span<const int32_t> tokens, int64_t vocab_size) {
  io::write_file_atomically(path, serialize_token_shard(tokens, vocab_size));
}

TokenShard read_token_shard(const std::filesystem::path& path) {
  // Through the data directory's manifest when the shard lies in one (eval --tokens D/val.bin).
  const std::filesystem::path dir = path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path();
  return parse_token_shard(read_data_file(dir, path.filename().string(), "a token shard"), path.string());
}

namespace {

Dataset load_prepared(const DataSpec& spec) {
  const std::filesystem::path& data_dir = spec.dir;
  std::error_code ec;
  if (std::filesystem::exists(data_dir, ec) && !std::filesystem::is_directory(data_dir, ec))
    throw UsageError(fmt::format("data.dir '{}' is a file, not a directory: give the directory `nibble prepare` wrote",
                                 data_dir.string()));
  if (!std::filesystem::is_directory(data_dir, ec))
    throw UsageError(fmt::format("data.dir '{}' does not exist: run `nibble prepare TEXT_FILE -o {}` first",
                                 data_dir.string(), data_dir.string()));
  // Neither file of a prepared directory: most likely llm.c's or nanoGPT's files without data.format.
  if (!std::filesystem::exists(data_dir / kPrepareFile) && !std::filesystem::exists(data_dir / kTokenizerFile))
    throw UsageError(fmt::format("data.dir '{}' is not a `nibble prepare` directory (it has no {} or {}): for llm.c's "
                                 ".bin shards set data.format=llmc, for nanoGPT's train.bin/val.bin "
                                 "data.format=nanogpt (with model.vocab), or prepare text with `nibble prepare TEXT_FILE "
                                 "-o {}`",
                                 data_dir.string(), kPrepareFile, kTokenizerFile, data_dir.string()));
  check_data_directory(data_dir);
  Dataset d;
  d.tokenizer = load_tokenizer(data_dir);
  d.vocab_size = d.tokenizer->vocab_size();
  d.tokenizer_identity = d.tokenizer->identity();
  if (spec.vocab > 0 && spec.vocab != d.vocab_size)
    throw UsageError(fmt::format("{}={} differs from the vocabulary of {}'s tokenizer ({}): leave {} out (0) for a "
                                 "prepared directory, whose tokenizer sets it",
                                 spec.vocab_key, spec.vocab, data_dir.string(), d.vocab_size, spec.vocab_key));
  TokenFile train = open_token_file(data_dir / kTrainShardFile, TokenFormat::nibble, 0),
            val = open_token_file(data_dir / kValShardFile, TokenFormat::nibble, 0);
  if (train.vocab_size != d.vocab_size || val.vocab_size != d.vocab_size)
    throw UsageError(fmt::format("{}: the shards' vocabularies ({} and {}) differ from the tokenizer's {}: the files come "
                                 "from different `nibble prepare` runs; prepare the directory again",
                                 data_dir.string(), train.vocab_size, val.vocab_size, d.vocab_size));
  d.train = std::move(train.tokens);
  d.val = std::move(val.tokens);
  // The Trainer splits its corpus 90/10; the shards must be that split for train and val to stay apart.
  const uint64_t total = d.train.size() + d.val.size();
  if (static_cast<uint64_t>(static_cast<double>(total) * 0.9) != d.train.size())
    throw UsageError(fmt::format("{}: train.bin has {} and val.bin {} tokens, not the 90/10 split nibble trains on; "
                                 "prepare the directory with `nibble prepare`",
                                 data_dir.string(), d.train.size(), d.val.size()));
  return d;
}

// llm.c or nanoGPT files: no tokenizer, the vocabulary given; every file mapped and checked.
Dataset load_pretokenized(const DataSpec& spec) {
  const std::string_view format = to_string(spec.format);
  if (spec.vocab <= 0)
    throw UsageError(fmt::format("data.format={} files carry no vocabulary size: set {} to the size of the tokenizer "
                                 "that wrote them (50257 for GPT-2, 128256 for Llama 3)",
                                 format, spec.vocab_key));
  if (spec.dir.empty() && spec.train_files.empty())
    throw UsageError(fmt::format("data.format={}: set data.dir to the directory of the files, or data.train_files and "
                                 "data.val_files to their paths (glob patterns)",
                                 format));
  if (spec.train_files.empty() != spec.val_files.empty())
    throw UsageError("data.train_files and data.val_files go together: give both (the validation files are not taken "
                     "from the training ones)");
  Dataset d;
  d.vocab_size = spec.vocab;
  d.tokenizer_identity = pretokenized_identity(spec.format, spec.vocab);
  if (!spec.tokenizer.empty()) {
    // Checked before the files are read: the tokenizer is what generate and export will use.
    d.tokenizer = load_tokenizer_file(spec.tokenizer);
    if (d.tokenizer->vocab_size() > spec.vocab)
      throw UsageError(fmt::format("data.tokenizer {} has {} tokens, more than {}={}: the model could not produce its "
                                   "last ids; set {} to at least {} (or give the tokenizer that wrote the files)",
                                   spec.tokenizer.string(), d.tokenizer->vocab_size(), spec.vocab_key, spec.vocab,
                                   spec.vocab_key, d.tokenizer->vocab_size()));
    d.tokenizer_identity = d.tokenizer->identity();
  }
  const TokenFileLists files = list_token_files(spec);
  for (const auto& f : files.train) d.train.append(open_token_file(f, spec.format, spec.vocab, spec.vocab_key).tokens);
  for (const auto& f : files.val) d.val.append(open_token_file(f, spec.format, spec.vocab, spec.vocab_key).tokens);
  return d;
}

}  // namespace

Dataset load_dataset(const DataSpec& spec) {
  return spec.format == TokenFormat::nibble ? load_prepared(spec) : load_pretokenized(spec);
}

Dataset load_dataset(const std::filesystem::path& data_dir) {
  DataSpec spec;
  spec.dir = data_dir;
  return load_dataset(spec);
}

}  // namespace nibble::train
