// Per-device state of the CUDA backend: the device's description, one stream every call is ordered
// on, the cuBLASLt handle and workspace, and reusable scratch buffers (emulation operands, swizzled
// scales) that grow to the largest size asked for. default_context() gives one per host thread.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/device_buffer.h"

namespace nibble::cuda {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  size_t memory_bytes = 0;
  std::array<unsigned char, 16> uuid{};  // the GPU's own identity (two processes on one GPU see the same)
  int compute_capability() const { return cc_major * 10 + cc_minor; }
};

// Which code paths a device gets (pure functions of the compute capability; tested on the CPU).
// sm_100/sm_103 (B200/B300/GB300): FP4 tensor cores, and the arch-specific (sm_100a/103a) kernels.
bool has_native_nvfp4_gemm(int cc_major, int cc_minor);
bool runs_sm100a_kernels(int cc_major, int cc_minor);
// FP8 tensor cores: Ada (8.9), Hopper (9.0) and newer.
bool has_fp8_gemm(int cc_major, int cc_minor);

class Context {
 public:
  explicit Context(int device_ordinal = 0);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  const DeviceInfo& device() const { return info_; }
  cudaStream_t stream() const { return stream_.get(); }
  void synchronize() const { stream_.synchronize(); }
  cublasLtHandle_t blas() const { return blas_; }
  void* blas_workspace() { return blas_workspace_.data(); }
  size_t blas_workspace_bytes() const { return blas_workspace_.bytes(); }

  // Scratch slots, each a byte buffer reused across calls (contents are not kept between users).
  // product: row-scaled GEMMs; reduction: a layer's partial sums (RMSNorm's gain tiles)
  enum class Scratch { operand_a, operand_b, scales_a, scales_b, scalars, staging, product, reduction, count };
  uint8_t* scratch(Scratch slot, size_t bytes);

  // Quantizations whose non-finite check waits for the next read (quantize.h,
  // KernelOptions::defer_finite_check): a sticky device word, the smallest (k << 40 | flat index) of
  // a non-finite input over the k-th deferred quantization's inputs, and each one's [rows, cols].
  struct DeferredFiniteChecks {
    DeviceBuffer<unsigned long long> word;  // allocated at the first deferral, all ones when clean
    DeviceBuffer<unsigned> blocks_done;     // with word: the folding amax pass's finished blocks, 0 between passes
    std::vector<std::array<int64_t, 2>> shapes;
  };
  DeferredFiniteChecks& deferred_finite_checks() { return deferred_; }
  // gemm.cu's cuBLASLt plans (descriptors, layouts, algorithm per problem), opaque here.
  std::shared_ptr<void>& gemm_plans() { return gemm_plans_; }

 private:
  DeviceInfo info_;
  Stream stream_;
  cublasLtHandle_t blas_ = nullptr;
  DeviceBuffer<uint8_t> blas_workspace_;
  std::array<DeviceBuffer<uint8_t>, static_cast<size_t>(Scratch::count)> scratch_;
  DeferredFiniteChecks deferred_;
  std::shared_ptr<void> gemm_plans_;
};

// The calling thread's context on device 0 (or $NIBBLE_CUDA_DEVICE, or the device chosen by
// select_default_device), created at first use. Throws CudaError ("no CUDA device found: ...") on
// a machine without a usable GPU.
Context& default_context();
// The process's one context on the same device, created at first use and never destroyed: the CUDA
// backend's, which every host thread calls through (a thread's default_context() ends with its
// thread, so the backend must not keep the first caller's).
Context& process_context();
// The device default_context() opens from now on (one process per GPU: its local rank's GPU).
// Throws CudaError when `ordinal` is not a visible device, or when a context on another device was
// already created.
void select_default_device(int ordinal);

}  // namespace nibble::cuda
