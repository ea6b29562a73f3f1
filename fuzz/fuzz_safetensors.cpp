// libFuzzer target for the safetensors reader: any byte string must either parse or raise
// UsageError. A parsed file must serialize (its names are valid UTF-8, its sizes consistent) and
// parse back to the same metadata and tensors; read as a quantized tensor (io/quantized_safetensors.h),
// it must be accepted or refused with UsageError, never crash.
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "format/quantized_tensor.h"
#include "io/quantized_safetensors.h"
#include "common/error.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nibble::io::SafetensorsFile file;
  try {
    file = nibble::io::parse_safetensors(std::span<const uint8_t>(data, size), "<fuzz>");
  } catch (const nibble::UsageError&) {
    return 0;
  }
  uint64_t total_bytes = 0;
  for (const auto& [name, tensor] : file.tensors) {
    if (tensor.element_count() < 0) std::abort();
    if (static_cast<uint64_t>(tensor.element_count()) * nibble::io::dtype_size(tensor.dtype) != tensor.data.size())
      std::abort();
    total_bytes += tensor.data.size();
  }
  if (total_bytes > size) std::abort();  // tensors never share bytes, so they fit in the input
  const std::vector<uint8_t> again = nibble::io::serialize_safetensors(file);
  const nibble::io::SafetensorsFile reread = nibble::io::parse_safetensors(again, "<fuzz round trip>");
  if (reread.metadata != file.metadata || reread.tensors.size() != file.tensors.size()) std::abort();
  for (const auto& [name, tensor] : file.tensors) {
    auto it = reread.tensors.find(name);
    if (it == reread.tensors.end() || it->second.dtype != tensor.dtype || it->second.shape != tensor.shape ||
        it->second.data != tensor.data)
      std::abort();
  }
  try {
    (void)nibble::io::quantized_from_safetensors(file, "<fuzz>");
  } catch (const nibble::UsageError&) {
  }
  return 0;
}
