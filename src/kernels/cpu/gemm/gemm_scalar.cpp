// Portable micro-kernels over the packed panels (gemm_kernels.h): the fallback for CPUs without
// AVX2 and the plainest statement of what the vector kernels compute. They produce the same bits
// as the vector kernels: every product they form is exact, so mul+add equals FMA here.
#include <cstring>

#include "kernels/cpu/gemm/gemm_kernels.h"

namespace nibble::cpu::gemm_detail {
namespace {

template <int64_t Groups>
void int8_blocks_scalar(const uint8_t* pa, const uint8_t* pb, int64_t blocks, float* acc, bool first) {
  constexpr int64_t block_len = Groups * 4;
  float c[kMr][kNr];
  for (int m = 0; m < kMr; ++m)
    for (int n = 0; n < kNr; ++n) c[m][n] = first ? 0.0f : acc[m * kNr + n];
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int8_t* a = reinterpret_cast<const int8_t*>(pa);
    int32_t init[kMr];
    float sa[kMr], sb[kNr];
    std::memcpy(init, pa + block_len * kMr, sizeof init);
    std::memcpy(sa, pa + block_len * kMr + 4 * kMr, sizeof sa);
    std::memcpy(sb, pb + block_len * kNr, sizeof sb);
    for (int m = 0; m < kMr; ++m) {
      for (int n = 0; n < kNr; ++n) {
        int32_t s = init[m];  // cancels the +12 stored in B
        for (int64_t g = 0; g < Groups; ++g)
          for (int j = 0; j < 4; ++j) s += int32_t{pb[(g * kNr + n) * 4 + j]} * a[(g * kMr + m) * 4 + j];
        c[m][n] = c[m][n] + (static_cast<float>(s) * sb[n]) * sa[m];
      }
    }
    pa += int8_a_block_bytes(block_len);
    pb += int8_b_block_bytes(block_len);
  }
  for (int m = 0; m < kMr; ++m)
    for (int n = 0; n < kNr; ++n) acc[m * kNr + n] = c[m][n];
}

void f32_scalar(const uint8_t* pa, const uint8_t* pb, int64_t ks, float* acc, bool first) {
  float c[kMr][kNr];
  for (int m = 0; m < kMr; ++m)
    for (int n = 0; n < kNr; ++n) c[m][n] = first ? 0.0f : acc[m * kNr + n];
  const float* a = reinterpret_cast<const float*>(pa);
  const float* b = reinterpret_cast<const float*>(pb);
  for (int64_t k = 0; k < ks; ++k, a += kMr, b += kNr)
    for (int m = 0; m < kMr; ++m)
      for (int n = 0; n < kNr; ++n) c[m][n] = c[m][n] + a[m] * b[n];
  for (int m = 0; m < kMr; ++m)
    for (int n = 0; n < kNr; ++n) acc[m * kNr + n] = c[m][n];
}

}  // namespace

MicroKernel int8_micro_kernel_scalar(int64_t block_len) {
  return block_len == 32 ? &int8_blocks_scalar<8> : &int8_blocks_scalar<4>;
}
MicroKernel f32_micro_kernel_scalar() { return &f32_scalar; }

}  // namespace nibble::cpu::gemm_detail
