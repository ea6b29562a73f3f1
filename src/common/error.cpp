#include "common/error.h"

#include <cstdio>
#include <cstdlib>

namespace nibble {

void check_failed(const char* cond, const char* file, int line) {
  std::fprintf(stderr, "nibble: internal error: %s failed at %s:%d\n", cond, file, line);
  std::abort();
}

}  // namespace nibble
