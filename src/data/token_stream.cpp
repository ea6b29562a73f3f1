#include "data/token_stream.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <stdexcept>

namespace nibble::train {

// Shards store little-endian tokens, read here with plain loads.
static_assert(std::endian::native == std::endian::little, "token shards are read as little-endian memory");

TokenStream::TokenStream(std::vector<int32_t> tokens) {
  auto owned = std::make_shared<const std::vector<int32_t>>(std::move(tokens));
  append(Piece{owned->data(), owned->size(), 4}, owned);
}

TokenStream TokenStream::view(std::span<const int32_t> tokens) {
  TokenStream s;
  s.append(Piece{tokens.data(), tokens.size(), 4}, nullptr);
  return s;
}

void TokenStream::append(Piece piece, std::shared_ptr<const void> owner) {
  if (piece.width != 2 && piece.width != 4) throw std::logic_error("TokenStream: a token is 2 or 4 bytes");
  if (piece.count == 0) return;  // an empty shard adds nothing, and no piece is ever empty
  pieces_.push_back(piece);
  ends_.push_back(size() + piece.count);
  owners_.push_back(std::move(owner));
}

void TokenStream::append(const TokenStream& other) {
  for (size_t i = 0; i < other.pieces_.size(); ++i) append(other.pieces_[i], other.owners_[i]);
}

void TokenStream::read(uint64_t start, uint64_t n, int32_t* out) const {
  if (n > size() || start > size() - n) throw std::out_of_range("TokenStream::read past the end");
  // The piece holding `start`: the first whose end lies beyond it.
  size_t p = static_cast<size_t>(std::upper_bound(ends_.begin(), ends_.end(), start) - ends_.begin());
  while (n > 0) {
    const Piece& piece = pieces_[p];
    const uint64_t first = start - (ends_[p] - piece.count), take = std::min(n, piece.count - first);
    if (piece.width == 4) {
      std::memcpy(out, static_cast<const uint8_t*>(piece.data) + first * 4, take * 4);
    } else {
      const auto* t = static_cast<const uint16_t*>(piece.data) + first;
      for (uint64_t i = 0; i < take; ++i) out[i] = t[i];
    }
    out += take;
    start += take;
    n -= take;
    ++p;
  }
}

int32_t TokenStream::at(uint64_t index) const {
  int32_t t = 0;
  read(index, 1, &t);
  return t;
}

std::vector<int32_t> TokenStream::to_vector() const {
  std::vector<int32_t> all(size());
  if (!all.empty()) read(0, all.size(), all.data());
  return all;
}

}  // namespace nibble::train
