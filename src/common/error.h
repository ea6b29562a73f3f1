// nibble's one error policy, shared by every layer (host and CUDA code alike):
//  * UsageError: what a user can get wrong (shapes, options, files). The message names the value and
//    the fix; the CLI prints it and exits 2, nothing written is damaged.
//  * NumericalError: a UsageError for non-finite values (Inf/NaN) found in a tensor, e.g. a
//    quantizer's input. A run loop catches it as divergence; elsewhere it is reported as any
//    UsageError (same exit code).
//  * NIBBLE_CHECK(cond, format, ...): internal invariants. A failure is a bug in nibble: it prints
//    the condition, file:line and the printf-style message (what invariant broke), and aborts. The
//    message is required. Host code only (also host code compiled by nvcc), no dependencies.
#pragma once
#include <stdexcept>

#if defined(__GNUC__) || defined(__clang__)
#define NIBBLE_PRINTF_FORMAT(format_index, first_arg) __attribute__((format(printf, format_index, first_arg)))
#else
#define NIBBLE_PRINTF_FORMAT(format_index, first_arg)
#endif

namespace nibble {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Non-finite values where finite ones are required (quantizer input, a tensor read back).
struct NumericalError : UsageError {
  using UsageError::UsageError;
};

[[noreturn]] void check_failed(const char* cond, const char* file, int line, const char* format, ...)
    NIBBLE_PRINTF_FORMAT(4, 5);

}  // namespace nibble

// NIBBLE_CHECK(cond, "what broke", ...): the message (a printf format and its arguments) is required.
#define NIBBLE_CHECK(cond, ...)                                                                  \
  do {                                                                                           \
    if (!(cond)) ::nibble::check_failed(#cond, __FILE__, __LINE__, __VA_ARGS__);                 \
  } while (0)
