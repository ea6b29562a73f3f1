#include "common/pages.h"

#include <sys/mman.h>
#include <unistd.h>

namespace nibble {

PageRange whole_pages_inside(const void* p, size_t bytes) {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto first = reinterpret_cast<uintptr_t>(p);
  return {(first + page - 1) / page * page, (first + bytes) / page * page};
}

bool release_whole_pages(const void* p, size_t bytes) {
  const PageRange r = whole_pages_inside(p, bytes);
  if (r.begin >= r.end) return true;
  return ::madvise(reinterpret_cast<void*>(r.begin), r.end - r.begin, MADV_DONTNEED) == 0;
}

}  // namespace nibble
