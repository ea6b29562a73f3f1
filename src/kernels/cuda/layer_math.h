// The model layers' per-row and per-element arithmetic as __host__ __device__ functions, written in
// the CPU kernels' operation order (kernels/cpu/{rmsnorm,rope,embedding,adamw}.cpp), so the CUDA
// kernels (layers.cu) that map threads onto these functions give the CPU's bits. test_cuda_backend
// runs these very functions on the host against the CPU kernels, so the port is checked in CI
// without a GPU; every FP32 operation goes through dm::nb_* (no FMA contraction on the device).
//
// The transcendental layers (SwiGLU, softmax, cross-entropy, attention) use the device's expf/logf,
// which are not the CPU's libmvec: those agree with the CPU within a bound, not bit for bit.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_math.h"

namespace nibble::cuda::lm {

using dm::nb_add;
using dm::nb_div;
using dm::nb_mul;
using dm::nb_sub;

NIBBLE_HD float nb_sqrt(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}

NIBBLE_HD double nb_add_d(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
NIBBLE_HD double nb_mul_d(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

// Sum of term(c) over c < width in 16 interleaved partial sums (lane c % 16), folded in a fixed tree:
// kernels/cpu/rmsnorm.cpp's lane_sum.
template <class Term>
NIBBLE_HD float lane_sum16(int64_t width, Term term) {
  float lanes[16] = {};
  int64_t c = 0;
  for (; c + 16 <= width; c += 16)
    for (int l = 0; l < 16; ++l) lanes[l] = nb_add(lanes[l], term(c + l));
  for (int l = 0; c < width; ++c, ++l) lanes[l] = nb_add(lanes[l], term(c));
  for (int half = 8; half >= 1; half /= 2)
    for (int l = 0; l < half; ++l) lanes[l] = nb_add(lanes[l], lanes[l + half]);
  return lanes[0];
}

// ---- RMSNorm ----------------------------------------------------------------------------------------
// One row: y = x * rstd * gain; returns rstd = 1 / sqrt(mean(x^2) + eps).
NIBBLE_HD float rmsnorm_row_forward(const float* x, const float* gain, int64_t width, float eps, float* y) {
  const float ss = lane_sum16(width, [x](int64_t c) { return nb_mul(x[c], x[c]); });
  const float r = nb_div(1.0f, nb_sqrt(nb_add(nb_div(ss, static_cast<float>(width)), eps)));
  for (int64_t c = 0; c < width; ++c) y[c] = nb_mul(nb_mul(x[c], r), gain[c]);
  return r;
}
// One row of dx += r (dy gain - x r mean(dy gain x r)).
NIBBLE_HD void rmsnorm_row_backward(const float* x, const float* gain, float r, const float* dy, int64_t width,
                                    float* dx) {
  const float dot =
      lane_sum16(width, [=](int64_t c) { return nb_mul(nb_mul(nb_mul(dy[c], gain[c]), x[c]), r); });
  const float mean_dot = nb_div(dot, static_cast<float>(width));
  for (int64_t c = 0; c < width; ++c)
    dx[c] = nb_add(dx[c], nb_mul(r, nb_sub(nb_mul(dy[c], gain[c]), nb_mul(nb_mul(x[c], r), mean_dot))));
}
// One column of dgain += sum over rows, in row order, of dy x rstd.
NIBBLE_HD void rmsnorm_gain_column(const float* x, const float* rstd, const float* dy, int64_t n, int64_t width,
                                   int64_t c, float* dgain) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s = nb_add(s, nb_mul(nb_mul(dy[i * width + c], x[i * width + c]), rstd[i]));
  dgain[c] = nb_add(dgain[c], s);
}

// ---- RoPE ---------------------------------------------------------------------------------------------
// The pair (v[i], v[i + half]) rotated by the angle whose cos/sin are c, s (direction -1: inverse).
NIBBLE_HD void rope_pair(float* a_ptr, float* b_ptr, float c, float s, float direction) {
  const float a = *a_ptr, b = *b_ptr, si = nb_mul(direction, s);
  *a_ptr = nb_sub(nb_mul(a, c), nb_mul(b, si));
  *b_ptr = nb_add(nb_mul(a, si), nb_mul(b, c));
}
// cos/sin of position p, pair i: computed in double from theta, as kernels/cpu/rope.cpp's table (on
// the host; the device reads the uploaded table).
inline void rope_angle(int64_t p, int64_t i, int64_t head_dim, double theta, float* c, float* s) {
  const double angle =
      static_cast<double>(p) * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
  *c = static_cast<float>(std::cos(angle));
  *s = static_cast<float>(std::sin(angle));
}

// ---- AdamW and the gradient norm -------------------------------------------------------------------
struct AdamWScalars {
  float clip, b1, b2, bias1, bias2, decay, lr, eps;
};
// kernels/cpu/adamw.cpp's update of one element.
NIBBLE_HD void adamw_element(const AdamWScalars& k, float g_in, float* mp, float* vp, float* wp, uint8_t decay_flag) {
  const float g = nb_mul(g_in, k.clip);
  const float m = nb_add(nb_mul(k.b1, *mp), nb_mul(nb_sub(1.0f, k.b1), g));
  const float v = nb_add(nb_mul(k.b2, *vp), nb_mul(nb_mul(nb_sub(1.0f, k.b2), g), g));
  *mp = m;
  *vp = v;
  const float m_hat = nb_div(m, k.bias1), v_hat = nb_div(v, k.bias2);
  const float w = nb_sub(*wp, nb_mul(nb_mul(static_cast<float>(decay_flag), k.decay), *wp));
  *wp = nb_sub(w, nb_div(nb_mul(k.lr, m_hat), nb_add(nb_sqrt(v_hat), k.eps)));
}

inline constexpr int64_t kSumOfSquaresChunk = int64_t{1} << 14;
// The sum of squares of one chunk [begin, end) in eight interleaved double lanes folded in a fixed
// tree (kernels/cpu/adamw.cpp's sum_of_squares); the chunks' sums are then added in order.
NIBBLE_HD double sum_of_squares_chunk(const float* g, int64_t begin, int64_t end) {
  double lanes[8] = {};
  int64_t i = begin;
  for (; i + 8 <= end; i += 8)
    for (int l = 0; l < 8; ++l) {
      const double x = static_cast<double>(g[i + l]);
      lanes[l] = nb_add_d(lanes[l], nb_mul_d(x, x));
    }
  for (; i < end; ++i) {
    const double x = static_cast<double>(g[i]);
    lanes[0] = nb_add_d(lanes[0], nb_mul_d(x, x));
  }
  return nb_add_d(nb_add_d(nb_add_d(lanes[0], lanes[1]), nb_add_d(lanes[2], lanes[3])),
                  nb_add_d(nb_add_d(lanes[4], lanes[5]), nb_add_d(lanes[6], lanes[7])));
}

}  // namespace nibble::cuda::lm
