#include "io/safetensors.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <vector>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "io/atomic_file.h"
#include "io/regular_file.h"

namespace nibble::io {
namespace {

using nlohmann::json;

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::BOOL, "BOOL", 1},       {DType::U8, "U8", 1},           {DType::I8, "I8", 1},
    {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1}, {DType::F8_E8M0, "F8_E8M0", 1},
    {DType::I16, "I16", 2},         {DType::U16, "U16", 2},         {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2},       {DType::I32, "I32", 4},         {DType::U32, "U32", 4},
    {DType::F32, "F32", 4},         {DType::I64, "I64", 8},         {DType::U64, "U64", 8},
    {DType::F64, "F64", 8},         {DType::C64, "C64", 8},
};

constexpr std::string_view kMetadataKey = "__metadata__";

[[noreturn]] void fail(std::string_view source, const std::string& what) {
  throw UsageError(std::string(source) + ": " + what);
}

// Untrusted names and parser messages are shown printable-ASCII only and bounded.
std::string printable(std::string_view s, size_t limit = 60) {
  std::string out;
  for (char c : s.substr(0, limit)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (s.size() > limit) out += "...";
  return out;
}

// Element count of a shape, or nullopt when it overflows int64.
std::optional<uint64_t> element_count_of(std::span<const int64_t> shape) {
  uint64_t count = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(count, static_cast<uint64_t>(d), &count)) return std::nullopt;
  }
  if (count > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return count;
}

// Bytes a tensor of this shape and dtype occupies, or nullopt on overflow.
std::optional<uint64_t> byte_size_of(std::span<const int64_t> shape, DType dtype) {
  std::optional<uint64_t> count = element_count_of(shape);
  uint64_t bytes = 0;
  if (!count || __builtin_mul_overflow(*count, dtype_size(dtype), &bytes)) return std::nullopt;
  return bytes;
}

std::string shape_text(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

struct PendingTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};

PendingTensor parse_tensor_entry(const std::string& name, const json& entry, uint64_t buffer_size,
                                 std::string_view source) {
  const std::string where = "tensor '" + printable(name) + "'";
  if (!entry.is_object()) fail(source, where + ": the header entry is not a JSON object");
  for (const auto& [key, value] : entry.items()) {
    (void)value;
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      fail(source, where + ": unexpected key '" + printable(key) + "' (expected dtype, shape, data_offsets)");
  }
  PendingTensor t;
  t.name = name;

  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) fail(source, where + ": 'dtype' is missing or not a string");
  const auto& dtype_name = dtype_it->get_ref<const std::string&>();
  std::optional<DType> dtype = parse_dtype(dtype_name);
  if (!dtype) fail(source, where + ": unsupported dtype '" + printable(dtype_name) + "'");
  t.dtype = *dtype;

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) fail(source, where + ": 'shape' is missing or not a list");
  for (const json& d : *shape_it) {
    if (!d.is_number_unsigned()) fail(source, where + ": 'shape' must hold non-negative integers");
    const uint64_t v = d.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) fail(source, where + ": a dimension overflows int64");
    t.shape.push_back(static_cast<int64_t>(v));
  }

  auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned())
    fail(source, where + ": 'data_offsets' must be a list of two non-negative integers [begin, end]");
  t.begin = (*offsets_it)[0].get<uint64_t>();
  t.end = (*offsets_it)[1].get<uint64_t>();
  if (t.begin > t.end)
    fail(source, where + ": data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "] run backwards");
  if (t.end > buffer_size)
    fail(source, where + ": data_offsets end " + std::to_string(t.end) + " is beyond the " +
                     std::to_string(buffer_size) + " data bytes in the file (truncated file?)");

  std::optional<uint64_t> byte_size = byte_size_of(t.shape, t.dtype);
  if (!byte_size) fail(source, where + ": shape " + shape_text(t.shape) + " overflows");
  const uint64_t expected_bytes = *byte_size;
  if (expected_bytes != t.end - t.begin)
    fail(source, where + ": shape " + shape_text(t.shape) + " of " + std::string(to_string(t.dtype)) + " needs " +
                     std::to_string(expected_bytes) + " bytes but data_offsets cover " +
                     std::to_string(t.end - t.begin));
  return t;
}

}  // namespace

std::string_view to_string(DType d) {
  for (const auto& info : kDTypes)
    if (info.dtype == d) return info.name;
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& info : kDTypes)
    if (info.name == name) return info.dtype;
  return std::nullopt;
}

size_t dtype_size(DType d) {
  for (const auto& info : kDTypes)
    if (info.dtype == d) return info.size;
  return 1;
}

int64_t Tensor::element_count() const {
  std::optional<uint64_t> n = element_count_of(shape);
  return n ? static_cast<int64_t>(*n) : -1;
}

const Tensor& SafetensorsFile::tensor(const std::string& name, std::string_view source) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) fail(source, "the tensor '" + name + "' is missing");
  return it->second;
}

const std::string& SafetensorsFile::metadata_value(const std::string& key, std::string_view source) const {
  auto it = metadata.find(key);
  if (it == metadata.end()) fail(source, "the metadata key '" + key + "' is missing from __metadata__");
  return it->second;
}

SafetensorsFile parse_safetensors(std::span<const uint8_t> bytes, std::string_view source) {
  if (bytes.size() < 8)
    fail(source, bytes.empty() ? "the file is empty (expected a safetensors file)"
                               : "truncated safetensors file: " + std::to_string(bytes.size()) +
                                     " bytes, less than the 8-byte header length");
  uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | bytes[static_cast<size_t>(i)];
  if (header_length > kMaxSafetensorsHeaderBytes)
    fail(source, "not a safetensors file: the header length " + std::to_string(header_length) +
                     " exceeds the 100 MiB limit");
  if (header_length > bytes.size() - 8)
    fail(source, "truncated safetensors file: the header claims " + std::to_string(header_length) +
                     " bytes but only " + std::to_string(bytes.size() - 8) + " follow");
  if (header_length < 2) fail(source, "not a safetensors file: the header is too short to hold a JSON object");
  const auto* header_begin = reinterpret_cast<const char*>(bytes.data() + 8);
  if (header_begin[0] != '{') fail(source, "not a safetensors file: the header does not start with '{'");

  // JSON allows repeated keys and nlohmann keeps the last one silently; a safetensors header with
  // a repeated tensor name is ambiguous (which data is meant?), so it is rejected.
  std::string repeated_name;
  std::set<std::string> top_level_names;
  auto note_top_level_keys = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth == 1 && event == json::parse_event_t::key && repeated_name.empty() &&
        !top_level_names.insert(parsed.get<std::string>()).second)
      repeated_name = parsed.get<std::string>();
    return true;
  };
  json header;
  try {
    header = json::parse(header_begin, header_begin + header_length, note_top_level_keys);
  } catch (const json::exception& e) {
    fail(source, "the safetensors header is not valid JSON: " + printable(e.what(), 200));
  }
  if (!header.is_object()) fail(source, "the safetensors header is not a JSON object");
  if (!repeated_name.empty()) fail(source, "the safetensors header names '" + printable(repeated_name) + "' twice");

  const std::span<const uint8_t> buffer = bytes.subspan(8 + static_cast<size_t>(header_length));
  SafetensorsFile file;
  std::vector<PendingTensor> pending;
  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey) {
      if (!entry.is_object()) fail(source, "__metadata__ is not a JSON object of strings");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) fail(source, "__metadata__ value for '" + printable(key) + "' is not a string");
        file.metadata.emplace(key, value.get<std::string>());
      }
      continue;
    }
    pending.push_back(parse_tensor_entry(name, entry, buffer.size(), source));
  }

  // Two tensors must never share bytes (a reader writing one would corrupt the other, and a
  // crafted file could alias data). Empty tensors occupy no bytes and cannot overlap anything.
  std::vector<const PendingTensor*> by_offset;
  for (const auto& t : pending)
    if (t.end > t.begin) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const PendingTensor* a, const PendingTensor* b) {
    return a->begin < b->begin;
  });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->begin < by_offset[i - 1]->end)
      fail(source, "tensors '" + printable(by_offset[i - 1]->name) + "' and '" + printable(by_offset[i]->name) +
                       "' overlap in the data section");
  // Bytes after the last tensor belong to nothing: a file cut and joined, or one whose header lost a
  // tensor (the reference implementation and the .npy reader refuse them too).
  const uint64_t used = by_offset.empty() ? 0 : by_offset.back()->end;
  if (used < buffer.size())
    fail(source, "the file has " + std::to_string(buffer.size() - used) +
                     " unexpected bytes after the last tensor's data (a damaged file, or a header that lost a tensor)");

  for (auto& t : pending) {
    Tensor tensor;
    tensor.dtype = t.dtype;
    tensor.shape = std::move(t.shape);
    tensor.data.assign(buffer.begin() + static_cast<std::ptrdiff_t>(t.begin),
                       buffer.begin() + static_cast<std::ptrdiff_t>(t.end));
    file.tensors.emplace(std::move(t.name), std::move(tensor));
  }
  return file;
}

SafetensorsFile read_safetensors(const std::filesystem::path& path) {
  std::vector<uint8_t> bytes = read_regular_file(path, "a safetensors file");
  return parse_safetensors(bytes, path.string());
}

std::vector<uint8_t> serialize_safetensors(const SafetensorsFile& file) {
  json header = json::object();
  if (!file.metadata.empty()) {
    json metadata = json::object();
    for (const auto& [key, value] : file.metadata) metadata[key] = value;
    header[std::string(kMetadataKey)] = std::move(metadata);
  }
  uint64_t offset = 0;
  for (const auto& [name, tensor] : file.tensors) {
    if (name == kMetadataKey) throw UsageError("a tensor cannot be named __metadata__");
    std::optional<uint64_t> byte_size = byte_size_of(tensor.shape, tensor.dtype);
    if (!byte_size || *byte_size != tensor.data.size())
      throw UsageError("tensor '" + name + "': shape " + shape_text(tensor.shape) + " of " +
                       std::string(to_string(tensor.dtype)) + " does not match its " +
                       std::to_string(tensor.data.size()) + " data bytes");
    header[name] = {{"dtype", std::string(to_string(tensor.dtype))},
                    {"shape", tensor.shape},
                    {"data_offsets", {offset, offset + tensor.data.size()}}};
    offset += tensor.data.size();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {
    throw UsageError(std::string("cannot write safetensors header: ") + e.what());  // e.g. invalid UTF-8 names
  }
  text.append((8 - text.size() % 8) % 8, ' ');

  std::vector<uint8_t> out;
  out.reserve(8 + text.size() + offset);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i)));
  out.insert(out.end(), text.begin(), text.end());
  for (const auto& [name, tensor] : file.tensors) out.insert(out.end(), tensor.data.begin(), tensor.data.end());
  return out;
}

void write_safetensors(const std::filesystem::path& path, const SafetensorsFile& file) {
  write_file_atomically(path, serialize_safetensors(file));
}

Tensor make_tensor(DType dtype, std::vector<int64_t> shape, std::span<const uint8_t> bytes) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data.assign(bytes.begin(), bytes.end());
  std::optional<uint64_t> byte_size = byte_size_of(t.shape, dtype);
  if (!byte_size || *byte_size != t.data.size())
    throw UsageError("make_tensor: shape " + shape_text(t.shape) + " of " + std::string(to_string(dtype)) +
                     " does not match " + std::to_string(t.data.size()) + " bytes");
  return t;
}

Tensor make_f32_tensor(std::vector<int64_t> shape, std::span<const float> values) {
  const auto* raw = reinterpret_cast<const uint8_t*>(values.data());
  return make_tensor(DType::F32, std::move(shape), std::span<const uint8_t>(raw, values.size() * sizeof(float)));
}

}  // namespace nibble::io
