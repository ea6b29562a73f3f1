#include "io/checksum.h"

#include <xxhash.h>

#include <cstdio>

namespace nibble::io {

std::string content_hash(std::span<const uint8_t> bytes) {
  const XXH64_hash_t h = XXH3_64bits(bytes.data(), bytes.size());
  char text[32];
  std::snprintf(text, sizeof text, "xxh3-64:%016llx", static_cast<unsigned long long>(h));
  return text;
}

}  // namespace nibble::io
