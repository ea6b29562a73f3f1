#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/parallel.h"

#include <algorithm>
#include <cmath>

namespace nibble::cpu {

template <typename T>
double cross_entropy_forward(const T* logits, const int32_t* targets, int64_t n, int64_t vocab, T* loss) {
#pragma omp parallel for schedule(static) if (n * vocab * 8 >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const T* l = logits + i * vocab;
    const T m = *std::max_element(l, l + vocab);
    T sum = 0;
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(l[v] - m);
    loss[i] = std::log(sum) + m - l[targets[i]];
  }
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += static_cast<double>(loss[i]);
  return total;
}

template <typename T>
void cross_entropy_backward(const T* logits, const int32_t* targets, int64_t n, int64_t vocab, T scale, T* dlogits) {
#pragma omp parallel for schedule(static) if (n * vocab * 8 >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const T* l = logits + i * vocab;
    T* d = dlogits + i * vocab;
    const T m = *std::max_element(l, l + vocab);
    T sum = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      d[v] = std::exp(l[v] - m);
      sum += d[v];
    }
    const T inv = T(1) / sum;
    for (int64_t v = 0; v < vocab; ++v) d[v] = d[v] * inv * scale;
    d[targets[i]] -= scale;
  }
}

template double cross_entropy_forward<float>(const float*, const int32_t*, int64_t, int64_t, float*);
template double cross_entropy_forward<double>(const double*, const int32_t*, int64_t, int64_t, double*);
template void cross_entropy_backward<float>(const float*, const int32_t*, int64_t, int64_t, float, float*);
template void cross_entropy_backward<double>(const double*, const int32_t*, int64_t, int64_t, double, double*);

}  // namespace nibble::cpu
