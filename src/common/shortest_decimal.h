// A double as the shortest decimal that reads back to the same value, written as fmt's "{}" writes
// it (fixed notation for decimal exponents -4..15, else d.ddde±XX), for layers that must not depend
// on fmt (the offline CUDA-only build has none): the recipe key table prints config values with it,
// and config.yaml must read the same whichever layer prints a value.
#pragma once
#include <charconv>
#include <cstdlib>
#include <string>

namespace nibble {

inline std::string shortest_decimal(double value) {
  char buffer[64];
  const auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific);
  std::string text(buffer, error == std::errc() ? end : buffer);
  const auto e = text.find('e');
  if (e == std::string::npos) return text;  // nan, inf
  const bool negative = text[0] == '-';
  std::string digits = text.substr(negative ? 1 : 0, e - (negative ? 1 : 0));
  if (digits.size() > 1) digits.erase(1, 1);  // "d.ddd" -> "dddd"
  const int exponent = std::atoi(text.c_str() + e + 1);
  if (exponent < -4 || exponent >= 16) return text;  // to_chars writes d.ddde±XX as fmt does
  std::string fixed;
  const int point = exponent + 1;  // digits before the decimal point
  if (point <= 0) {
    fixed = "0." + std::string(static_cast<size_t>(-point), '0') + digits;
  } else if (point >= static_cast<int>(digits.size())) {
    fixed = digits + std::string(static_cast<size_t>(point) - digits.size(), '0');
  } else {
    fixed = digits.substr(0, static_cast<size_t>(point)) + "." + digits.substr(static_cast<size_t>(point));
  }
  return (negative ? "-" : "") + fixed;
}

}  // namespace nibble
