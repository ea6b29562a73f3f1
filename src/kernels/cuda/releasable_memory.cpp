#include "kernels/cuda/releasable_memory.h"

#include <cuda.h>

#include <algorithm>
#include <string>

#include "common/error.h"
#include "kernels/cuda/cuda_error.h"

namespace nibble::cuda {

namespace {

// The driver functions used, found once through the runtime (no link to libcuda).
struct Driver {
  decltype(&cuDeviceGetAttribute) device_attribute = nullptr;
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&cuMemAddressReserve) reserve = nullptr;
  decltype(&cuMemAddressFree) free_addresses = nullptr;
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
  bool complete = false;
};

template <typename F>
bool find(const char* symbol, F& fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess || p == nullptr) {
    (void)cudaGetLastError();
    return false;
  }
  fn = reinterpret_cast<F>(p);
  return true;
}

const Driver& driver() {
  static const Driver d = [] {
    Driver f;
    f.complete = find("cuDeviceGetAttribute", f.device_attribute) && find("cuMemGetAllocationGranularity", f.granularity) &&
                 find("cuMemAddressReserve", f.reserve) && find("cuMemAddressFree", f.free_addresses) &&
                 find("cuMemCreate", f.create) && find("cuMemRelease", f.release) && find("cuMemMap", f.map) &&
                 find("cuMemUnmap", f.unmap) && find("cuMemSetAccess", f.set_access);
    return f;
  }();
  return d;
}

void check(CUresult r, const char* call) {
  if (r != CUDA_SUCCESS)
    throw CudaError(std::string(call) + " failed with CUresult " + std::to_string(static_cast<int>(r)) +
                    " (releasable device memory, kernels/cuda/releasable_memory.cpp)");
}

CUmemAllocationProp chunk_properties(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

std::string mib(size_t bytes) { return std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB"; }

}  // namespace

bool ReleasableMemory::supported(int device) {
  const Driver& d = driver();
  if (!d.complete) return false;
  int yes = 0;
  return d.device_attribute(&yes, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device) == CUDA_SUCCESS &&
         yes != 0;
}

ReleasableMemory::ReleasableMemory(int device, size_t bytes) : device_(device) {
  const Driver& d = driver();
  NIBBLE_CHECK(d.complete, "ReleasableMemory: the driver's virtual memory API (ask supported() first)");
  const CUmemAllocationProp prop = chunk_properties(device);
  check(d.granularity(&chunk_, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), "cuMemGetAllocationGranularity");
  handles_.assign(std::max<size_t>(1, (bytes + chunk_ - 1) / chunk_), 0);
  CUdeviceptr base = 0;
  check(d.reserve(&base, reserved_bytes(), chunk_, 0, 0), "cuMemAddressReserve");
  base_ = static_cast<uintptr_t>(base);
  try {
    commit(data(), reserved_bytes());
  } catch (...) {
    for (size_t i = 0; i < handles_.size(); ++i)
      if (handles_[i]) unmap_chunk(i);
    d.free_addresses(static_cast<CUdeviceptr>(base_), reserved_bytes());
    throw;
  }
}

ReleasableMemory::~ReleasableMemory() {
  for (size_t i = 0; i < handles_.size(); ++i)
    if (handles_[i]) unmap_chunk(i);
  driver().free_addresses(static_cast<CUdeviceptr>(base_), reserved_bytes());
}

size_t ReleasableMemory::mapped_bytes() const {
  return chunk_ * static_cast<size_t>(std::count_if(handles_.begin(), handles_.end(), [](auto h) { return h != 0; }));
}

std::pair<size_t, size_t> ReleasableMemory::chunks_touched(const void* p, size_t bytes) const {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p) - base_;
  NIBBLE_CHECK(contains(p) && a + bytes <= reserved_bytes(), "ReleasableMemory: a range inside the memory");
  return {a / chunk_, bytes ? (a + bytes + chunk_ - 1) / chunk_ : a / chunk_};
}

std::pair<size_t, size_t> ReleasableMemory::chunks_inside(const void* p, size_t bytes) const {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p) - base_;
  NIBBLE_CHECK(contains(p) && a + bytes <= reserved_bytes(), "ReleasableMemory: a range inside the memory");
  const size_t first = (a + chunk_ - 1) / chunk_, last = (a + bytes) / chunk_;
  return {first, std::max(first, last)};
}

size_t ReleasableMemory::release(const void* p, size_t bytes) {
  if (bytes == 0) return 0;
  const auto [first, last] = chunks_inside(p, bytes);
  size_t released = 0;
  for (size_t i = first; i < last; ++i)
    if (handles_[i]) {
      unmap_chunk(i);
      released += chunk_;
    }
  return released;
}

std::vector<std::pair<void*, size_t>> ReleasableMemory::partial_chunk_parts(const void* p, size_t bytes) const {
  std::vector<std::pair<void*, size_t>> parts;
  if (bytes == 0) return parts;
  const auto [first, last] = chunks_inside(p, bytes);
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p), end = begin + bytes;
  if (first == last) {  // no whole chunk inside: all of it
    parts.emplace_back(const_cast<void*>(p), bytes);
    return parts;
  }
  const uintptr_t inner_begin = base_ + first * chunk_, inner_end = base_ + last * chunk_;
  if (inner_begin > begin) parts.emplace_back(reinterpret_cast<void*>(begin), inner_begin - begin);
  if (end > inner_end) parts.emplace_back(reinterpret_cast<void*>(inner_end), end - inner_end);
  return parts;
}

std::vector<std::pair<void*, size_t>> ReleasableMemory::commit(const void* p, size_t bytes) {
  std::vector<std::pair<void*, size_t>> fresh;
  if (bytes == 0) return fresh;
  const auto [first, last] = chunks_touched(p, bytes);
  for (size_t i = first; i < last; ++i) {
    if (handles_[i]) continue;
    map_chunk(i);
    void* at = reinterpret_cast<void*>(base_ + i * chunk_);
    if (!fresh.empty() && static_cast<char*>(fresh.back().first) + fresh.back().second == at)
      fresh.back().second += chunk_;
    else
      fresh.emplace_back(at, chunk_);
  }
  return fresh;
}

void ReleasableMemory::map_chunk(size_t index) {
  const Driver& d = driver();
  const CUmemAllocationProp prop = chunk_properties(device_);
  CUmemGenericAllocationHandle handle = 0;
  const CUresult created = d.create(&handle, chunk_, &prop, 0);
  if (created == CUDA_ERROR_OUT_OF_MEMORY)
    throw UsageError("out of GPU memory: a " + mib(chunk_) + " chunk of the parameter arena (" + mib(reserved_bytes()) +
                     ", " + mib(mapped_bytes()) + " held) did not fit: lower batch, model.context, or the model's "
                     "width or layers, or shard more (distributed.shard=gradients or full over more GPUs)");
  check(created, "cuMemCreate");
  const CUdeviceptr at = static_cast<CUdeviceptr>(base_ + index * chunk_);
  CUresult r = d.map(at, chunk_, 0, handle, 0);
  if (r == CUDA_SUCCESS) {
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = d.set_access(at, chunk_, &access, 1);
    if (r != CUDA_SUCCESS) d.unmap(at, chunk_);
  }
  if (r != CUDA_SUCCESS) {
    d.release(handle);
    check(r, "cuMemMap / cuMemSetAccess");
  }
  handles_[index] = handle;
}

void ReleasableMemory::unmap_chunk(size_t index) {
  const Driver& d = driver();
  // Failures here would leak a chunk, never corrupt one: the handle is forgotten either way.
  d.unmap(static_cast<CUdeviceptr>(base_ + index * chunk_), chunk_);
  d.release(handles_[index]);
  handles_[index] = 0;
}

}  // namespace nibble::cuda
