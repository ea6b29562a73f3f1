// Tokenizers a run is trained with and sampled through. Two kinds behind one interface:
//   char: one token per byte present in the corpus (nanoGPT's shakespeare_char; 65 tokens there);
//   bpe:  a byte-fallback BPE model trained with sentencepiece on the corpus itself.
// A tokenizer is saved next to the shards and copied into every run directory (tokenizer.json,
// plus tokenizer.model for bpe), so a run can be evaluated or sampled without the data directory.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace nibble::train {

enum class TokenizerKind : uint8_t { character, bpe };
TokenizerKind parse_tokenizer_kind(std::string_view name);  // UsageError listing char, bpe
std::string_view to_string(TokenizerKind kind);

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual TokenizerKind kind() const = 0;
  virtual int64_t vocab_size() const = 0;
  // UsageError when `text` cannot be represented (a character the char vocabulary lacks).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Ids outside the vocabulary decode to '?' rather than failing: sampling output is shown as is.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // Writes tokenizer.json (and the kind's own files) into `directory`, atomically each.
  virtual void save(const std::filesystem::path& directory) const = 0;
  // A content hash of the vocabulary itself (the char alphabet, the sentencepiece model), stored in
  // every checkpoint: two tokenizers of one vocabulary size map text to different ids, so a run
  // must continue, and be evaluated, with the very tokenizer it was trained with.
  virtual std::string identity() const = 0;
};

std::unique_ptr<Tokenizer> train_char_tokenizer(std::string_view corpus);
// BPE with byte fallback (so any text round-trips) and no normalisation (so decode(encode(x)) == x).
// vocab_size must exceed 256 byte pieces + 3 specials + the corpus's distinct characters.
std::unique_ptr<Tokenizer> train_bpe_tokenizer(std::string_view corpus, int64_t vocab_size);
std::unique_ptr<Tokenizer> train_tokenizer(TokenizerKind kind, std::string_view corpus, int64_t bpe_vocab_size);
// Reads what save() wrote; UsageError naming the file for a missing or corrupt tokenizer.
std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& directory);

}  // namespace nibble::train
