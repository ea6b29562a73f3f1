// Token files training reads in place, memory-mapped (never copied into a std::vector, so memory
// stays bounded whatever the corpus size), in three formats:
//   nibble   the NIBTOKNS shards `nibble prepare` writes (data/shards.h), with their tokenizer;
//   llmc     llm.c's shards (dev/data/fineweb.py ...): a header of 256 little-endian int32,
//            header[0] = magic, header[1] = version, header[2] = token count, then the tokens:
//            GPT-2's magic 20240520 version 1 with uint16 tokens, Llama 3's magic 20240801 version
//            7 with uint32 tokens (llm.c's data_common.py); magic 20240520 version 2 with uint32
//            tokens is read too;
//   nanogpt  nanoGPT's prepare.py output: raw little-endian uint16 tokens, no header.
// llm.c and nanoGPT files carry no tokenizer and no vocabulary size: the caller gives the size.
// Every file is checked when opened, in one streaming pass (header, exact length, every token below
// the vocabulary), so a lying header or a file of another tokenizer is refused before training
// starts, naming the file, the field or the token's offset.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/token_stream.h"
#include "data/tokenizer.h"

namespace nibble::train {

enum class TokenFormat : uint8_t { nibble, llmc, nanogpt };
TokenFormat parse_token_format(std::string_view name);  // UsageError listing nibble, llmc, nanogpt
std::string_view to_string(TokenFormat format);

inline constexpr int32_t kLlmcMagic = 20240520;        // GPT-2 shards
inline constexpr int32_t kLlmcLlama3Magic = 20240801;  // Llama 3 shards
inline constexpr size_t kLlmcHeaderInts = 256;

// Where a file's tokens lie in its bytes, from its header (llmc, nibble) or its length (nanogpt).
// UsageError naming `source` and the field for a header that lies or a length that disagrees.
struct TokenLayout {
  uint64_t offset = 0, count = 0;
  uint32_t width = 2;  // bytes per token
  int64_t vocab = 0;   // the header's vocabulary (nibble); 0 where the format records none
};
TokenLayout parse_token_layout(std::span<const uint8_t> bytes, TokenFormat format, const std::string& source);
// The index of the first of `tokens` (little-endian, `width` bytes each) >= vocab; nullopt if none.
std::optional<uint64_t> first_token_beyond(std::span<const uint8_t> tokens, uint32_t width, int64_t vocab);

// One file of `format`, mapped read-only and checked. `vocab`: the vocabulary every token must lie
// below; for nibble shards 0 takes the header's, and another value must equal it.
struct TokenFile {
  TokenStream tokens;
  int64_t vocab_size = 0;
};
// `vocab_key` names the setting of `vocab` in messages.
TokenFile open_token_file(const std::filesystem::path& path, TokenFormat format, int64_t vocab,
                          std::string_view vocab_key = "vocab");

// Where a run's tokens are. For nibble, `dir` is a prepared data directory (its shards in the
// order prepare.json lists them). For llmc, `dir` holds
// llm.c's shards: train = the files named *train*.bin, val = *val*.bin, in name order. For nanogpt,
// `dir` holds train.bin and val.bin. Globs (`train_files`, `val_files`: glob(3) patterns, several
// separated by commas, relative to `dir` when it is set) replace the directory's listing for
// llmc and nanogpt.
struct DataSpec {
  TokenFormat format = TokenFormat::nibble;
  std::filesystem::path dir;
  std::string train_files, val_files;
  // llmc and nanogpt: the tokenizer file that wrote them (load_tokenizer_file), or none.
  std::filesystem::path tokenizer;
  int64_t vocab = 0;  // required for llmc and nanogpt; for nibble 0 or the tokenizer's size
  // Names the key that sets `vocab` in messages (the run config's, "model.vocab").
  std::string vocab_key = "vocab";
};

struct TokenFileLists {
  std::vector<std::filesystem::path> train, val;
};
// The files `spec` names, in order; UsageError naming the directory or pattern that finds none.
TokenFileLists list_token_files(const DataSpec& spec);

// A run's data, loaded and checked: for nibble, every file against prepare.json's record of it and
// the shards with each other and with the tokenizer.
struct Dataset {
  std::unique_ptr<Tokenizer> tokenizer;  // for llmc and nanogpt files, data.tokenizer's (null without one)
  int64_t vocab_size = 0;
  // The tokenizer's identity() (stored in checkpoints), or pretokenized_identity() without one.
  // vocab_size is model.vocab for llmc and nanogpt, a tokenizer or not (it may be padded beyond it).
  std::string tokenizer_identity;
  TokenStream train, val;
  // train followed by val, as a vector: the corpus the Trainer splits 90/10 back into the same two
  // parts for nibble data. For small data only (tests).
  std::vector<int32_t> corpus() const;
};
Dataset load_dataset(const DataSpec& spec);

// What a run trained on files without a tokenizer records as its tokenizer: a run continues, and
// is evaluated, only on ids of the same vocabulary size and format.
std::string pretokenized_identity(TokenFormat format, int64_t vocab);

}  // namespace nibble::train
