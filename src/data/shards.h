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

// What `nibble prepare` makes in `output_dir`: train.bin, val.bin (the last tenth of the tokens,
// the split the Trainer uses), the tokenizer's files (data/tokenizer.h) and prepare.json, written as a
// whole or not at all (data/data_directory.h). Everything is checked before anything is written:
// the output (check_prepare_output: an existing data directory needs `force`), the inputs (text
// files, not directories or devices; UTF-8 for BPE) and the tokenizer's training.
struct PrepareOptions {
  std::vector<std::filesystem::path> inputs;  // text files, concatenated in order
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

inline constexpr const char* kTrainShardFile = "train.bin";
inline constexpr const char* kValShardFile = "val.bin";

}  // namespace nibble::train
