#include "model/swiglu.h"
#include "model/parallel.h"

#include <cmath>

namespace nibble::model {

template <typename T>
void swiglu_forward(const T* gate_up, int64_t n, int64_t hidden, T* a) {
#pragma omp parallel for schedule(static) if (n * hidden * 8 >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const T* g = gate_up + i * 2 * hidden;
    const T* u = g + hidden;
    T* ar = a + i * hidden;
    for (int64_t c = 0; c < hidden; ++c) ar[c] = g[c] / (T(1) + std::exp(-g[c])) * u[c];
  }
}

template <typename T>
void swiglu_backward(const T* gate_up, const T* da, int64_t n, int64_t hidden, T* dgate_up) {
#pragma omp parallel for schedule(static) if (n * hidden * 8 >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const T* g = gate_up + i * 2 * hidden;
    const T* u = g + hidden;
    const T* dar = da + i * hidden;
    T* dg = dgate_up + i * 2 * hidden;
    T* du = dg + hidden;
    for (int64_t c = 0; c < hidden; ++c) {
      const T sig = T(1) / (T(1) + std::exp(-g[c]));
      const T silu = g[c] * sig;
      dg[c] = dar[c] * u[c] * sig * (T(1) + g[c] * (T(1) - sig));
      du[c] = dar[c] * silu;
    }
  }
}

template void swiglu_forward<float>(const float*, int64_t, int64_t, float*);
template void swiglu_forward<double>(const double*, int64_t, int64_t, double*);
template void swiglu_backward<float>(const float*, const float*, int64_t, int64_t, float*);
template void swiglu_backward<double>(const double*, const double*, int64_t, int64_t, double*);

}  // namespace nibble::model
