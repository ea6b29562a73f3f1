#include "kernels/cpu/layers/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/common/lane_sum.h"
#include "kernels/cpu/common/parallel.h"
#include "kernels/cpu/common/simd_clones.h"
#include "kernels/cpu/layers/vector_math.h"

namespace nibble::cpu {

// Per row: m = max(l);  sum = sum over v of exp(l[v] - m) (lane_sum order);
//   forward:  loss = log(sum) + m - l[target]
//   backward: d[v] = exp(l[v] - m) * (1 / sum) * scale, then d[target] -= scale.
// The generic version (double: the tests' reference) calls std::exp; the FP32 one below runs the
// exponentials a row at a time through the vector exp (exp_f32) and the loops in per-ISA copies: with
// a GPT-2 vocabulary (50257) one exp at a time cost more than a millisecond per token.

template <typename T>
double cross_entropy_forward(const T* logits, const int32_t* targets, int64_t n, int64_t vocab, T* loss) {
#pragma omp parallel for schedule(dynamic, dynamic_chunk(n)) if (n * vocab * 8 >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const T* l = logits + i * vocab;
    const T m = *std::max_element(l, l + vocab);
    const T sum = lane_sum<T>(vocab, [=](int64_t v) { return std::exp(l[v] - m); });
    loss[i] = std::log(sum) + m - l[targets[i]];
  }
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += static_cast<double>(loss[i]);
  return total;
}

template <typename T>
void cross_entropy_backward(const T* logits, const int32_t* targets, int64_t n, int64_t vocab, T scale, T* dlogits) {
#pragma omp parallel for schedule(dynamic, dynamic_chunk(n)) if (n * vocab * 8 >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const T* l = logits + i * vocab;
    T* d = dlogits + i * vocab;
    const T m = *std::max_element(l, l + vocab);
    for (int64_t v = 0; v < vocab; ++v) d[v] = std::exp(l[v] - m);
    const T inv = T(1) / lane_sum<T>(vocab, [=](int64_t v) { return d[v]; });
    for (int64_t v = 0; v < vocab; ++v) d[v] = d[v] * inv * scale;
    d[targets[i]] -= scale;
  }
}

namespace {
// max of l[0, vocab): a maximum, so any order gives the same value (a NaN logit makes the row's sum
// NaN whichever maximum is taken).
NIBBLE_SIMD_CLONES float row_max(const float* __restrict l, int64_t vocab) {
  float m = l[0];
#pragma omp simd reduction(max : m)
  for (int64_t v = 1; v < vocab; ++v) m = std::max(m, l[v]);
  return m;
}
// out may be l (element-wise, in place).
NIBBLE_SIMD_CLONES void shifted(const float* l, int64_t vocab, float m, float* out) {
#pragma omp simd
  for (int64_t v = 0; v < vocab; ++v) out[v] = l[v] - m;
}
NIBBLE_SIMD_CLONES float row_sum(const float* __restrict e, int64_t vocab) {
  return lane_sum<float>(vocab, [=](int64_t v) { return e[v]; });
}
NIBBLE_SIMD_CLONES void scaled(float* __restrict d, int64_t vocab, float inv, float scale) {
#pragma omp simd
  for (int64_t v = 0; v < vocab; ++v) d[v] = d[v] * inv * scale;
}
// exp(l - max(l)) into e; returns max(l).
float exp_of_shifted_row(const float* l, int64_t vocab, float* e) {
  const float m = row_max(l, vocab);
  shifted(l, vocab, m, e);
  exp_f32(e, e, vocab);
  return m;
}
}  // namespace

double cross_entropy_forward_keeping(const float* logits, const int32_t* targets, int64_t n, int64_t vocab, float* loss,
                                     float* row_stats) {
#pragma omp parallel for schedule(dynamic, dynamic_chunk(n)) if (n * vocab * 8 >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    static thread_local std::vector<float> e;
    e.resize(static_cast<size_t>(vocab));
    const float* l = logits + i * vocab;
    const float m = exp_of_shifted_row(l, vocab, e.data());
    const float sum = row_sum(e.data(), vocab);
    loss[i] = std::log(sum) + m - l[targets[i]];
    if (row_stats) {
      row_stats[2 * i] = m;
      row_stats[2 * i + 1] = 1.0f / sum;  // the backward's factor, as it computes it
    }
  }
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += static_cast<double>(loss[i]);
  return total;
}

template <>
double cross_entropy_forward<float>(const float* logits, const int32_t* targets, int64_t n, int64_t vocab,
                                    float* loss) {
  return cross_entropy_forward_keeping(logits, targets, n, vocab, loss, nullptr);
}

void cross_entropy_backward_kept(const float* logits, const int32_t* targets, int64_t n, int64_t vocab, float scale,
                                 const float* row_stats, float* dlogits) {
#pragma omp parallel for schedule(dynamic, dynamic_chunk(n)) if (n * vocab * 8 >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    float* d = dlogits + i * vocab;  // may be the logits themselves (element-wise, in place)
    shifted(logits + i * vocab, vocab, row_stats[2 * i], d);
    exp_f32(d, d, vocab);
    scaled(d, vocab, row_stats[2 * i + 1], scale);
    d[targets[i]] -= scale;
  }
}

template <>
void cross_entropy_backward<float>(const float* logits, const int32_t* targets, int64_t n, int64_t vocab, float scale,
                                   float* dlogits) {
#pragma omp parallel for schedule(dynamic, dynamic_chunk(n)) if (n * vocab * 8 >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    float* d = dlogits + i * vocab;  // may be the logits themselves: each row is read before it is written
    const float* l = logits + i * vocab;
    exp_of_shifted_row(l, vocab, d);
    scaled(d, vocab, 1.0f / row_sum(d, vocab), scale);
    d[targets[i]] -= scale;
  }
}

template double cross_entropy_forward<double>(const double*, const int32_t*, int64_t, int64_t, double*);
template void cross_entropy_backward<double>(const double*, const int32_t*, int64_t, int64_t, double, double*);

}  // namespace nibble::cpu
