#include "io/checksum.h"

#include <xxhash.h>

#include <cstdio>
#include <memory>
#include <new>
#include <vector>

namespace nibble::io {

namespace {

std::string hash_text(XXH64_hash_t h) {
  char text[32];
  std::snprintf(text, sizeof text, "xxh3-64:%016llx", static_cast<unsigned long long>(h));
  return text;
}

}  // namespace

std::string content_hash(std::span<const uint8_t> bytes) { return hash_text(XXH3_64bits(bytes.data(), bytes.size())); }

ContentHasher::ContentHasher() : state_(XXH3_createState()) {
  if (!state_ || XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_)) != XXH_OK) throw std::bad_alloc();
}
ContentHasher::~ContentHasher() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void ContentHasher::update(std::span<const uint8_t> bytes) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), bytes.data(), bytes.size());
}
std::string ContentHasher::digest() const { return hash_text(XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_))); }

std::optional<std::string> file_content_hash(const std::filesystem::path& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state(XXH3_createState(), &XXH3_freeState);
  if (!file || !state || XXH3_64bits_reset(state.get()) != XXH_OK) return std::nullopt;
  std::vector<unsigned char> buffer(1 << 20);
  for (size_t n; (n = std::fread(buffer.data(), 1, buffer.size(), file.get())) > 0;)
    if (XXH3_64bits_update(state.get(), buffer.data(), n) != XXH_OK) return std::nullopt;
  if (std::ferror(file.get())) return std::nullopt;
  return hash_text(XXH3_64bits_digest(state.get()));
}

}  // namespace nibble::io
