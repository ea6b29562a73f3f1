// .npy reader/writer: round trips, the numpy header variants seen in the wild, float16 widening,
// and every way a header or file can be malformed (each must be a UsageError naming the file).
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "io/atomic_file.h"
#include "io/npy.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;
using nibble::UsageError;
using nibble::io::NpyArray;
using nibble::io::parse_npy;

namespace {

// A .npy file from its parts: version, header text (unpadded) and raw data bytes.
std::vector<uint8_t> npy_bytes(const std::string& header, const std::vector<uint8_t>& data, int major = 1,
                               int minor = 0) {
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<uint8_t>(major), static_cast<uint8_t>(minor)};
  const int length_bytes = major == 1 ? 2 : 4;
  for (int i = 0; i < length_bytes; ++i) out.push_back(static_cast<uint8_t>(header.size() >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

std::vector<uint8_t> float_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::string header_for(const std::string& descr, const std::string& shape, const std::string& fortran = "False") {
  return "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }\n";
}

// Parsing must fail with a UsageError whose message names the source and contains `expected`.
void expect_rejected(const std::vector<uint8_t>& bytes, const std::string& expected) {
  try {
    parse_npy(bytes, "input.npy");
    FAIL() << "accepted a malformed file; expected an error containing '" << expected << "'";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("input.npy"), std::string::npos) << what;
    EXPECT_NE(what.find(expected), std::string::npos) << "message: " << what << "\nexpected to contain: " << expected;
  }
}

fs::path fresh_dir(const std::string& name) { return nibble_test::fresh_dir("test_npy", name); }

}  // namespace

TEST(Npy, RoundTripShapes) {
  const std::vector<std::vector<int64_t>> shapes = {{3, 4}, {7}, {}, {2, 3, 4}, {0, 5}, {1, 1}};
  for (const auto& shape : shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(i) * 0.37f - 1.5f;
    std::vector<uint8_t> bytes = nibble::io::serialize_npy(v, shape);
    // numpy's convention: the data starts 64-byte aligned and the header ends with a newline.
    const size_t header_len = bytes[8] | (bytes[9] << 8);
    EXPECT_EQ((10 + header_len) % 64, 0u);
    EXPECT_EQ(bytes[10 + header_len - 1], '\n');
    NpyArray a = parse_npy(bytes, "mem");
    EXPECT_EQ(a.shape, shape);
    EXPECT_EQ(a.data, v);
    EXPECT_EQ(a.stored_dtype, nibble::io::NpyDType::float32);
  }
}

TEST(Npy, PreservesSpecialValuesBitExactly) {
  std::vector<float> v = {0.0f, -0.0f, INFINITY, -INFINITY, std::bit_cast<float>(0x7FC01234u), 1e-45f, 3.4e38f, -2.5f};
  const int64_t shape[] = {2, 4};
  NpyArray a = parse_npy(nibble::io::serialize_npy(v, shape), "mem");
  ASSERT_EQ(a.data.size(), v.size());
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(std::bit_cast<uint32_t>(a.data[i]), std::bit_cast<uint32_t>(v[i]));
}

TEST(Npy, WriterRejectsShapeDataMismatch) {
  std::vector<float> v(5);
  const int64_t shape[] = {2, 3};
  EXPECT_THROW(nibble::io::serialize_npy(v, shape), UsageError);
}

TEST(Npy, ReadsVersions2And3AndHeaderVariants) {
  const std::vector<float> v = {1, 2, 3, 4, 5, 6};
  for (int major : {1, 2, 3}) {
    NpyArray a = parse_npy(npy_bytes(header_for("<f4", "(2, 3)"), float_bytes(v), major), "mem");
    EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(a.data, v);
  }
  // Key order, double quotes, no trailing comma, Python 2 longs, extra whitespace, no newline.
  const std::string variants[] = {
      "{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}",
      "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2, 3)}",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }          \n",
      "  { 'descr' : '<f4' ,\t'fortran_order' : False , 'shape' : ( 2 , 3 , ) }  ",
  };
  for (const auto& h : variants) {
    NpyArray a = parse_npy(npy_bytes(h, float_bytes(v)), "mem");
    EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3})) << h;
    EXPECT_EQ(a.data, v) << h;
  }
}

TEST(Npy, Float16WidensExactly) {
  // Every binary16 bit pattern, against the definition: (-1)^s * 2^(e-15) * (1 + m/1024), and
  // 2^-14 * m/1024 for subnormals.
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float got = nibble::io::float16_bits_to_float(static_cast<uint16_t>(bits));
    const int sign = bits >> 15, exponent = (bits >> 10) & 0x1F, mantissa = bits & 0x3FF;
    if (exponent == 0x1F) {
      if (mantissa == 0) EXPECT_TRUE(std::isinf(got)) << bits;
      else EXPECT_TRUE(std::isnan(got)) << bits;
      EXPECT_EQ(std::signbit(got), sign == 1) << bits;
      continue;
    }
    double expected = exponent == 0 ? std::ldexp(mantissa, -24) : std::ldexp(1024 + mantissa, exponent - 25);
    if (sign) expected = -expected;
    EXPECT_EQ(static_cast<double>(got), expected) << bits;
    EXPECT_EQ(std::signbit(got), sign == 1) << bits;
#if defined(__FLT16_MAX__)
    _Float16 h;
    const uint16_t b16 = static_cast<uint16_t>(bits);
    std::memcpy(&h, &b16, 2);
    EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(static_cast<float>(h))) << bits;
#endif
  }
}

TEST(Npy, ReadsFloat16Files) {
  // 1.0, -2.0, 65504 (max), 2^-24 (smallest subnormal)
  const std::vector<uint8_t> data = {0x00, 0x3C, 0x00, 0xC0, 0xFF, 0x7B, 0x01, 0x00};
  NpyArray a = parse_npy(npy_bytes(header_for("<f2", "(2, 2)"), data), "mem");
  EXPECT_EQ(a.stored_dtype, nibble::io::NpyDType::float16);
  EXPECT_EQ(a.data, (std::vector<float>{1.0f, -2.0f, 65504.0f, 0x1p-24f}));
}

TEST(Npy, RejectsMalformedPreamble) {
  const std::vector<uint8_t> good = npy_bytes(header_for("<f4", "(1,)"), float_bytes({1.0f}));
  expect_rejected({}, "empty");
  expect_rejected({0x93, 'N', 'U'}, "not a .npy file");
  std::vector<uint8_t> bad_magic = good;
  bad_magic[1] = 'X';
  expect_rejected(bad_magic, "not a .npy file");
  expect_rejected(std::vector<uint8_t>(good.begin(), good.begin() + 9), "truncated");
  std::vector<uint8_t> v4 = good;
  v4[6] = 4;
  expect_rejected(v4, "unsupported .npy format version 4.0");
  std::vector<uint8_t> minor = good;
  minor[7] = 1;
  expect_rejected(minor, "unsupported .npy format version 1.1");
  // Version 2 needs a 4-byte length: 11 bytes total cannot hold it.
  expect_rejected({0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 5, 0, 0}, "header length field is incomplete");
  std::vector<uint8_t> long_header = good;
  long_header[8] = 0xFF;
  long_header[9] = 0xFF;
  expect_rejected(long_header, "the header claims 65535 bytes");
  // Version 2 length beyond the file (4 GiB - 1).
  std::vector<uint8_t> v2 = npy_bytes(header_for("<f4", "(1,)"), float_bytes({1.0f}), 2);
  v2[8] = v2[9] = v2[10] = v2[11] = 0xFF;
  expect_rejected(v2, "the header claims 4294967295 bytes");
}

TEST(Npy, RejectsUnsupportedDtypesAndLayouts) {
  const std::vector<uint8_t> four = float_bytes({1, 2, 3, 4});
  expect_rejected(npy_bytes(header_for(">f4", "(4,)"), four), "big-endian");
  expect_rejected(npy_bytes(header_for(">f2", "(4,)"), four), "big-endian");
  expect_rejected(npy_bytes(header_for("<f8", "(2,)"), four), "float64");
  expect_rejected(npy_bytes(header_for("<i4", "(4,)"), four), "unsupported dtype '<i4'");
  expect_rejected(npy_bytes(header_for("|u1", "(16,)"), four), "unsupported dtype");
  expect_rejected(npy_bytes(header_for("<f4", "(2, 2)", "True"), four), "Fortran-order");
  expect_rejected(npy_bytes("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (4,), }", four),
                  "structured dtypes");
}

TEST(Npy, RejectsMalformedHeaders) {
  const std::vector<uint8_t> four = float_bytes({1, 2, 3, 4});
  const std::pair<std::string, std::string> cases[] = {
      {"", "expected '{' but the header ended"},
      {"[1, 2]", "expected '{'"},
      {"{'descr': '<f4', 'fortran_order': False}", "'shape' is missing"},
      {"{'fortran_order': False, 'shape': (4,)}", "'descr' is missing"},
      {"{'descr': '<f4', 'shape': (4,)}", "'fortran_order' is missing"},
      {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (4,)}", "repeats the key 'descr'"},
      {"{'descr': '<f4', 'fortran_order': False, 'fortran_order': False, 'shape': (4,)}", "repeats the key"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'shape': (4,)}", "repeats the key 'shape'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'extra': 1}", "unexpected key 'extra'"},
      {"{'descr': '<f4, 'fortran_order': False, 'shape': (4,)}", "',' or '}'"},
      {"{'descr' '<f4', 'fortran_order': False, 'shape': (4,)}", "expected ':'"},
      {"{'descr': '<f4", "unterminated string"},
      {"{'descr': '<f\\x34', 'fortran_order': False, 'shape': (4,)}", "escape sequences"},
      {"{descr: '<f4'}", "a quoted string"},
      {"{'descr': '<f4', 'fortran_order': maybe, 'shape': (4,)}", "True or False"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': [4]}", "expected '('"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (-4,)}", "non-negative integer"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (4.0,)}", "',' or ')'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (4,", "but the header ended"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", "overflows 64 bits"},
      {"{'descr': '<f4' 'fortran_order': False, 'shape': (4,)}", "',' or '}'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (4,)} trailing", "unexpected text after"},
      {"{'descr': 1, 'fortran_order': False, 'shape': (4,)}", "a quoted string"},
  };
  for (const auto& [header, expected] : cases) {
    SCOPED_TRACE(header);
    expect_rejected(npy_bytes(header, four), expected);
  }
  std::string many_dims = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  for (int i = 0; i < 70; ++i) many_dims += "1, ";
  expect_rejected(npy_bytes(many_dims + ")}", four), "more than 64 dimensions");
}

TEST(Npy, RejectsDataSizeMismatchAndOverflow) {
  const std::vector<uint8_t> four = float_bytes({1, 2, 3, 4});
  expect_rejected(npy_bytes(header_for("<f4", "(5,)"), four), "truncated .npy file: the shape needs 20 data bytes but only 16");
  expect_rejected(npy_bytes(header_for("<f4", "(3,)"), four), "4 unexpected bytes after the data");
  expect_rejected(npy_bytes(header_for("<f2", "(3,)"), {1, 2, 3}), "needs 6 data bytes but only 3");
  // Element count overflowing 64 bits, and byte size overflowing after * itemsize.
  expect_rejected(npy_bytes(header_for("<f4", "(4294967296, 4294967296)"), four), "element count overflows");
  expect_rejected(npy_bytes(header_for("<f4", "(4611686018427387904,)"), four), "byte size overflows");
  // Huge but representable: must be reported as truncated, not allocated.
  expect_rejected(npy_bytes(header_for("<f4", "(1000000000, 1000000)"), four), "truncated");
  // A zero dimension with leftover data is still a mismatch.
  expect_rejected(npy_bytes(header_for("<f4", "(0, 1000000000000)"), four), "unexpected bytes after the data");
}

TEST(Npy, FileErrorsNameTheFile) {
  fs::path dir = fresh_dir("files");
  try {
    nibble::io::read_npy(dir / "missing.npy");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("missing.npy"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("No such file"), std::string::npos) << e.what();
  }
  try {
    nibble::io::read_npy(dir);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(dir.string()), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(Npy, WriteIsAtomicAndLeavesNoTemporary) {
  fs::path dir = fresh_dir("atomic");
  const std::vector<float> v = {1, 2, 3, 4, 5, 6};
  const int64_t shape[] = {2, 3};
  nibble::io::write_npy(dir / "out.npy", v, shape);
  // Overwrite with different content: readers see the new file whole.
  const std::vector<float> w = {9, 8};
  const int64_t shape_w[] = {2};
  nibble::io::write_npy(dir / "out.npy", w, shape_w);
  NpyArray a = nibble::io::read_npy(dir / "out.npy");
  EXPECT_EQ(a.data, w);
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1);
  // Writing into a directory that does not exist fails cleanly.
  EXPECT_THROW(nibble::io::write_npy(dir / "no" / "such" / "dir.npy", v, shape), UsageError);
  fs::remove_all(dir);
}

TEST(AtomicFile, UncommittedWriterLeavesNothing) {
  fs::path dir = fresh_dir("uncommitted");
  {
    nibble::io::AtomicFileWriter writer(dir / "partial.bin");
    const uint8_t bytes[] = {1, 2, 3};
    writer.write(bytes);
    EXPECT_TRUE(fs::exists(writer.temporary()));
    EXPECT_FALSE(fs::exists(dir / "partial.bin"));
  }  // destroyed without commit(), as when an exception unwinds
  EXPECT_TRUE(fs::is_empty(dir));
  // A committed write leaves exactly the target.
  {
    nibble::io::AtomicFileWriter writer(dir / "whole.bin");
    const uint8_t bytes[] = {4, 5};
    writer.write(bytes);
    writer.commit();
  }
  EXPECT_EQ(nibble::io::read_file_bytes(dir / "whole.bin"), (std::vector<uint8_t>{4, 5}));
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1);
  fs::remove_all(dir);
}

TEST(Npy, ReadsOnlyRegularFiles) {
  try {
    nibble::io::read_npy("/dev/zero");
    FAIL() << "/dev/zero was read";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/zero is a device, not a .npy file"), std::string::npos) << e.what();
  }
}
