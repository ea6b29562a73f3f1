// A kernel choice that the CPU makes (by its vendor or ISA, never by a timing) and that
// $NIBBLE_<NAME> or a test can force: gemm.h's bf16_pair_kernel and c_stores.
#pragma once
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string_view>

namespace nibble::cpu {

// The forced value of enum E (-1: none), first read from $variable. A value `parse` does not know
// warns and is ignored: it is read before any command can report errors (as NIBBLE_ISA).
template <class E>
std::atomic<int>& forced_choice(const char* variable, std::optional<E> (*parse)(std::string_view), const char* expected) {
  static std::atomic<int> slot{[&] {
    const char* e = std::getenv(variable);
    if (!e) return -1;
    const std::optional<E> v = parse(e);
    if (!v) std::fprintf(stderr, "nibble: %s=%s is not %s; ignoring it\n", variable, e, expected);
    return v ? static_cast<int>(*v) : -1;
  }()};
  return slot;
}

}  // namespace nibble::cpu
