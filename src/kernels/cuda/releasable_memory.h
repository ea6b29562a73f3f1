// Device memory whose whole chunks can be given back to the GPU and taken again while its addresses
// stay: the parameter arena's values and gradients, which ZeRO-2 and ZeRO-3 (distributed.shard=
// gradients, full) hold only in part. CUDA's virtual memory management: one address range reserved
// for the whole allocation, a physical allocation mapped into it per chunk (the driver's recommended
// granularity, 2 MiB on Hopper), unmapped and freed when released. The CPU backend gets the same
// from madvise on whole pages. The driver's functions are looked up at run time
// (cudaGetDriverEntryPointByVersion), so nibble links the runtime only and starts where no driver is.
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace nibble::cuda {

class ReleasableMemory {
 public:
  // Whether the driver offers the virtual memory API on `device` (its entry points and
  // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED).
  static bool supported(int device);
  // Reserves `bytes` rounded up to whole chunks on `device` and maps every chunk. Throws UsageError
  // naming the sizes when the GPU's memory runs out, CudaError for the driver's other failures.
  ReleasableMemory(int device, size_t bytes);
  ~ReleasableMemory();
  ReleasableMemory(const ReleasableMemory&) = delete;
  ReleasableMemory& operator=(const ReleasableMemory&) = delete;

  void* data() const { return reinterpret_cast<void*>(base_); }
  size_t chunk_bytes() const { return chunk_; }
  size_t reserved_bytes() const { return chunk_ * handles_.size(); }
  size_t mapped_bytes() const;
  bool contains(const void* p) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    return a >= base_ && a < base_ + reserved_bytes();
  }
  // Unmaps and frees the mapped chunks wholly inside [p, p + bytes) (inside this memory). The caller
  // has waited for every kernel and copy that uses them. Returns the bytes given back.
  size_t release(const void* p, size_t bytes);
  // The parts of [p, p + bytes) that lie in chunks the range does not wholly cover (its ends, at most
  // two ranges): what release() keeps, which the caller zeroes where it wants zeros.
  std::vector<std::pair<void*, size_t>> partial_chunk_parts(const void* p, size_t bytes) const;
  // Maps a fresh physical chunk at every unmapped chunk that [p, p + bytes) touches and returns
  // those chunks as (address, bytes) ranges, merged where adjacent: their contents are undefined
  // until written (the caller zeroes them). Throws as the constructor.
  std::vector<std::pair<void*, size_t>> commit(const void* p, size_t bytes);

 private:
  void map_chunk(size_t index);
  void unmap_chunk(size_t index);
  // [first, last) chunk indices of the chunks touched by (whole: wholly inside) [p, p + bytes).
  std::pair<size_t, size_t> chunks_touched(const void* p, size_t bytes) const;
  std::pair<size_t, size_t> chunks_inside(const void* p, size_t bytes) const;

  int device_ = 0;
  uintptr_t base_ = 0;
  size_t chunk_ = 0;
  std::vector<unsigned long long> handles_;  // per chunk: its physical allocation, 0 while unmapped
};

}  // namespace nibble::cuda
