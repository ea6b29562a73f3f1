// NumPy .npy files (format versions 1.0, 2.0 and 3.0): the way researchers hand tensors to and
// from numpy, PyTorch and JAX. Reads little-endian float32 ('<f4') and float16 ('<f2', widened to
// float32 exactly), C order, any rank; writes float32. Every malformed file is reported as a
// UsageError naming the file and the problem: the readers are fuzzed and never crash.
#pragma once
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace nibble::io {

enum class NpyDType : uint8_t { float32, float16 };

struct NpyArray {
  std::vector<int64_t> shape;  // empty for a 0-d (scalar) array
  std::vector<float> data;     // row-major (C order), product(shape) values
  NpyDType stored_dtype = NpyDType::float32;  // what the file held before widening to float32

  int64_t element_count() const { return static_cast<int64_t>(data.size()); }
};

// `source_name` only labels error messages (a path, or "<memory>").
NpyArray parse_npy(std::span<const uint8_t> bytes, std::string_view source_name);
NpyArray read_npy(const std::filesystem::path& path);

// Version 1.0 (2.0 when the header would not fit in 65535 bytes), '<f4', C order.
std::vector<uint8_t> serialize_npy(std::span<const float> data, std::span<const int64_t> shape);
// Written atomically (io/atomic_file.h): a failed write leaves no file.
void write_npy(const std::filesystem::path& path, std::span<const float> data, std::span<const int64_t> shape);

// IEEE binary16 bits to float32; exact for every input (subnormals, infinities, NaN payloads).
float float16_bits_to_float(uint16_t bits);

}  // namespace nibble::io
