#include "kernels/cuda/cuda_error.h"

#include <cstdio>
#include <string>

#include "common/error.h"

namespace nibble::cuda {

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  throw CudaError(std::string("CUDA error ") + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) +
                  ") from " + call + " at " + file + ":" + std::to_string(line));
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  throw CudaError(std::string("cuBLAS error ") + cublasLtGetStatusName(status) + " (" +
                  cublasLtGetStatusString(status) + ") from " + call + " at " + file + ":" + std::to_string(line));
}

DeviceAvailability probe_devices() {
  DeviceAvailability a;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    // Clear the sticky "no device / no driver" error so that later calls report their own.
    (void)cudaGetLastError();
    a.reason = std::string("no CUDA device found: cudaGetDeviceCount failed with ") + cudaGetErrorName(status) +
               " (" + cudaGetErrorString(status) + "); is an NVIDIA GPU and driver present?";
    return a;
  }
  a.device_count = count;
  if (count == 0) {
    a.reason = "no CUDA device found: cudaGetDeviceCount returned 0";
    return a;
  }
  a.available = true;
  return a;
}

void require_device() {
  DeviceAvailability a = probe_devices();
  if (!a.available) throw CudaError(a.reason);
}

int run_on_device(const std::function<int()>& body) {
  const DeviceAvailability a = probe_devices();
  if (!a.available) {
    std::fprintf(stderr, "nibble: error: %s\n", a.reason.c_str());
    return 2;
  }
  try {
    return body();
  } catch (const UsageError& e) {
    std::fprintf(stderr, "nibble: error: %s\n", e.what());
    return 2;
  } catch (const CudaError& e) {
    std::fprintf(stderr, "nibble: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace nibble::cuda
