// Small comparisons the tests share: bitwise equality of float vectors and the message of a refusal.
#pragma once
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/error.h"

namespace nibble_test {

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The message of the UsageError `f` throws, or "(no error)".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const nibble::UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace nibble_test
