// Device memory and streams. DeviceBuffer<T> is a move-only owner of a stream-ordered allocation
// (cudaMallocAsync from the device's memory pool, which Context configures to keep freed memory for
// reuse, so allocating per call is cheap); Stream is a move-only owner of a cudaStream_t.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_error.h"

namespace nibble::cuda {

class Stream {
 public:
  Stream() { NIBBLE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Stream() {
    if (stream_) cudaStreamDestroy(stream_);
  }
  Stream(Stream&& o) noexcept : stream_(std::exchange(o.stream_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept {
    if (this != &o) {
      if (stream_) cudaStreamDestroy(stream_);
      stream_ = std::exchange(o.stream_, nullptr);
    }
    return *this;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  void synchronize() const { NIBBLE_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_ = nullptr;
};

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t count, cudaStream_t stream) : count_(count), stream_(stream) {
    if (count_ > 0) NIBBLE_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&data_), count_ * sizeof(T), stream_));
  }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), count_(std::exchange(o.count_, 0)), stream_(o.stream_) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      count_ = std::exchange(o.count_, 0);
      stream_ = o.stream_;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }
  bool empty() const { return count_ == 0; }
  cudaStream_t stream() const { return stream_; }

  void fill_zero() {
    if (count_) NIBBLE_CUDA_CHECK(cudaMemsetAsync(data_, 0, bytes(), stream_));
  }
  // Host <-> device copies, ordered on the buffer's stream; download waits for the copy.
  void upload(std::span<const T> host) {
    check_same_size(host.size());
    if (count_) NIBBLE_CUDA_CHECK(cudaMemcpyAsync(data_, host.data(), bytes(), cudaMemcpyHostToDevice, stream_));
    NIBBLE_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the host span may die after return
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    if (count_) NIBBLE_CUDA_CHECK(cudaMemcpyAsync(host.data(), data_, bytes(), cudaMemcpyDeviceToHost, stream_));
    NIBBLE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return host;
  }
  static DeviceBuffer from_host(std::span<const T> host, cudaStream_t stream) {
    DeviceBuffer b(host.size(), stream);
    b.upload(host);
    return b;
  }

 private:
  void check_same_size(size_t n) const {
    if (n != count_)
      throw CudaError("host/device copy of " + std::to_string(n) + " elements into a device buffer of " +
                      std::to_string(count_));
  }
  void release() noexcept {
    // Errors cannot propagate from a destructor; a failed free only leaks pool memory.
    if (data_) cudaFreeAsync(data_, stream_);
    data_ = nullptr;
    count_ = 0;
  }
  T* data_ = nullptr;
  size_t count_ = 0;
  cudaStream_t stream_ = nullptr;
};

}  // namespace nibble::cuda
