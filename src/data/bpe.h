// The parts of byte-level BPE tokenizers (Hugging Face `tokenizers`, tiktoken) that are shared:
// pre-tokenization by a Unicode regular expression (PCRE2, JIT-compiled where available) and the
// merge loop that turns one pre-token's bytes into ids.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace nibble::train::bpe {

// A compiled pre-tokenization pattern. `\s` and `\S` mean Unicode's White_Space, as in Oniguruma
// (`tokenizers`) and Rust's regex (tiktoken); PCRE2's own `\s` also takes U+180E. So pieces fall
// where the reference implementations put them.
// Whose regex syntax a pattern is written in: Oniguruma's (Hugging Face `tokenizers`; `^` and `$`
// match at every line) or Rust's (tiktoken; `$` matches only at the end of the text).
enum class Dialect { oniguruma, rust };

class Regex {
 public:
  // `literal`: match `pattern` as a plain string. UsageError naming `source` for a bad pattern.
  Regex(std::string_view pattern, bool literal, std::string_view source, Dialect dialect = Dialect::oniguruma);
  // The non-empty matches in `text` (valid UTF-8), left to right, as [begin, end) byte offsets;
  // each search starts where the previous match ended (Rust's find_iter).
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& matches) const;

 private:
  std::shared_ptr<void> code_;  // pcre2_code_8
  std::string source_;
};

// Pre-tokens are split by a regex and either kept with the gaps between them (Isolated, as the
// GPT-2 pattern in ByteLevel and Llama 3's Split) or with the matches dropped (Removed).
enum class SplitBehavior { isolated, removed };

// Appends to `pieces` the pieces of [begin, end) of `text` that `regex` cuts it into.
void split(const Regex& regex, SplitBehavior behavior, std::string_view text, size_t begin, size_t end,
           std::vector<std::pair<size_t, size_t>>& pieces);

// Token ids from the bytes of one pre-token: each byte's own token, then adjacent pairs merged
// lowest rank first (the leftmost among equal ranks) until no pair has a rank. A binary heap of
// candidate pairs over a linked list of symbols: O(n log n) per piece, no rescan per merge.
class Merger {
 public:
  // Hugging Face: an explicit merge list, pair (left id, right id) -> (rank, merged id).
  void add_merge(int32_t left, int32_t right, uint32_t rank, int32_t merged);
  // tiktoken: no merge list; a pair's rank is the rank of the token its concatenated bytes form,
  // and a token's id is its rank.
  void use_concatenation_ranks() { concatenation_ = true; }
  // Token bytes -> id, for every token that byte-pair merging can form.
  void add_token(std::string bytes, int32_t id);
  // The id of a lone byte; -1 when the vocabulary lacks it.
  void set_byte_id(uint8_t byte, int32_t id) { byte_id_[byte] = id; }
  // Hugging Face's ignore_merges and tiktoken: a pre-token that is a token whole is that token.
  void set_whole_piece_first(bool on) { whole_piece_first_ = on; }
  // HF: a byte without a token becomes `id` (fused into one with its unknown neighbours when
  // `fuse`); without an unknown token, as there, it is dropped.
  void set_unknown(int32_t id, bool fuse) { unknown_ = id, fuse_unknown_ = fuse; }
  // HF's BPE over characters (sentencepiece-style vocabularies: "▁the", "<0xE2>"): a piece starts
  // as one token per UTF-8 character (add_token); a character without one becomes the tokens of its
  // bytes (byte fallback: set_byte_id with the <0xNN> ids) when all exist, else the unknown token.
  void use_character_symbols() { characters_ = true; }

  // Appends the ids of `piece` to `out`.
  void encode(std::string_view piece, std::vector<int32_t>& out) const;
  const int32_t* find_token(std::string_view bytes) const;

 private:
  struct Pair {
    uint32_t rank;
    int32_t merged;
  };
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Symbol {
    int32_t id;
    uint32_t begin, end;
    int32_t prev, next;
  };
  void byte_symbols(std::string_view piece, std::vector<Symbol>& symbols) const;
  void character_symbols(std::string_view piece, std::vector<Symbol>& symbols) const;
  bool pair_rank(std::string_view piece, uint32_t a_begin, uint32_t b_end, int32_t left, int32_t right,
                 Pair& found) const;

  // (left, right) -> Pair, open addressing with linear probing: the lookup the merge loop makes
  // for every candidate pair, several times faster than std::unordered_map's buckets.
  class PairTable {
   public:
    void insert(uint64_t key, Pair value);  // replaces the value of a key already there
    const Pair* find(uint64_t key) const;

   private:
    size_t slot(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> shift_; }
    void grow();
    static constexpr uint64_t kEmpty = ~0ull;  // no pair of two non-negative ids has this key
    std::vector<uint64_t> keys_;
    std::vector<Pair> values_;
    size_t size_ = 0;
    int shift_ = 64;
  };
  PairTable merges_;
  std::unordered_map<std::string, int32_t, Hash, std::equal_to<>> tokens_;
  int32_t byte_id_[256];
  bool concatenation_ = false, whole_piece_first_ = false, fuse_unknown_ = false, characters_ = false;
  int32_t unknown_ = -1;
  uint64_t serial_;  // unique per Merger ever made: caches of merged pieces are keyed by it

 public:
  Merger();
  Merger(const Merger&) = delete;  // a copy would share the serial, and so the cached pieces
  Merger& operator=(const Merger&) = delete;
  uint64_t serial() const { return serial_; }
};

// Encodes `pieces` of `text` with `merger` on up to `threads` threads (pieces cut into one
// contiguous run per thread, each with its own cache of repeated pre-tokens), in order.
std::vector<int32_t> encode_pieces(const Merger& merger, std::string_view text,
                                   const std::vector<std::pair<size_t, size_t>>& pieces, int threads);

// `bytes` as GPT-2's byte-level alphabet writes them (printable bytes as themselves, the others
// from U+0100 on): the form of a Hugging Face byte-level vocabulary's tokens.
std::string byte_level_text(std::string_view bytes);

// The number of threads encoders use: set_threads(n) for n > 0 (`prepare --threads`), else every core.
void set_threads(int threads);
int threads();

}  // namespace nibble::train::bpe
