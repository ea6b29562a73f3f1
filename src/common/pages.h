// Giving host memory back to the system without freeing it: the sharded modes (ZeRO-2's gradients,
// ZeRO-3's weights) keep one arena whose address range stays whole and drop the pages they do not
// hold. madvise works on whole pages only, so the partial pages at a range's edges (shared with the
// neighbouring data) are left to the caller.
#pragma once
#include <cstddef>
#include <cstdint>

namespace nibble {

// [begin, end): the whole pages inside [p, p + bytes); empty (begin >= end) when there is none.
struct PageRange {
  uintptr_t begin = 0, end = 0;
};
PageRange whole_pages_inside(const void* p, size_t bytes);
// [begin, end): the pages that [p, p + bytes) touches (its partial pages at the edges included).
PageRange pages_touching(const void* p, size_t bytes);

// Gives the whole pages inside [p, p + bytes) back to the system (madvise MADV_DONTNEED: private
// anonymous pages then read as zeros and take memory again only when written). False when the system
// refused, leaving the contents as they were.
bool release_whole_pages(const void* p, size_t bytes);

// Zeroes [p, p + bytes) (host memory) and gives the whole pages inside it back to the system: they
// read as zeros and take memory again only when written. The partial pages at the edges are zeroed
// and kept (they hold neighbouring data); where the system refuses, the memory is kept, zeroed.
void release_to_zero(void* p, size_t bytes);

}  // namespace nibble
