#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/parallel.h"

#include <algorithm>
#include <cmath>

namespace nibble::cpu {
namespace {
// Sum of term(c) over c < width in 16 interleaved partial sums (lane c % 16), folded in a fixed
// tree at the end: a fixed order (the same on any thread count) that the compiler can vectorise,
// where one running sum is a chain of `width` dependent additions.
template <typename T, class Term>
inline T lane_sum(int64_t width, Term term) {
  T lanes[16] = {};
  int64_t c = 0;
  for (; c + 16 <= width; c += 16)
    for (int l = 0; l < 16; ++l) lanes[l] += term(c + l);
  for (int l = 0; c < width; ++c, ++l) lanes[l] += term(c);
  for (int half = 8; half >= 1; half /= 2)
    for (int l = 0; l < half; ++l) lanes[l] += lanes[l + half];
  return lanes[0];
}
}  // namespace

template <typename T>
void rmsnorm_forward(const T* x, const T* gain, int64_t n, int64_t width, T eps, T* y, T* rstd) {
#pragma omp parallel for schedule(static) if (n * width >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const T* xr = x + i * width;
    const T ss = lane_sum<T>(width, [xr](int64_t c) { return xr[c] * xr[c]; });
    T r = T(1) / std::sqrt(ss / static_cast<T>(width) + eps);
    rstd[i] = r;
    T* yr = y + i * width;
    for (int64_t c = 0; c < width; ++c) yr[c] = xr[c] * r * gain[c];
  }
}

template <typename T>
void rmsnorm_backward(const T* x, const T* gain, const T* rstd, const T* dy, int64_t n, int64_t width, T* dx,
                      T* dgain) {
#pragma omp parallel for schedule(static) if (n * width >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const T* xr = x + i * width;
    const T* dyr = dy + i * width;
    const T r = rstd[i];
    const T dot = lane_sum<T>(width, [=](int64_t c) { return dyr[c] * gain[c] * xr[c] * r; });  // sum(dxhat * xhat)
    const T mean_dot = dot / static_cast<T>(width);
    T* dxr = dx + i * width;
    for (int64_t c = 0; c < width; ++c) dxr[c] += r * (dyr[c] * gain[c] - xr[c] * r * mean_dot);
  }
  // The gain gradient sums over tokens: parallel over column blocks, each column summed in token
  // order. Walking a block's columns side by side for each token reads rows contiguously and lets
  // the compiler vectorise across columns (a column at a time strode through memory, scalar).
  constexpr int64_t kBlock = 64;
#pragma omp parallel for schedule(static) if (n * width >= kMinParallelWork)
  for (int64_t c0 = 0; c0 < width; c0 += kBlock) {
    const int64_t cols = std::min(kBlock, width - c0);
    T s[kBlock] = {};
    for (int64_t i = 0; i < n; ++i) {
      const T* dyr = dy + i * width + c0;
      const T* xr = x + i * width + c0;
      const T r = rstd[i];
      for (int64_t c = 0; c < cols; ++c) s[c] += dyr[c] * xr[c] * r;
    }
    for (int64_t c = 0; c < cols; ++c) dgain[c0 + c] += s[c];
  }
}

template void rmsnorm_forward<float>(const float*, const float*, int64_t, int64_t, float, float*, float*);
template void rmsnorm_forward<double>(const double*, const double*, int64_t, int64_t, double, double*, double*);
template void rmsnorm_backward<float>(const float*, const float*, const float*, const float*, int64_t, int64_t, float*,
                                      float*);
template void rmsnorm_backward<double>(const double*, const double*, const double*, const double*, int64_t, int64_t,
                                       double*, double*);

}  // namespace nibble::cpu
