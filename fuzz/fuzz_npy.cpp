// libFuzzer target for the .npy reader: any byte string must either parse or raise UsageError
// (anything else - a crash, a sanitizer report, another exception type - is a finding). Parsed
// arrays must survive a serialize/parse round trip bit for bit.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "common/error.h"
#include "io/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nibble::io::NpyArray array;
  try {
    array = nibble::io::parse_npy(std::span<const uint8_t>(data, size), "<fuzz>");
  } catch (const nibble::UsageError&) {
    return 0;
  }
  int64_t count = 1;
  for (int64_t d : array.shape) count *= d;
  if (count != array.element_count()) std::abort();
  // Write as float32 and read back: the same shape and the same bits (float16 was widened exactly).
  const std::vector<uint8_t> again = nibble::io::serialize_npy(array.data, array.shape);
  const nibble::io::NpyArray reread = nibble::io::parse_npy(again, "<fuzz round trip>");
  if (reread.shape != array.shape || reread.data.size() != array.data.size()) std::abort();
  if (!array.data.empty() && std::memcmp(reread.data.data(), array.data.data(), array.data.size() * sizeof(float)) != 0)
    std::abort();
  return 0;
}
