// safetensors reader/writer: round trips of every dtype, the layout the reference implementation
// expects (8-byte aligned header, contiguous data), and every malformed-header case as a
// UsageError naming the file.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/error.h"
#include "io/safetensors.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;
using nibble::UsageError;
using nibble::io::DType;
using nibble::io::parse_safetensors;
using nibble::io::SafetensorsFile;

namespace {

// A file from a raw header string and data section; `declared_length` overrides the length field.
std::vector<uint8_t> file_bytes(const std::string& header, const std::vector<uint8_t>& data,
                                std::optional<uint64_t> declared_length = std::nullopt) {
  const uint64_t n = declared_length.value_or(header.size());
  std::vector<uint8_t> out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

void expect_rejected(const std::vector<uint8_t>& bytes, const std::string& expected) {
  try {
    parse_safetensors(bytes, "input.safetensors");
    FAIL() << "accepted a malformed file; expected an error containing '" << expected << "'";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("input.safetensors"), std::string::npos) << what;
    EXPECT_NE(what.find(expected), std::string::npos) << "message: " << what << "\nexpected to contain: " << expected;
  }
}

SafetensorsFile sample_file() {
  SafetensorsFile f;
  f.metadata = {{"format", "nvfp4"}, {"rows", "2"}, {"note", "unicode \xC3\xA9 ok"}};
  const std::vector<float> amax = {3.5f};
  f.tensors["amax"] = nibble::io::make_f32_tensor({1}, amax);
  const std::vector<uint8_t> codes = {1, 2, 3, 4, 5, 6};
  f.tensors["codes"] = nibble::io::make_tensor(DType::U8, {2, 3}, codes);
  const std::vector<uint8_t> scales = {0x7E, 0x01};
  f.tensors["scales"] = nibble::io::make_tensor(DType::F8_E4M3, {2, 1}, scales);
  f.tensors["empty"] = nibble::io::make_tensor(DType::F32, {0, 4}, {});
  const std::vector<uint8_t> scalar = {1, 0, 0, 0, 0, 0, 0, 0};
  f.tensors["scalar"] = nibble::io::make_tensor(DType::I64, {}, scalar);
  return f;
}

}  // namespace

TEST(Safetensors, RoundTrip) {
  const SafetensorsFile f = sample_file();
  const std::vector<uint8_t> bytes = nibble::io::serialize_safetensors(f);
  uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), 8);
  EXPECT_EQ(header_length % 8, 0u) << "data should start 8-byte aligned";
  const SafetensorsFile g = parse_safetensors(bytes, "mem");
  EXPECT_EQ(g.metadata, f.metadata);
  ASSERT_EQ(g.tensors.size(), f.tensors.size());
  for (const auto& [name, t] : f.tensors) {
    const auto& u = g.tensor(name);
    EXPECT_EQ(u.dtype, t.dtype) << name;
    EXPECT_EQ(u.shape, t.shape) << name;
    EXPECT_EQ(u.data, t.data) << name;
  }
  EXPECT_EQ(g.metadata_value("format"), "nvfp4");
  EXPECT_THROW(g.tensor("nope"), UsageError);
  EXPECT_THROW(g.metadata_value("nope"), UsageError);
}

TEST(Safetensors, EveryDtypeRoundTrips) {
  for (const char* name : {"BOOL", "U8", "I8", "F8_E4M3", "F8_E5M2", "F8_E8M0", "I16", "U16", "F16", "BF16", "I32",
                           "U32", "F32", "I64", "U64", "F64", "C64"}) {
    std::optional<DType> d = nibble::io::parse_dtype(name);
    ASSERT_TRUE(d) << name;
    EXPECT_EQ(nibble::io::to_string(*d), name);
    SafetensorsFile f;
    std::vector<uint8_t> data(3 * nibble::io::dtype_size(*d));
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7 + 1);
    f.tensors["t"] = nibble::io::make_tensor(*d, {3}, data);
    SafetensorsFile g = parse_safetensors(nibble::io::serialize_safetensors(f), "mem");
    EXPECT_EQ(g.tensor("t").dtype, *d);
    EXPECT_EQ(g.tensor("t").data, data);
  }
  EXPECT_FALSE(nibble::io::parse_dtype("F4"));
  EXPECT_FALSE(nibble::io::parse_dtype("f32"));
}

TEST(Safetensors, ReadsFilesWithoutMetadataAndWithPadding) {
  const std::string header = R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})" + std::string(5, ' ');
  SafetensorsFile f = parse_safetensors(file_bytes(header, {7, 9}), "mem");
  EXPECT_TRUE(f.metadata.empty());
  EXPECT_EQ(f.tensor("x").data, (std::vector<uint8_t>{7, 9}));
  // Data in a different order from the header's keys, and an unreferenced gap: harmless, accepted.
  const std::string reordered =
      R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[3,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  SafetensorsFile g = parse_safetensors(file_bytes(reordered, {1, 2, 0, 4}), "mem");
  EXPECT_EQ(g.tensor("a").data, (std::vector<uint8_t>{4}));
  EXPECT_EQ(g.tensor("b").data, (std::vector<uint8_t>{1, 2}));
  // An empty header object is a valid (empty) file.
  EXPECT_TRUE(parse_safetensors(file_bytes("{}", {}), "mem").tensors.empty());
}

TEST(Safetensors, RejectsBadFraming) {
  expect_rejected({}, "empty");
  expect_rejected({1, 2, 3}, "less than the 8-byte header length");
  expect_rejected(file_bytes("{}", {}, 100), "the header claims 100 bytes but only 2 follow");
  expect_rejected(file_bytes("{}", {}, (100u << 20) + 1), "exceeds the 100 MiB limit");
  expect_rejected(file_bytes("{}", {}, UINT64_MAX), "exceeds the 100 MiB limit");
  expect_rejected(file_bytes("{", {}), "too short");
  expect_rejected(file_bytes("[1, 2, 3]", {}), "does not start with '{'");
  expect_rejected(file_bytes(" {}", {}), "does not start with '{'");
}

TEST(Safetensors, RejectsMalformedJson) {
  const std::pair<std::string, std::string> cases[] = {
      {R"({"x": )", "not valid JSON"},
      {R"({"x": {"dtype": "U8"}} trailing)", "not valid JSON"},
      {"{\"x\xFF\": 1}", "not valid JSON"},  // invalid UTF-8
      {R"({"__metadata__": [1, 2]})", "__metadata__ is not a JSON object"},
      {R"({"__metadata__": {"k": 1}})", "__metadata__ value for 'k' is not a string"},
      {R"({"x": 5})", "tensor 'x': the header entry is not a JSON object"},
      {R"({"x": {"shape": [1], "data_offsets": [0, 1]}})", "'dtype' is missing"},
      {R"({"x": {"dtype": 7, "shape": [1], "data_offsets": [0, 1]}})", "'dtype' is missing or not a string"},
      {R"({"x": {"dtype": "F4", "shape": [1], "data_offsets": [0, 1]}})", "unsupported dtype 'F4'"},
      {R"({"x": {"dtype": "U8", "data_offsets": [0, 1]}})", "'shape' is missing"},
      {R"({"x": {"dtype": "U8", "shape": 1, "data_offsets": [0, 1]}})", "'shape' is missing or not a list"},
      {R"({"x": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]}})", "non-negative integers"},
      {R"({"x": {"dtype": "U8", "shape": [1.0], "data_offsets": [0, 1]}})", "non-negative integers"},
      {R"({"x": {"dtype": "U8", "shape": ["1"], "data_offsets": [0, 1]}})", "non-negative integers"},
      {R"({"x": {"dtype": "U8", "shape": [18446744073709551615], "data_offsets": [0, 1]}})", "overflows int64"},
      {R"({"x": {"dtype": "U8", "shape": [4294967296, 4294967296], "data_offsets": [0, 1]}})", "overflows"},
      {R"({"x": {"dtype": "U8", "shape": [1]}})", "'data_offsets' must be a list of two"},
      {R"({"x": {"dtype": "U8", "shape": [1], "data_offsets": [0]}})", "'data_offsets' must be a list of two"},
      {R"({"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]}})", "'data_offsets' must be a list of two"},
      {R"({"x": {"dtype": "U8", "shape": [1], "data_offsets": [-1, 1]}})", "'data_offsets' must be a list of two"},
      {R"({"x": {"dtype": "U8", "shape": [1], "data_offsets": [2, 1]}})", "run backwards"},
      {R"({"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "extra": 1}})", "unexpected key 'extra'"},
      {R"({"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "x": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})",
       "names 'x' twice"},
  };
  for (const auto& [header, expected] : cases) {
    SCOPED_TRACE(header);
    expect_rejected(file_bytes(header, {1, 2, 3, 4}), expected);
  }
}

TEST(Safetensors, RejectsBadOffsets) {
  // End beyond the data section (a truncated file).
  expect_rejected(file_bytes(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", {1, 2, 3, 4}),
                  "data_offsets end 8 is beyond the 4 data bytes");
  // Size that does not match shape * dtype size.
  expect_rejected(file_bytes(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", {1, 2, 3, 4}),
                  "needs 8 bytes but data_offsets cover 4");
  expect_rejected(file_bytes(R"({"x": {"dtype": "F16", "shape": [3, 0], "data_offsets": [0, 2]}})", {1, 2}),
                  "needs 0 bytes");
  // Overlapping tensors.
  expect_rejected(file_bytes(R"({"a": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]},
                                 "b": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}})",
                             {1, 2, 3, 4}),
                  "overlap");
  expect_rejected(file_bytes(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]},
                                 "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}})",
                             {1, 2, 3, 4}),
                  "overlap");
  // Empty tensors occupy no bytes and never overlap.
  SafetensorsFile f = parse_safetensors(
      file_bytes(R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                     "e": {"dtype": "U8", "shape": [0], "data_offsets": [2, 2]}})",
                 {1, 2, 3, 4}),
      "mem");
  EXPECT_TRUE(f.tensor("e").data.empty());
}

TEST(Safetensors, WriterValidates) {
  SafetensorsFile f;
  nibble::io::Tensor t;
  t.dtype = DType::F32;
  t.shape = {3};
  t.data.resize(8);
  f.tensors["bad"] = t;
  EXPECT_THROW(nibble::io::serialize_safetensors(f), UsageError);
  SafetensorsFile g;
  g.tensors["__metadata__"] = nibble::io::make_tensor(DType::U8, {1}, std::vector<uint8_t>{1});
  EXPECT_THROW(nibble::io::serialize_safetensors(g), UsageError);
  EXPECT_THROW(nibble::io::make_tensor(DType::F32, {2}, std::vector<uint8_t>(7)), UsageError);
}

TEST(Safetensors, FileRoundTripIsAtomic) {
  const fs::path dir = nibble_test::fresh_dir("test_safetensors", "atomic");
  nibble::io::write_safetensors(dir / "a.safetensors", sample_file());
  SafetensorsFile g = nibble::io::read_safetensors(dir / "a.safetensors");
  EXPECT_EQ(g.tensor("codes").data, (std::vector<uint8_t>{1, 2, 3, 4, 5, 6}));
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1);
  // A write that fails validation creates nothing.
  SafetensorsFile bad;
  bad.tensors["x"].shape = {2};
  EXPECT_THROW(nibble::io::write_safetensors(dir / "b.safetensors", bad), UsageError);
  EXPECT_FALSE(fs::exists(dir / "b.safetensors"));
  // Truncating a valid file is reported, naming the file.
  std::vector<uint8_t> bytes = nibble::io::serialize_safetensors(sample_file());
  bytes.resize(bytes.size() - 3);
  try {
    parse_safetensors(bytes, (dir / "cut.safetensors").string());
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("cut.safetensors"), std::string::npos);
  }
  fs::remove_all(dir);
}

// Bytes after the last tensor's data belong to nothing (a file cut and joined, or a header that
// lost a tensor); the .npy reader refuses the same. A gap between tensors stays accepted (above).
TEST(Safetensors, RejectsBytesAfterTheLastTensor) {
  const std::string header = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  EXPECT_EQ(parse_safetensors(file_bytes(header, {1, 2}), "mem").tensor("a").data, (std::vector<uint8_t>{1, 2}));
  expect_rejected(file_bytes(header, {1, 2, 3}), "1 unexpected bytes after the last tensor's data");
  expect_rejected(file_bytes("{}", {9, 9}), "2 unexpected bytes after the last tensor's data");
  const std::string empty_tensor = R"({"e":{"dtype":"U8","shape":[0],"data_offsets":[1,1]}})";
  expect_rejected(file_bytes(empty_tensor, {7}), "1 unexpected bytes");
}

// A reader of a sized file takes only regular files: /dev/zero would be read until memory ran out.
TEST(Safetensors, ReadsOnlyRegularFiles) {
  try {
    nibble::io::read_safetensors("/dev/zero");
    FAIL() << "/dev/zero was read";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/zero is a device, not a safetensors file"), std::string::npos) << e.what();
  }
  const fs::path dir = nibble_test::fresh_dir("test_safetensors", "fifo");
  ASSERT_EQ(::mkfifo((dir / "pipe").c_str(), 0600), 0);
  try {
    nibble::io::read_safetensors(dir / "pipe");  // refused without waiting for a writer
    FAIL() << "a FIFO was read";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("is a FIFO (pipe), not a safetensors file"), std::string::npos) << e.what();
  }
}
