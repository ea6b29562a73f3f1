// Grow-only 64-byte aligned scratch memory. Hot loops keep one per thread (static thread_local) so
// that repeated calls reuse the same pages instead of paying allocation, zeroing and page faults.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

namespace nibble::cpu {

class Workspace {
 public:
  uint8_t* get(size_t bytes) {
    if (bytes > size_) {
      size_ = (bytes + 4095) / 4096 * 4096;
      data_.reset(static_cast<uint8_t*>(std::aligned_alloc(64, size_)));
      if (!data_) throw std::bad_alloc();
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> data_;
  size_t size_ = 0;
};

}  // namespace nibble::cpu
