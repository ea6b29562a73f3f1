// Content hashes of the files whose damage nibble must detect (checkpoints, tokenizers): XXH3-64
// from libxxhash, a fast, well-kept hash (not a cryptographic one: it guards against flipped or
// truncated bytes, not against someone forging a file). Written as "xxh3-64:" and 16 hex digits,
// so a stored value names its algorithm.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace nibble::io {

std::string content_hash(std::span<const uint8_t> bytes);
inline std::string content_hash(std::string_view text) {
  return content_hash(std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}
// content_hash of bytes given in pieces, one after another (a memory-mapped file hashed without
// keeping all of its pages resident).
class ContentHasher {
 public:
  ContentHasher();
  ~ContentHasher();
  ContentHasher(const ContentHasher&) = delete;
  ContentHasher& operator=(const ContentHasher&) = delete;
  void update(std::span<const uint8_t> bytes);
  std::string digest() const;

 private:
  void* state_;
};
// content_hash of a file's bytes, read in pieces (a checkpoint's optimizer state need not fit in
// memory beside a training run); nullopt when it cannot be read.
std::optional<std::string> file_content_hash(const std::filesystem::path& path);

}  // namespace nibble::io
