#include "common/error.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>

namespace nibble {

void check_failed(const char* cond, const char* file, int line, const char* format, ...) {
  std::fprintf(stderr, "nibble: internal error: %s failed at %s:%d: ", cond, file, line);
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
  std::fputc('\n', stderr);
  std::abort();
}

}  // namespace nibble
