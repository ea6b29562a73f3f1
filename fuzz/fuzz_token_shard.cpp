// libFuzzer target for the token-shard reader: any byte string must either parse into tokens below
// the vocabulary or raise UsageError; what parses must serialize back to the same bytes.
#include <cstdint>
#include <span>

#include "common/error.h"
#include "data/shards.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nibble::train::TokenShard shard;
  try {
    shard = nibble::train::parse_token_shard(std::span<const uint8_t>(data, size), "<fuzz>");
  } catch (const nibble::UsageError&) {
    return 0;
  }
  for (int32_t t : shard.tokens)
    if (t < 0 || t >= shard.vocab_size) __builtin_trap();
  const auto again = nibble::train::serialize_token_shard(shard.tokens, shard.vocab_size);
  if (again.size() != size || !std::equal(again.begin(), again.end(), data)) __builtin_trap();
  return 0;
}
