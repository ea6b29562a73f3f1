// The CUDA driver API's virtual memory management as nibble's host code uses it
// (kernels/cuda/releasable_memory.cpp), over the model of cuda_model.h: address ranges reserved in
// host address space, chunks mapped into them as device memory, reached through
// cudaGetDriverEntryPointByVersion as on a GPU. The granularity is 64 KiB here (2 MiB on Hopper), so
// small tests cross chunk edges; cuda_model::vmm_* count what is mapped and limit it (out of memory).
// Shadows the toolkit's <cuda.h> in the model's targets only.
#pragma once
#include <cstddef>
#include <cstdint>

enum CUresult : int {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_SUPPORTED = 801,
};
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
enum CUdevice_attribute : int { CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102 };
enum CUmemAllocationType : int { CU_MEM_ALLOCATION_TYPE_INVALID = 0, CU_MEM_ALLOCATION_TYPE_PINNED = 1 };
enum CUmemAllocationHandleType : int { CU_MEM_HANDLE_TYPE_NONE = 0 };
enum CUmemLocationType : int { CU_MEM_LOCATION_TYPE_INVALID = 0, CU_MEM_LOCATION_TYPE_DEVICE = 1 };
enum CUmemAccess_flags : int { CU_MEM_ACCESS_FLAGS_PROT_NONE = 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3 };
enum CUmemAllocationGranularity_flags : int {
  CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
  CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1
};
struct CUmemLocation {
  CUmemLocationType type;
  int id;
};
struct CUmemAllocationProp {
  CUmemAllocationType type;
  CUmemAllocationHandleType requestedHandleTypes;
  CUmemLocation location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType, gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
};
struct CUmemAccessDesc {
  CUmemLocation location;
  CUmemAccess_flags flags;
};

CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice device);
CUresult cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                       CUmemAllocationGranularity_flags option);
CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                     unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags);
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count);

namespace cuda_model {
inline constexpr size_t kVmmGranularity = size_t{64} << 10;
size_t vmm_mapped_bytes();      // chunks mapped now
size_t vmm_created_bytes();     // physical allocations alive (cuMemCreate'd, not released)
void vmm_limit_bytes(size_t n);  // cuMemCreate beyond n bytes alive fails with out of memory (0: no limit)
}  // namespace cuda_model
