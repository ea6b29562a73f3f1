#include "common/pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

namespace nibble {

namespace {
uintptr_t page_bytes() {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  return page;
}
}  // namespace

PageRange whole_pages_inside(const void* p, size_t bytes) {
  const uintptr_t page = page_bytes(), first = reinterpret_cast<uintptr_t>(p);
  return {(first + page - 1) / page * page, (first + bytes) / page * page};
}

PageRange pages_touching(const void* p, size_t bytes) {
  const uintptr_t page = page_bytes(), first = reinterpret_cast<uintptr_t>(p);
  return {first / page * page, (first + bytes + page - 1) / page * page};
}

bool release_whole_pages(const void* p, size_t bytes) {
  const PageRange r = whole_pages_inside(p, bytes);
  if (r.begin >= r.end) return true;
  return ::madvise(reinterpret_cast<void*>(r.begin), r.end - r.begin, MADV_DONTNEED) == 0;
}

void release_to_zero(void* p, size_t bytes) {
  if (bytes == 0) return;
  const PageRange inner = whole_pages_inside(p, bytes);
  const auto first = reinterpret_cast<uintptr_t>(p), last = first + bytes;
  if (inner.begin >= inner.end) {  // no whole page inside
    std::memset(p, 0, bytes);
    return;
  }
  std::memset(p, 0, inner.begin - first);
  std::memset(reinterpret_cast<void*>(inner.end), 0, last - inner.end);
  if (!release_whole_pages(reinterpret_cast<void*>(inner.begin), inner.end - inner.begin))
    std::memset(reinterpret_cast<void*>(inner.begin), 0, inner.end - inner.begin);  // memory kept, still zero
}

}  // namespace nibble
