// libFuzzer target for the readers of llm.c, nanoGPT and nibble token files (data/token_files.h): any
// byte string must either give a layout that covers it exactly (header, then count x width bytes of
// tokens) or raise UsageError, and the vocabulary check must find the first token a plain loop finds.
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>

#include "common/error.h"
#include "data/token_files.h"

namespace {

using nibble::train::TokenFormat;

std::optional<uint64_t> first_beyond_by_loop(std::span<const uint8_t> tokens, uint64_t count, uint32_t width,
                                             int64_t vocab) {
  for (uint64_t i = 0; i < count; ++i) {
    uint32_t t = 0;
    std::memcpy(&t, tokens.data() + i * width, width);
    if (t >= static_cast<uint64_t>(vocab)) return i;
  }
  return std::nullopt;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> bytes(data, size);
  for (TokenFormat format : {TokenFormat::llmc, TokenFormat::nanogpt, TokenFormat::nibble}) {
    nibble::train::TokenLayout l;
    try {
      l = nibble::train::parse_token_layout(bytes, format, "<fuzz>");
    } catch (const nibble::UsageError&) {
      continue;
    }
    if (l.width != 2 && l.width != 4) __builtin_trap();
    if (l.offset > size || l.count > (size - l.offset) / l.width || l.offset + l.count * l.width != size)
      __builtin_trap();
    // A vocabulary the input picks, so that both outcomes of the check are reached.
    const int64_t vocab = format == TokenFormat::nibble ? l.vocab : 1 + static_cast<int64_t>(size % 70000);
    const auto tokens = bytes.subspan(l.offset);
    if (nibble::train::first_token_beyond(tokens, l.width, vocab) != first_beyond_by_loop(tokens, l.count, l.width, vocab))
      __builtin_trap();
  }
  return 0;
}
