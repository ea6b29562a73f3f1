#include "kernels/cuda/context.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

namespace nibble::cuda {

bool has_native_nvfp4_gemm(int cc_major, int /*cc_minor*/) { return cc_major == 10 || cc_major == 11 || cc_major == 12; }
bool runs_sm100a_kernels(int cc_major, int cc_minor) { return cc_major == 10 && (cc_minor == 0 || cc_minor == 3); }
bool has_fp8_gemm(int cc_major, int cc_minor) { return cc_major > 8 || (cc_major == 8 && cc_minor >= 9); }

namespace {
// cuBLASLt's recommendation for Hopper and Blackwell is 32 MiB; smaller works, only slower.
constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;
}  // namespace

namespace {
DeviceInfo describe_device(int device_ordinal) {
  require_device();  // first, so a machine without a GPU gets the plain-words message
  NIBBLE_CUDA_CHECK(cudaSetDevice(device_ordinal));
  cudaDeviceProp prop{};
  NIBBLE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_ordinal));
  DeviceInfo info;
  info.ordinal = device_ordinal;
  info.name = prop.name;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  info.sm_count = prop.multiProcessorCount;
  info.memory_bytes = prop.totalGlobalMem;
  std::memcpy(info.uuid.data(), prop.uuid.bytes, info.uuid.size());
  // Keep freed pool memory instead of returning it to the driver at every synchronisation, so that
  // stream-ordered allocation of per-call buffers costs no more than a free list.
  cudaMemPool_t pool;
  NIBBLE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device_ordinal));
  uint64_t keep_all = UINT64_MAX;
  NIBBLE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
  return info;
}
}  // namespace

// Members are built in declaration order: info_ (device checks) before stream_.
Context::Context(int device_ordinal) : info_(describe_device(device_ordinal)) {
  NIBBLE_CUBLAS_CHECK(cublasLtCreate(&blas_));
  blas_workspace_ = DeviceBuffer<uint8_t>(kBlasWorkspaceBytes, stream_.get());
}

Context::~Context() {
  if (blas_) cublasLtDestroy(blas_);
  // Buffers free themselves on the stream; wait so the pool sees them before the stream goes.
  cudaStreamSynchronize(stream_.get());
}

uint8_t* Context::scratch(Scratch slot, size_t bytes) {
  auto& buffer = scratch_[static_cast<size_t>(slot)];
  if (buffer.size() < bytes) buffer = DeviceBuffer<uint8_t>(bytes, stream_.get());
  return buffer.data();
}

namespace {
std::atomic<int> selected_device{-1};  // -1: $NIBBLE_CUDA_DEVICE or 0
std::atomic<int> opened_device{-1};    // the device of the first context default_context() made
}  // namespace

namespace {
// The device contexts open on: select_default_device's, else $NIBBLE_CUDA_DEVICE, else 0; the
// first one opened is recorded, so a later selection of another device is refused.
int device_to_open() {
  int ordinal = selected_device.load();
  if (ordinal < 0) {
    const char* env = std::getenv("NIBBLE_CUDA_DEVICE");
    ordinal = env ? std::atoi(env) : 0;
  }
  return ordinal;
}

std::unique_ptr<Context> open_context() {
  const int ordinal = device_to_open();
  auto context = std::make_unique<Context>(ordinal);
  int none = -1;
  opened_device.compare_exchange_strong(none, ordinal);
  return context;
}
}  // namespace

Context& default_context() {
  thread_local std::unique_ptr<Context> context;
  if (!context) context = open_context();
  return *context;
}

Context& process_context() {
  static std::mutex mutex;
  static Context* context = nullptr;  // never destroyed: outlives every thread and static that uses it
  std::lock_guard<std::mutex> lock(mutex);
  if (!context) context = open_context().release();
  return *context;
}

void select_default_device(int ordinal) {
  const DeviceAvailability a = probe_devices();
  if (!a.available) throw CudaError(a.reason);
  if (ordinal < 0 || ordinal >= a.device_count)
    throw CudaError("GPU " + std::to_string(ordinal) + " does not exist: this process sees " +
                    std::to_string(a.device_count) + " (CUDA_VISIBLE_DEVICES decides which)");
  const int opened = opened_device.load();
  if (opened >= 0 && opened != ordinal)
    throw CudaError("GPU " + std::to_string(ordinal) + " was selected after this process had started on GPU " +
                    std::to_string(opened));
  selected_device.store(ordinal);
}

}  // namespace nibble::cuda
