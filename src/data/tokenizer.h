// Tokenizers a run is trained with and sampled through, behind one interface:
//   char: one token per byte present in the corpus (nanoGPT's shakespeare_char; 65 tokens there);
//   bpe:  a byte-fallback BPE model trained with sentencepiece on the corpus itself;
//   huggingface: an existing Hugging Face tokenizer.json of the byte-level BPE kind (GPT-2,
//         Llama 3) or the sentencepiece-style byte_fallback BPE kind (Llama 2, Mistral), loaded by
//         `prepare --tokenizer FILE` (data/huggingface_tokenizer.h);
//   sentencepiece: an existing sentencepiece model (Llama 2, Gemma), `prepare --tokenizer x.model`;
//         a document is BOS + its ids + EOS, where the model has them;
//   tiktoken: a .tiktoken ranks file with the pattern of one of OpenAI's encodings
//         (data/tiktoken_tokenizer.h), kept as tokenizer.tiktoken.
// A tokenizer is saved next to the shards and copied into every run directory (nibble_tokenizer.json,
// plus tokenizer.model for bpe), so a run can be evaluated or sampled without the data directory.
// For huggingface, tokenizer.json is the original file itself, byte for byte.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace nibble::train {

// The files a tokenizer is saved as, in a data directory and in every run directory.
inline constexpr const char* kTokenizerFile = "tokenizer.json";
inline constexpr const char* kSentencePieceFile = "tokenizer.model";
inline constexpr const char* kTiktokenFile = "tokenizer.tiktoken";
// nibble's own description of a tokenizer, where tokenizer.json would be a misleading name (it is no
// Hugging Face tokenizer.json): char's and bpe's, a given sentencepiece model's and a tiktoken
// file's. Data and run directories of char and bpe written before it kept theirs in tokenizer.json,
// which still loads (and is rewritten there when such a run resumes); a directory has one or the other.
inline constexpr const char* kNibbleTokenizerFile = "nibble_tokenizer.json";

enum class TokenizerKind : uint8_t { character, bpe, huggingface, sentencepiece, tiktoken };
TokenizerKind parse_tokenizer_kind(std::string_view name);  // UsageError listing char, bpe
std::string_view to_string(TokenizerKind kind);

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual TokenizerKind kind() const = 0;
  virtual int64_t vocab_size() const = 0;
  // UsageError when `text` cannot be represented (a character the char vocabulary lacks).
  // For a loaded tokenizer, as its reference implementation encodes a text (BOS included where
  // the file adds it).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // One document of a corpus: encode() followed by the end-of-text id, where there is one. char
  // and bpe have none (their corpus is encoded as one text, as nibble always has).
  virtual std::vector<int32_t> encode_document(std::string_view text) const { return encode(text); }
  // A prompt to continue: as a document begins (a sentencepiece model's <s>; a Hugging Face
  // template's BOS is in encode() already), without the end.
  virtual std::vector<int32_t> encode_prompt(std::string_view text) const { return encode(text); }
  virtual std::optional<int32_t> end_of_text() const { return std::nullopt; }
  virtual std::optional<int32_t> begin_of_text() const { return std::nullopt; }
  // How a special token is written (<s>, <|endoftext|>): what decode gives, except where decoding
  // drops control tokens (sentencepiece).
  virtual std::string token_text(int32_t id) const { return decode(std::span(&id, 1)); }
  // The tokenizer as a Hugging Face tokenizer.json giving the same ids, for export, where it is
  // not one already and can be written as one (tiktoken); nullopt otherwise.
  virtual std::optional<std::string> converted_to_huggingface() const { return std::nullopt; }
  // Ids outside the vocabulary decode to '?' rather than failing: sampling output is shown as is.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // Writes the kind's files (tokenizer.json or nibble_tokenizer.json, the model, the ranks) into
  // `directory`, atomically each.
  virtual void save(const std::filesystem::path& directory) const = 0;
  // A content hash of the vocabulary itself (the char alphabet, the sentencepiece model), stored in
  // every checkpoint: two tokenizers of one vocabulary size map text to different ids, so a run
  // must continue, and be evaluated, with the very tokenizer it was trained with.
  virtual std::string identity() const = 0;
};

std::unique_ptr<Tokenizer> train_char_tokenizer(std::string_view corpus);
// BPE with byte fallback (so any text round-trips) and no normalisation (so decode(encode(x)) == x).
// The corpus must be UTF-8 (sentencepiece crashes on other bytes), and vocab_size must exceed 256
// byte pieces + 3 specials + the corpus's distinct characters; UsageError naming the fix otherwise.
std::unique_ptr<Tokenizer> train_bpe_tokenizer(std::string_view corpus, int64_t vocab_size);
std::unique_ptr<Tokenizer> train_tokenizer(TokenizerKind kind, std::string_view corpus, int64_t bpe_vocab_size);
// The offset of the first byte of `text` that does not begin a valid UTF-8 character (overlong
// forms, surrogates and code points above U+10FFFF included), nullopt for valid UTF-8.
std::optional<size_t> first_invalid_utf8(std::string_view text);

// Reads what save() wrote; UsageError naming the file for a missing or corrupt tokenizer. In a data
// directory the files are checked against prepare.json's record of them (data/data_directory.h);
// a BPE tokenizer's model is a plain file name beside tokenizer.json, never a path elsewhere.
std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& directory);
// Whether `directory` holds a tokenizer load_tokenizer would read (nibble_tokenizer.json or tokenizer.json).
bool has_tokenizer(const std::filesystem::path& directory);

// An existing tokenizer file given to `prepare --tokenizer FILE`: a Hugging Face tokenizer.json, a
// sentencepiece model, or a .tiktoken file, whose encoding (pattern, special tokens) is
// `tiktoken_encoding` or else the file's name (cl100k_base.tiktoken).
// UsageError naming the file, and the kind when it is one nibble does not read.
std::unique_ptr<Tokenizer> load_tokenizer_file(const std::filesystem::path& file, std::string_view tiktoken_encoding = "");

}  // namespace nibble::train
