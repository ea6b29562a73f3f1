// Token shards: the binary files `nibble prepare` writes and `nibble train` reads.
//   offset  0  8 bytes  magic "NIBTOKNS"
//   offset  8  u32      format version (1)
//   offset 12  u32      bytes per token (2 when vocab <= 65536, else 4)
//   offset 16  u64      vocabulary size (every token is < vocab)
//   offset 24  u64      token count
//   offset 32           the tokens, little-endian
// A reader checks every header field and the exact file length, so a truncated or foreign file
// is reported (naming the file and the field) instead of being trained on.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/token_files.h"
#include "data/tokenizer.h"

namespace nibble::train {

inline constexpr char kShardMagic[8] = {'N', 'I', 'B', 'T', 'O', 'K', 'N', 'S'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderBytes = 32;

struct TokenShard {
  int64_t vocab_size = 0;
  std::vector<int32_t> tokens;
};

std::vector<uint8_t> serialize_token_shard(std::span<const int32_t> tokens, int64_t vocab_size);
// `source` labels messages. UsageError for a bad magic/version/width, a length that disagrees with
// the header, or a token >= vocab.
TokenShard parse_token_shard(std::span<const uint8_t> bytes, const std::string& source);
void write_token_shard(const std::filesystem::path& path, std::span<const int32_t> tokens, int64_t vocab_size);
TokenShard read_token_shard(const std::filesystem::path& path);

// The name of shard `index` of a series: train-00000.bin, val-00012.bin.
std::string shard_name(std::string_view prefix, uint64_t index);
// Whether `name` is one (train-DIGITS.bin, val-DIGITS.bin, five digits or more).
bool is_shard_name(std::string_view name);

// A series of token shards written one after another into `dir` (a staging directory, renamed
// whole when complete: so a shard is written in place, its header's count filled in when it is
// closed), each of at most `shard_tokens` tokens: PREFIX-00000.bin, PREFIX-00001.bin, ...
class ShardSeries {
 public:
  struct Shard {
    std::string file;
    uint64_t tokens = 0;
  };
  ShardSeries(std::filesystem::path dir, std::string prefix, int64_t vocab_size, uint64_t shard_tokens);
  ~ShardSeries();
  ShardSeries(const ShardSeries&) = delete;
  ShardSeries& operator=(const ShardSeries&) = delete;

  // UsageError for a token outside [0, vocab_size), as serialize_token_shard.
  void append(std::span<const int32_t> tokens);
  // Closes the shard being written (its header completed, synced to disk).
  void finish();
  const std::vector<Shard>& shards() const { return shards_; }
  uint64_t tokens() const { return total_; }

 private:
  void open_next();
  void flush();
  void close_current();

  std::filesystem::path dir_;
  std::string prefix_;
  int64_t vocab_;
  uint32_t width_;
  uint64_t limit_, total_ = 0;
  int fd_ = -1;
  std::vector<uint8_t> pending_;
  std::vector<Shard> shards_;
};

// What `nibble prepare` makes in `output_dir`: train-00000.bin ... and val-00000.bin ... (of each
// source, the last `val_fraction` of its tokens validate, or the `val_inputs` do), the tokenizer's
// files (data/tokenizer.h) and prepare.json, which lists the shards in order, written as a whole or
// not at all (data/data_directory.h). The output is checked before anything is read; inputs are
// streamed in batches of `batch_bytes`, so memory stays bounded whatever the corpus size
// (data/prepare_inputs.h; docs/data-directory.md gives the bounds). A bad input (a corrupt .zst, a
// JSON line without the field) stops the prepare with the file and line named and nothing written.
struct PrepareOptions {
  std::vector<std::filesystem::path> inputs;  // files, directories, glob patterns (data/prepare_inputs.h)
  std::vector<std::filesystem::path> val_inputs;  // validation inputs; then `inputs` are not split
  double val_fraction = 0.1;                  // of each input source's tokens, when no val_inputs
  std::string field = "text";                 // the field of a JSON line that holds its text
  uint64_t shard_tokens = 100'000'000;        // at most this many tokens a shard
  size_t batch_bytes = size_t{16} << 20;      // text read and encoded at a time
  bool progress = true;                       // the progress line on stderr
  std::filesystem::path output_dir;
  TokenizerKind tokenizer = TokenizerKind::character;
  int64_t bpe_vocab_size = 1024;
  // An existing tokenizer to encode with instead of training one (`prepare --tokenizer FILE`): each
  // input is then a document, encoded on its own and followed by the tokenizer's end-of-text id.
  std::filesystem::path tokenizer_file;
  std::string tiktoken_encoding;  // for a .tiktoken tokenizer_file: its pattern's name (else its file name)
  bool force = false;  // replace an existing data directory
};
struct PrepareResult {
  int64_t vocab_size = 0, train_tokens = 0, val_tokens = 0, characters = 0;
  int64_t sources = 0, documents = 0;
  std::vector<ShardSeries::Shard> train_shards, val_shards;
  std::optional<int32_t> end_of_text;  // the id that ends each document, for a loaded tokenizer
  std::string end_of_text_token;       // its text
  std::optional<int32_t> begin_of_text;  // the id that begins each document, where one does
  std::string begin_of_text_token;
  std::string tokenizer_files;  // the tokenizer's files in the data directory, comma-separated
  bool replaced = false;  // an existing data directory was replaced
};
PrepareResult prepare_dataset(const PrepareOptions& options);

// A prepared data directory, loaded and checked (load_dataset of data/token_files.h, format nibble).
Dataset load_dataset(const std::filesystem::path& data_dir);

// The shards of a directory an earlier nibble prepared (one each); still read.
inline constexpr const char* kTrainShardFile = "train.bin";
inline constexpr const char* kValShardFile = "val.bin";

// The token shards of a prepared directory, in order: prepare.json's "shards" lists, or
// train.bin/val.bin for a directory an earlier nibble prepared.
struct PreparedShards {
  std::vector<ShardSeries::Shard> train, val;
  bool listed = false;  // from prepare.json's lists
};
PreparedShards prepared_shards(const std::filesystem::path& data_dir);

}  // namespace nibble::train
