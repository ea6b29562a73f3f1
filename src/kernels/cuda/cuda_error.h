// Error policy of the CUDA backend: every CUDA runtime and cuBLASLt call is checked, and a failure
// throws CudaError naming the call, the file and the line, with the runtime's own description. A
// machine without a usable GPU is not a crash: probe_devices() says why, require_device() throws a
// CudaError that says so in plain words.
#pragma once
#include <functional>
#include <stdexcept>
#include <string>

#include <cublasLt.h>
#include <cuda_runtime.h>

namespace nibble::cuda {

struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line);

struct DeviceAvailability {
  bool available = false;
  int device_count = 0;
  std::string reason;  // why not, when !available ("no CUDA device found: ...")
};
// Never throws; safe on machines without a driver.
DeviceAvailability probe_devices();
// Throws CudaError with probe_devices().reason when no device can be used.
void require_device();
// A device program's body (the GEMM benchmark, the profile) run when a device is usable, its errors
// turned into exit statuses: the body's own; 2 with "nibble: error: ..." on stderr without a usable
// device or for a UsageError; 1 for a CudaError.
int run_on_device(const std::function<int()>& body);

}  // namespace nibble::cuda

#define NIBBLE_CUDA_CHECK(call)                                                             \
  do {                                                                                      \
    const cudaError_t nibble_status_ = (call);                                              \
    if (nibble_status_ != cudaSuccess)                                                      \
      ::nibble::cuda::throw_cuda_error(nibble_status_, #call, __FILE__, __LINE__);          \
  } while (0)

#define NIBBLE_CUBLAS_CHECK(call)                                                           \
  do {                                                                                      \
    const cublasStatus_t nibble_status_ = (call);                                           \
    if (nibble_status_ != CUBLAS_STATUS_SUCCESS)                                            \
      ::nibble::cuda::throw_cublas_error(nibble_status_, #call, __FILE__, __LINE__);        \
  } while (0)

// After a kernel launch: reports bad launch configurations (and earlier asynchronous faults).
#define NIBBLE_CUDA_CHECK_LAUNCH() NIBBLE_CUDA_CHECK(cudaGetLastError())
