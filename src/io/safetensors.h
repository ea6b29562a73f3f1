// safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian header
// length N, N bytes of JSON {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
// "__metadata__": {"key": "value"}}, then the tensor bytes (offsets relative to the end of the
// header). The format PyTorch, JAX and numpy users exchange tensors in; nibble stores quantized
// tensors (codes, scales, amax) in it. Malformed files are UsageErrors that name the file and the
// problem; the reader is fuzzed and never crashes or over-allocates on hostile input.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace nibble::io {

enum class DType : uint8_t { BOOL, U8, I8, F8_E4M3, F8_E5M2, F8_E8M0, I16, U16, F16, BF16, I32, U32, F32, I64, U64, F64, C64 };

std::string_view to_string(DType d);
std::optional<DType> parse_dtype(std::string_view name);
size_t dtype_size(DType d);  // bytes per element

struct Tensor {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // product(shape) * dtype_size(dtype) bytes, little-endian

  int64_t element_count() const;
};

struct SafetensorsFile {
  std::map<std::string, std::string> metadata;  // "__metadata__"
  std::map<std::string, Tensor> tensors;

  // Throws UsageError naming the missing tensor / key (with `source` for context).
  const Tensor& tensor(const std::string& name, std::string_view source = "safetensors file") const;
  const std::string& metadata_value(const std::string& key, std::string_view source = "safetensors file") const;
};

// The reference implementation's bound on the header size; a larger claim is treated as corrupt.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100u << 20;

// `source` only labels error messages (a path, or "<memory>").
SafetensorsFile parse_safetensors(std::span<const uint8_t> bytes, std::string_view source);
SafetensorsFile read_safetensors(const std::filesystem::path& path);

// Tensors are laid out in name order; the header is padded with spaces to a multiple of 8 bytes
// so the data is 8-byte aligned (as the reference implementation does). Throws UsageError if a
// tensor's data size does not match its shape and dtype.
std::vector<uint8_t> serialize_safetensors(const SafetensorsFile& file);
// Written atomically (io/atomic_file.h): a failed write leaves no file.
void write_safetensors(const std::filesystem::path& path, const SafetensorsFile& file);

// Helpers for building tensors.
Tensor make_tensor(DType dtype, std::vector<int64_t> shape, std::span<const uint8_t> bytes);
Tensor make_f32_tensor(std::vector<int64_t> shape, std::span<const float> values);

}  // namespace nibble::io
