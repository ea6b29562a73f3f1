#include "kernels/cpu/common/lane_sum.h"
#include "kernels/cpu/common/parallel.h"
#include "kernels/cpu/common/simd_clones.h"
#include "kernels/cpu/layers/rmsnorm.h"
#include "kernels/cpu/quantize/gather_stripes.h"

#include <algorithm>
#include <cmath>

namespace nibble::cpu {
namespace {
// One row each; the parallel loops below call these per-ISA copies (simd_clones.h).
template <typename T>
NIBBLE_SIMD_CLONES void forward_row(const T* __restrict xr, const T* __restrict gain, int64_t width, T eps,
                                    T* __restrict yr, T* __restrict rstd) {
  const T ss = lane_sum<T>(width, [xr](int64_t c) { return xr[c] * xr[c]; });
  T r = T(1) / std::sqrt(ss / static_cast<T>(width) + eps);
  *rstd = r;
  for (int64_t c = 0; c < width; ++c) yr[c] = xr[c] * r * gain[c];
}

template <typename T>
NIBBLE_SIMD_CLONES void backward_row(const T* __restrict xr, const T* __restrict gain, T r, const T* __restrict dyr,
                                     int64_t width, T* __restrict dxr) {
  const T dot = lane_sum<T>(width, [=](int64_t c) { return dyr[c] * gain[c] * xr[c] * r; });  // sum(dxhat * xhat)
  const T mean_dot = dot / static_cast<T>(width);
  for (int64_t c = 0; c < width; ++c) dxr[c] += r * (dyr[c] * gain[c] - xr[c] * r * mean_dot);
}

// s[c] += dy[i][c] x[i][c] rstd[i] over tokens i in order, for `cols` columns from the block's first.
template <typename T>
NIBBLE_SIMD_CLONES void gain_gradient_block(const T* __restrict x, const T* __restrict dy, const T* __restrict rstd,
                                            int64_t n, int64_t width, int64_t cols, T* __restrict s) {
  for (int64_t i = 0; i < n; ++i) {
    const T* dyr = dy + i * width;
    const T* xr = x + i * width;
    const T r = rstd[i];
    for (int64_t c = 0; c < cols; ++c) s[c] += dyr[c] * xr[c] * r;
  }
}

// dgain[c] += the gain gradient (rmsnorm.h's order).
template <typename T>
void add_gain_gradient(const T* x, const T* rstd, const T* dy, int64_t n, int64_t width, T* dgain) {
  // The gain gradient sums over tokens: parallel over column blocks, each column summed in token
  // order tile by tile (kGainTileTokens), the tiles' sums in order. Walking a block's columns side by
  // side for each token reads rows contiguously and lets the compiler vectorise across columns (a
  // column at a time strode through memory, scalar).
  constexpr int64_t kBlock = 64;
#pragma omp parallel for schedule(dynamic, dynamic_chunk((width + kBlock - 1) / kBlock)) if (n * width >= kMinParallelWork)
  for (int64_t c0 = 0; c0 < width; c0 += kBlock) {
    const int64_t cols = std::min(kBlock, width - c0);
    T s[kBlock] = {};
    for (int64_t i0 = 0; i0 < n; i0 += kGainTileTokens) {
      T tile[kBlock] = {};
      gain_gradient_block(x + i0 * width + c0, dy + i0 * width + c0, rstd + i0, std::min(kGainTileTokens, n - i0),
                          width, cols, tile);
      for (int64_t c = 0; c < cols; ++c) s[c] += tile[c];
    }
    for (int64_t c = 0; c < cols; ++c) dgain[c0 + c] += s[c];
  }
}
}  // namespace

template <typename T>
void rmsnorm_forward(const T* x, const T* gain, int64_t n, int64_t width, T eps, T* y, T* rstd) {
#pragma omp parallel for schedule(dynamic, dynamic_chunk(n)) if (n * width >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) forward_row(x + i * width, gain, width, eps, y + i * width, rstd + i);
}

template <typename T>
void rmsnorm_backward(const T* x, const T* gain, const T* rstd, const T* dy, int64_t n, int64_t width, T* dx,
                      T* dgain) {
#pragma omp parallel for schedule(dynamic, dynamic_chunk(n)) if (n * width >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) backward_row(x + i * width, gain, rstd[i], dy + i * width, width, dx + i * width);
  add_gain_gradient(x, rstd, dy, n, width, dgain);
}

void rmsnorm_backward_gathering(const float* x, const float* gain, const float* rstd, const float* dy, int64_t n,
                                int64_t width, float* dx, float* dgain, SourceAmax& amax) {
  for_stripes_gathering(n, width, amax, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) backward_row(x + i * width, gain, rstd[i], dy + i * width, width, dx + i * width);
    return dx;
  });
  add_gain_gradient(x, rstd, dy, n, width, dgain);
}

void rmsnorm_forward_gathering(const float* x, const float* gain, int64_t n, int64_t width, float eps, float* y,
                               float* rstd, SourceAmax& amax) {
  for_stripes_gathering(n, width, amax, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) forward_row(x + i * width, gain, width, eps, y + i * width, rstd + i);
    return y;
  });
}

template void rmsnorm_forward<float>(const float*, const float*, int64_t, int64_t, float, float*, float*);
template void rmsnorm_forward<double>(const double*, const double*, int64_t, int64_t, double, double*, double*);
template void rmsnorm_backward<float>(const float*, const float*, const float*, const float*, int64_t, int64_t, float*,
                                      float*);
template void rmsnorm_backward<double>(const double*, const double*, const double*, const double*, int64_t, int64_t,
                                       double*, double*);

}  // namespace nibble::cpu
