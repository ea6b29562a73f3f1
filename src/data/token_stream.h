// The tokens training reads: one or more stored pieces (a std::vector of int32 ids, or the token
// payload of memory-mapped shards, 2 or 4 bytes a token), read as one concatenation. Samplers copy
// windows out of it, so nothing ever holds a whole corpus in a std::vector of its own: a mapped
// shard's pages are read from the file as windows touch them.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace nibble::train {

class TokenStream {
 public:
  // `count` little-endian unsigned tokens of `width` bytes (2 or 4) at `data`.
  struct Piece {
    const void* data = nullptr;
    uint64_t count = 0;
    uint32_t width = 4;
  };

  TokenStream() = default;
  // Owns `tokens`.
  explicit TokenStream(std::vector<int32_t> tokens);
  // A view of `tokens`, which must outlive the stream and its copies.
  static TokenStream view(std::span<const int32_t> tokens);

  // Appends a piece; `owner` keeps its storage (a mapping) alive as long as any copy of the stream.
  void append(Piece piece, std::shared_ptr<const void> owner);
  void append(const TokenStream& other);

  uint64_t size() const { return ends_.empty() ? 0 : ends_.back(); }
  bool empty() const { return size() == 0; }
  // Tokens [start, start + n) into out[0, n), across piece boundaries. start + n <= size().
  void read(uint64_t start, uint64_t n, int32_t* out) const;
  int32_t at(uint64_t index) const;
  // The whole stream as a vector: for small streams (tests, a single evaluation file) only.
  std::vector<int32_t> to_vector() const;

 private:
  std::vector<Piece> pieces_;
  std::vector<uint64_t> ends_;  // ends_[i]: the stream position just past piece i
  std::vector<std::shared_ptr<const void>> owners_;
};

}  // namespace nibble::train
