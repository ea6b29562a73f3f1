// .npy format: "\x93NUMPY", major, minor, header length (uint16 LE for 1.0, uint32 LE for 2.0/3.0),
// then a Python dict literal {'descr': ..., 'fortran_order': ..., 'shape': (...), } padded with
// spaces and a newline, then the raw data. The header is parsed by a small strict parser for just
// that literal grammar rather than anything general, so hostile headers cannot do much.
#include "io/npy.h"

#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "io/atomic_file.h"
#include "io/regular_file.h"

namespace nibble::io {

// The data is copied byte for byte into host floats; nibble only targets little-endian hosts.
static_assert(std::endian::native == std::endian::little, "nibble::io assumes a little-endian host");

namespace {

constexpr uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

[[noreturn]] void fail(std::string_view source, const std::string& what) {
  throw UsageError(std::string(source) + ": " + what);
}

// Quote a piece of untrusted header text for an error message: printable ASCII only, bounded.
std::string excerpt(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 40)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (s.size() > 40) out += "...";
  return out;
}

struct NpyHeader {
  std::optional<std::string> descr;
  std::optional<bool> fortran_order;
  std::optional<std::vector<int64_t>> shape;
};

// Recursive-descent parser for the header's dict literal.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, std::string_view source) : text_(text), source_(source) {}

  NpyHeader parse() {
    NpyHeader h;
    skip_space();
    expect('{');
    for (;;) {
      skip_space();
      if (peek() == '}') break;
      std::string key = parse_string("a dictionary key");
      skip_space();
      expect(':');
      skip_space();
      if (key == "descr") {
        if (h.descr) fail("the header repeats the key 'descr'");
        if (peek() == '[') fail("structured dtypes (descr is a list) are not supported; save a plain float32 array");
        h.descr = parse_string("the value of 'descr'");
      } else if (key == "fortran_order") {
        if (h.fortran_order) fail("the header repeats the key 'fortran_order'");
        h.fortran_order = parse_bool();
      } else if (key == "shape") {
        if (h.shape) fail("the header repeats the key 'shape'");
        h.shape = parse_shape();
      } else {
        fail("unexpected key '" + excerpt(key) + "' in the header (expected descr, fortran_order, shape)");
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() != '}') fail_here("',' or '}'");
    }
    ++pos_;  // '}'
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the header dictionary: '" + excerpt(text_.substr(pos_)) + "'");
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { io::fail(source_, "malformed .npy header: " + what); }
  [[noreturn]] void fail_here(const std::string& expected) const {
    if (pos_ >= text_.size()) fail("expected " + expected + " but the header ended");
    fail("expected " + expected + " at header offset " + std::to_string(pos_) + " but found '" +
         excerpt(text_.substr(pos_)) + "'");
  }

  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }
  void expect(char c) {
    if (peek() != c || pos_ >= text_.size()) fail_here(std::string("'") + c + "'");
    ++pos_;
  }
  bool consume_word(std::string_view w) {
    if (text_.substr(pos_, w.size()) != w) return false;
    pos_ += w.size();
    return true;
  }

  // Python string literal in single or double quotes. numpy's keys and dtype strings never need
  // escapes, so a backslash is rejected rather than half-interpreted.
  std::string parse_string(const std::string& what) {
    char quote = peek();
    if (quote != '\'' && quote != '"') fail_here("a quoted string for " + what);
    size_t start = ++pos_;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      if (text_[pos_] == '\\') fail("escape sequences in header strings are not supported");
      ++pos_;
    }
    if (pos_ >= text_.size()) fail("unterminated string in the header");
    std::string s(text_.substr(start, pos_ - start));
    ++pos_;
    return s;
  }

  bool parse_bool() {
    if (consume_word("True")) return true;
    if (consume_word("False")) return false;
    fail_here("True or False for 'fortran_order'");
  }

  // A tuple of non-negative integers: (), (5,), (3, 4). Python 2 era files write longs as "3L".
  std::vector<int64_t> parse_shape() {
    expect('(');
    std::vector<int64_t> dims;
    for (;;) {
      skip_space();
      if (peek() == ')') break;
      dims.push_back(parse_dimension());
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() != ')') fail_here("',' or ')' in 'shape'");
    }
    ++pos_;
    // "(5)" is an int in Python, not a tuple; numpy always writes the comma for one dimension.
    return dims;
  }

  int64_t parse_dimension() {
    if (peek() < '0' || peek() > '9') fail_here("a non-negative integer dimension in 'shape'");
    int64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      int digit = peek() - '0';
      if (v > (std::numeric_limits<int64_t>::max() - digit) / 10) fail("a dimension in 'shape' overflows 64 bits");
      v = v * 10 + digit;
      ++pos_;
    }
    if (peek() == 'L') ++pos_;
    if (++dims_seen_ > 64) fail("'shape' has more than 64 dimensions");
    return v;
  }

  std::string_view text_;
  std::string_view source_;
  size_t pos_ = 0;
  int dims_seen_ = 0;
};

uint32_t read_le(const uint8_t* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

NpyDType dtype_from_descr(const std::string& descr, std::string_view source) {
  if (descr == "<f4") return NpyDType::float32;
  if (descr == "<f2") return NpyDType::float16;
  const std::string shown = excerpt(descr);
  if (descr.size() == 3 && descr[0] == '>')
    fail(source, "big-endian data (dtype '" + shown + "') is not supported; convert with x.astype('<" +
                     descr.substr(1) + "')");
  if (descr == "<f8" || descr == "|f8")
    fail(source, "dtype float64 ('<f8') is not supported; convert with x.astype(numpy.float32)");
  fail(source, "unsupported dtype '" + shown + "': nibble reads float32 ('<f4') and float16 ('<f2')");
}

}  // namespace

float float16_bits_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1Fu;
  const uint32_t mantissa = bits & 0x3FFu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float32 (which has 8 more exponent bits).
    float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));  // inf / NaN
  return std::bit_cast<float>(sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13));
}

NpyArray parse_npy(std::span<const uint8_t> bytes, std::string_view source) {
  if (bytes.empty()) fail(source, "the file is empty (expected a .npy file)");
  if (bytes.size() < 10 || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    fail(source, bytes.size() < sizeof kMagic || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0
                     ? "not a .npy file (it does not start with \\x93NUMPY)"
                     : "truncated .npy file (" + std::to_string(bytes.size()) + " bytes, shorter than the preamble)");
  const int major = bytes[6], minor = bytes[7];
  if ((major != 1 && major != 2 && major != 3) || minor != 0)
    fail(source, "unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor) +
                     " (nibble reads 1.0, 2.0 and 3.0)");
  const int length_bytes = major == 1 ? 2 : 4;
  const size_t header_start = 8 + static_cast<size_t>(length_bytes);
  if (bytes.size() < header_start) fail(source, "truncated .npy file: the header length field is incomplete");
  const size_t header_length = read_le(bytes.data() + 8, length_bytes);
  if (header_length > bytes.size() - header_start)
    fail(source, "truncated .npy file: the header claims " + std::to_string(header_length) + " bytes but only " +
                     std::to_string(bytes.size() - header_start) + " follow");
  const std::string_view header_text(reinterpret_cast<const char*>(bytes.data() + header_start), header_length);
  NpyHeader header = HeaderParser(header_text, source).parse();
  if (!header.descr) fail(source, "malformed .npy header: the key 'descr' is missing");
  if (!header.fortran_order) fail(source, "malformed .npy header: the key 'fortran_order' is missing");
  if (!header.shape) fail(source, "malformed .npy header: the key 'shape' is missing");

  NpyArray array;
  array.stored_dtype = dtype_from_descr(*header.descr, source);
  if (*header.fortran_order)
    fail(source, "Fortran-order (column-major) arrays are not supported; save numpy.ascontiguousarray(x)");
  array.shape = std::move(*header.shape);

  const size_t item_size = array.stored_dtype == NpyDType::float32 ? 4 : 2;
  uint64_t count = 1;
  for (int64_t d : array.shape)
    if (__builtin_mul_overflow(count, static_cast<uint64_t>(d), &count))
      fail(source, "the shape's element count overflows 64 bits");
  uint64_t data_bytes = 0;
  if (__builtin_mul_overflow(count, item_size, &data_bytes) || count > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    fail(source, "the shape's byte size overflows 64 bits");
  const size_t data_start = header_start + header_length;
  const uint64_t present = bytes.size() - data_start;
  if (present < data_bytes)
    fail(source, "truncated .npy file: the shape needs " + std::to_string(data_bytes) + " data bytes but only " +
                     std::to_string(present) + " are present");
  if (present > data_bytes)
    fail(source, "the file has " + std::to_string(present - data_bytes) +
                     " unexpected bytes after the data (corrupt file, or a shape that does not match the data)");

  const uint8_t* data = bytes.data() + data_start;
  array.data.resize(static_cast<size_t>(count));
  if (array.stored_dtype == NpyDType::float32) {
    if (count) std::memcpy(array.data.data(), data, static_cast<size_t>(data_bytes));
  } else {
    for (size_t i = 0; i < count; ++i) {
      uint16_t h;
      std::memcpy(&h, data + 2 * i, 2);
      array.data[i] = float16_bits_to_float(h);
    }
  }
  return array;
}

NpyArray read_npy(const std::filesystem::path& path) {
  std::vector<uint8_t> bytes = read_regular_file(path, "a .npy file");
  return parse_npy(bytes, path.string());
}

std::vector<uint8_t> serialize_npy(std::span<const float> data, std::span<const int64_t> shape) {
  uint64_t count = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(count, static_cast<uint64_t>(d), &count))
      throw UsageError("serialize_npy: invalid shape");
  }
  if (count != data.size())
    throw UsageError("serialize_npy: shape holds " + std::to_string(count) + " values but " +
                     std::to_string(data.size()) + " were given");
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) dict += (i ? ", " : "") + std::to_string(shape[i]);
  dict += shape.size() == 1 ? ",), }" : "), }";
  // The data starts 64-byte aligned (numpy's convention, so memory maps are aligned): pad the
  // header with spaces and end it with a newline.
  int version = 1;
  size_t preamble = 10;
  auto padded_length = [&] { return (preamble + dict.size() + 1 + 63) / 64 * 64 - preamble; };
  if (padded_length() > 0xFFFF) {
    version = 2;
    preamble = 12;
  }
  const size_t header_length = padded_length();
  dict.append(header_length - dict.size() - 1, ' ');
  dict += '\n';

  std::vector<uint8_t> out;
  out.reserve(preamble + header_length + data.size() * 4);
  out.insert(out.end(), kMagic, kMagic + sizeof kMagic);
  out.push_back(static_cast<uint8_t>(version));
  out.push_back(0);
  for (size_t i = 0; i < preamble - 8; ++i) out.push_back(static_cast<uint8_t>(header_length >> (8 * i)));
  out.insert(out.end(), dict.begin(), dict.end());
  const auto* raw = reinterpret_cast<const uint8_t*>(data.data());
  out.insert(out.end(), raw, raw + data.size() * sizeof(float));
  return out;
}

void write_npy(const std::filesystem::path& path, std::span<const float> data, std::span<const int64_t> shape) {
  write_file_atomically(path, serialize_npy(data, shape));
}

}  // namespace nibble::io
