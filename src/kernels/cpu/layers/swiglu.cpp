#include "kernels/cpu/common/parallel.h"
#include "kernels/cpu/common/simd_clones.h"
#include "kernels/cpu/layers/swiglu.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/layers/vector_math.h"
#include "kernels/cpu/quantize/gather_stripes.h"

namespace nibble::cpu {

template <typename T>
void swiglu_forward(const T* gate_up, int64_t n, int64_t hidden, T* a) {
#pragma omp parallel for schedule(dynamic, dynamic_chunk(n)) if (n * hidden * 8 >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const T* g = gate_up + i * 2 * hidden;
    const T* u = g + hidden;
    T* ar = a + i * hidden;
    for (int64_t c = 0; c < hidden; ++c) ar[c] = g[c] / (T(1) + std::exp(-g[c])) * u[c];
  }
}

template <typename T>
void swiglu_backward(const T* gate_up, const T* da, int64_t n, int64_t hidden, T* dgate_up) {
#pragma omp parallel for schedule(dynamic, dynamic_chunk(n)) if (n * hidden * 8 >= kMinParallelWork)
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

// FP32: the exponentials a row at a time through the vector exp (cpu::exp_neg_f32), the rest in
// plain loops that vectorise. The double versions above are the finite-difference reference.
namespace {
// exp(-g[c]) for c < hidden, in a per-thread buffer valid until the thread's next call.
const float* exp_of_negated(const float* __restrict g, int64_t hidden) {
  static thread_local std::vector<float> e;
  e.resize(static_cast<size_t>(hidden));
  float* ex = e.data();
  cpu::exp_neg_f32(g, ex, hidden);
  return ex;
}

NIBBLE_SIMD_CLONES void forward_row(const float* __restrict g, const float* __restrict u, const float* __restrict ex,
                                    int64_t hidden, float* __restrict ar) {
#pragma omp simd
  for (int64_t c = 0; c < hidden; ++c) ar[c] = g[c] / (1.0f + ex[c]) * u[c];
}

NIBBLE_SIMD_CLONES void backward_row(const float* __restrict g, const float* __restrict u, const float* __restrict ex,
                                     const float* __restrict dar, int64_t hidden, float* __restrict dg,
                                     float* __restrict du) {
#pragma omp simd
  for (int64_t c = 0; c < hidden; ++c) {
    const float sig = 1.0f / (1.0f + ex[c]);
    const float silu = g[c] * sig;
    dg[c] = dar[c] * u[c] * sig * (1.0f + g[c] * (1.0f - sig));
    du[c] = dar[c] * silu;
  }
}
}  // namespace

template <>
void swiglu_forward<float>(const float* gate_up, int64_t n, int64_t hidden, float* a) {
#pragma omp parallel for schedule(dynamic, dynamic_chunk(n)) if (n * hidden * 8 >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const float* __restrict g = gate_up + i * 2 * hidden;
    const float* __restrict u = g + hidden;
    float* __restrict ar = a + i * hidden;
    forward_row(g, u, exp_of_negated(g, hidden), hidden, ar);
  }
}

void swiglu_forward_gathering(const float* gate_up, int64_t n, int64_t hidden, float* a, SourceAmax& amax) {
  for_stripes_gathering(n, hidden, amax, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) {
      const float* __restrict g = gate_up + i * 2 * hidden;
      forward_row(g, g + hidden, exp_of_negated(g, hidden), hidden, a + i * hidden);
    }
    return a;
  });
}

template <>
void swiglu_backward<float>(const float* gate_up, const float* da, int64_t n, int64_t hidden, float* dgate_up) {
#pragma omp parallel for schedule(dynamic, dynamic_chunk(n)) if (n * hidden * 8 >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const float* __restrict g = gate_up + i * 2 * hidden;
    const float* __restrict u = g + hidden;
    const float* __restrict dar = da + i * hidden;
    float* __restrict dg = dgate_up + i * 2 * hidden;
    float* __restrict du = dg + hidden;
    backward_row(g, u, exp_of_negated(g, hidden), dar, hidden, dg, du);
  }
}

void swiglu_backward_gathering(const float* gate_up, const float* da, int64_t n, int64_t hidden, float* dgate_up,
                               SourceAmax& amax) {
  for_stripes_gathering(n, 2 * hidden, amax, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) {
      const float* __restrict g = gate_up + i * 2 * hidden;
      float* __restrict dg = dgate_up + i * 2 * hidden;
      backward_row(g, g + hidden, exp_of_negated(g, hidden), da + i * hidden, hidden, dg, dg + hidden);
    }
    return dgate_up;
  });
}

template void swiglu_forward<double>(const double*, int64_t, int64_t, double*);
template void swiglu_backward<double>(const double*, const double*, int64_t, int64_t, double*);

}  // namespace nibble::cpu
