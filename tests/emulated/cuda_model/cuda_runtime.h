// The CUDA runtime API as nibble's host code uses it, over the model of cuda_model.h: one device
// (sm_90, cuda_model::sm_count() multiprocessors), device memory in host memory, streams that run
// their work at once. Shadows the toolkit's <cuda_runtime.h> in the model's targets only.
#pragma once
#include <cstddef>
#include <cstdint>

#include "cuda_model.h"

enum cudaError_t : int {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorStreamCaptureUnsupported = 900,  // an operation a capture cannot record (a sync, an allocation)
  cudaErrorStreamCaptureInvalidated = 901,  // the capture was broken by an earlier operation
  cudaErrorStreamCaptureImplicit = 906,     // the legacy (null) stream used while a stream captures
};
enum cudaMemcpyKind : int {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
enum cudaMemPoolAttr : int { cudaMemPoolAttrReleaseThreshold = 4 };
inline constexpr unsigned cudaStreamNonBlocking = 1;

struct CUstream_st;
typedef CUstream_st* cudaStream_t;
struct CUmemPoolHandle_st;
typedef CUmemPoolHandle_st* cudaMemPool_t;
struct CUevent_st;
typedef CUevent_st* cudaEvent_t;

struct cudaUUID_t {
  char bytes[16];
};
struct cudaDeviceProp {
  char name[256];
  cudaUUID_t uuid;
  size_t totalGlobalMem;
  int major, minor;
  int multiProcessorCount;
  int maxThreadsPerBlock;
  int warpSize;
  size_t sharedMemPerBlock;
};

const char* cudaGetErrorName(cudaError_t e);
const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device);
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value);
cudaError_t cudaDeviceSynchronize();

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);

cudaError_t cudaMallocAsync(void** ptr, size_t bytes, cudaStream_t stream);
cudaError_t cudaMalloc(void** ptr, size_t bytes);
cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream);
cudaError_t cudaMemset(void* ptr, int value, size_t bytes);

// Pinned host memory: the only host memory a captured copy may read or write (the node copies from
// the address at every replay; a pageable copy is staged synchronously, which a capture refuses).
// The driver's functions (cuda.h's virtual memory API here), found by name as on a GPU.
enum cudaGetDriverEntryPointFlags : unsigned long long { cudaEnableDefault = 0 };
enum cudaDriverEntryPointQueryResult : int {
  cudaDriverEntryPointSuccess = 0,
  cudaDriverEntryPointSymbolNotFound = 1,
  cudaDriverEntryPointVersionNotSufficent = 2
};
cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** function, unsigned int version,
                                             unsigned long long flags, cudaDriverEntryPointQueryResult* status);

cudaError_t cudaMallocHost(void** ptr, size_t bytes);
cudaError_t cudaFreeHost(void* ptr);

// Stream capture and graphs (cuda_model.h, captured): one capturing stream at a time, in the
// global mode: while it captures, the legacy stream, cudaMalloc/cudaFree, cudaDeviceSynchronize
// and a synchronisation of the capturing stream invalidate the capture. A captured cudaMallocAsync
// or cudaFreeAsync (a memory node on a GPU) is refused too: the step's buffers are allocated before
// capture and reused, so an allocation inside it is a mistake the model names.
enum cudaStreamCaptureMode : int {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2
};
enum cudaStreamCaptureStatus : int {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2
};
struct CUgraph_st;
typedef CUgraph_st* cudaGraph_t;
struct CUgraphExec_st;
typedef CUgraphExec_st* cudaGraphExec_t;
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, void* nodes, size_t* count);  // nodes must be null (count only)
