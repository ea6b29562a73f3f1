// Content hashes of the files whose damage nibble must detect (checkpoints, tokenizers): XXH3-64
// from libxxhash, a fast, well-kept hash (not a cryptographic one: it guards against flipped or
// truncated bytes, not against someone forging a file). Written as "xxh3-64:" and 16 hex digits,
// so a stored value names its algorithm.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace nibble::io {

std::string content_hash(std::span<const uint8_t> bytes);
inline std::string content_hash(std::string_view text) {
  return content_hash(std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

}  // namespace nibble::io
