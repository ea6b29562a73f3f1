// nibble's one error policy, shared by every layer (host and CUDA code alike):
//  * UsageError: what a user can get wrong (shapes, options, files, non-finite input). The message
//    names the value and the fix; the CLI prints it and exits 2, nothing written is damaged.
//  * NIBBLE_CHECK: internal invariants. A failure is a bug in nibble: it prints file:line and aborts.
#pragma once
#include <stdexcept>

namespace nibble {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Non-finite numbers (NaN, infinity) met where a tensor must be finite, e.g. a quantizer's input. A
// UsageError for the command that was given such a tensor; inside a training step, the sign that the
// run diverged, which the run driver reports as such.
struct NumericalError : UsageError {
  using UsageError::UsageError;
};

[[noreturn]] void check_failed(const char* cond, const char* file, int line);

}  // namespace nibble

#define NIBBLE_CHECK(cond)                                                                       \
  do {                                                                                           \
    if (!(cond)) ::nibble::check_failed(#cond, __FILE__, __LINE__);                              \
  } while (0)
