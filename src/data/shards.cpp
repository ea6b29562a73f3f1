#include "data/shards.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "io/atomic_file.h"
#include "io/regular_file.h"
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

std::string shard_name(std::string_view prefix, uint64_t index) { return fmt::format("{}-{:05d}.bin", prefix, index); }

bool is_shard_name(std::string_view name) {
  for (std::string_view prefix : {"train-", "val-"}) {
    if (!name.starts_with(prefix) || !name.ends_with(".bin")) continue;
    const std::string_view digits = name.substr(prefix.size(), name.size() - prefix.size() - 4);
    return digits.size() >= 5 && digits.find_first_not_of("0123456789") == std::string_view::npos;
  }
  return false;
}

ShardSeries::ShardSeries(std::filesystem::path dir, std::string prefix, int64_t vocab_size, uint64_t shard_tokens)
    : dir_(std::move(dir)), prefix_(std::move(prefix)), vocab_(vocab_size), width_(bytes_per_token(vocab_size)),
      limit_(shard_tokens) {
  if (shard_tokens == 0) throw UsageError("--shard-tokens 0: a shard holds at least one token");
}

ShardSeries::~ShardSeries() {
  if (fd_ >= 0) ::close(fd_);  // an abandoned series: its staging directory is removed with it
}

void ShardSeries::open_next() {
  shards_.push_back({shard_name(prefix_, shards_.size()), 0});
  const std::filesystem::path path = dir_ / shards_.back().file;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) throw UsageError(fmt::format("cannot create {}: {}", path.string(), std::strerror(errno)));
  // The header's count is 0 until close_current fills it in.
  pending_ = serialize_token_shard({}, vocab_);
}

void ShardSeries::flush() {
  for (size_t done = 0; done < pending_.size();) {
    const ssize_t n = ::write(fd_, pending_.data() + done, pending_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw UsageError(fmt::format("cannot write {}: {}", (dir_ / shards_.back().file).string(), std::strerror(errno)));
    done += static_cast<size_t>(n);
  }
  pending_.clear();
}

void ShardSeries::close_current() {
  flush();
  uint8_t count[8];
  for (int i = 0; i < 8; ++i) count[i] = static_cast<uint8_t>(shards_.back().tokens >> (8 * i));
  const std::string path = (dir_ / shards_.back().file).string();
  if (::pwrite(fd_, count, 8, 24) != 8 || ::fsync(fd_) != 0)
    throw UsageError(fmt::format("cannot write {}: {}", path, std::strerror(errno)));
  ::close(fd_);
  fd_ = -1;
}

void ShardSeries::append(std::span<const int32_t> tokens) {
  for (size_t i = 0; i < tokens.size();) {
    if (fd_ < 0) open_next();
    const size_t take = std::min<uint64_t>(tokens.size() - i, limit_ - shards_.back().tokens);
    for (size_t k = i; k < i + take; ++k) {
      const int32_t t = tokens[k];
      if (t < 0 || t >= vocab_)
        throw UsageError(fmt::format("token {} is outside the vocabulary [0, {})", t, vocab_));
      for (uint32_t b = 0; b < width_; ++b) pending_.push_back(static_cast<uint8_t>(static_cast<uint32_t>(t) >> (8 * b)));
    }
    shards_.back().tokens += take;
    total_ += take;
    i += take;
    if (pending_.size() >= (size_t{1} << 20)) flush();
    if (shards_.back().tokens == limit_) close_current();
  }
}

void ShardSeries::finish() {
  if (fd_ >= 0) close_current();
}

namespace {

// prepare.json's "shards" lists: each entry a shard's name (never a path) and token count.
std::vector<ShardSeries::Shard> listed_shards(const nlohmann::json& list, const std::filesystem::path& record) {
  std::vector<ShardSeries::Shard> shards;
  bool ok = list.is_array() && !list.empty();
  for (size_t i = 0; ok && i < list.size(); ++i) {
    const auto& e = list[i];
    ok = e.is_object() && e.contains("file") && e["file"].is_string() && is_shard_name(e["file"].get<std::string>()) &&
         e.contains("tokens") && e["tokens"].is_number_unsigned();
    if (ok) shards.push_back({e["file"].get<std::string>(), e["tokens"].get<uint64_t>()});
  }
  if (!ok)
    throw UsageError(fmt::format("{}: its \"shards\" record is damaged (lists of {{\"file\": \"train-00000.bin\", "
                                 "\"tokens\": N}}); prepare the directory again with `nibble prepare ... --force`",
                                 record.string()));
  return shards;
}

}  // namespace

PreparedShards prepared_shards(const std::filesystem::path& data_dir) {
  const std::filesystem::path record = data_dir / kPrepareFile;
  PreparedShards p;
  std::error_code ec;
  if (std::filesystem::exists(record, ec)) {
    const auto bytes = io::read_regular_file(record, "a prepare.json record");
    const auto j = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("shards")) {
      const auto& s = j["shards"];
      if (!s.is_object() || !s.contains("train") || !s.contains("val"))
        throw UsageError(fmt::format("{}: its \"shards\" record lacks the train or val list; prepare the directory "
                                     "again with `nibble prepare ... --force`",
                                     record.string()));
      p.train = listed_shards(s["train"], record);
      p.val = listed_shards(s["val"], record);
      p.listed = true;
      return p;
    }
  }
  p.train = {{kTrainShardFile, 0}};
  p.val = {{kValShardFile, 0}};
  return p;
}

namespace {

// The shards of one list, in order, as one stream; each of the tokenizer's vocabulary and, when
// prepare.json lists it, of the count listed.
TokenStream open_shards(const std::filesystem::path& dir, const std::vector<ShardSeries::Shard>& shards, bool listed,
                        int64_t vocab) {
  TokenStream stream;
  for (const auto& s : shards) {
    TokenFile f = open_token_file(dir / s.file, TokenFormat::nibble, 0);
    if (f.vocab_size != vocab)
      throw UsageError(fmt::format("{}: the shard's vocabulary ({}) differs from the tokenizer's {}: the files come "
                                   "from different `nibble prepare` runs; prepare the directory again",
                                   (dir / s.file).string(), f.vocab_size, vocab));
    if (listed && f.tokens.size() != s.tokens)
      throw UsageError(fmt::format("{}: holds {} tokens, prepare.json lists {}: prepare the directory again",
                                   (dir / s.file).string(), f.tokens.size(), s.tokens));
    stream.append(f.tokens);
  }
  return stream;
}

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
  const PreparedShards shards = prepared_shards(data_dir);
  d.train = open_shards(data_dir, shards.train, shards.listed, d.vocab_size);
  d.val = open_shards(data_dir, shards.val, shards.listed, d.vocab_size);
  // An earlier nibble's train.bin/val.bin are the 90/10 split of one corpus: another split means
  // the two come from different prepares.
  const uint64_t total = d.train.size() + d.val.size();
  if (!shards.listed && static_cast<uint64_t>(static_cast<double>(total) * 0.9) != d.train.size())
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
