// RMSNorm: y = x / sqrt(mean(x^2) + eps) * gain, per row. Kept in high precision.
#pragma once
#include <cstdint>

namespace nibble::cpu {

// x, y: [N, width]; gain: [width]; rstd: [N] (saved for backward).
template <typename T>
void rmsnorm_forward(const T* x, const T* gain, int64_t n, int64_t width, T eps, T* y, T* rstd);
// dx[N, width] += dL/dx; dgain[width] += dL/dgain.
//   xhat = x * rstd;  dxhat = dy * gain;  dx = rstd * (dxhat - xhat * mean(dxhat * xhat))
template <typename T>
void rmsnorm_backward(const T* x, const T* gain, const T* rstd, const T* dy, int64_t n, int64_t width, T* dx,
                      T* dgain);

}  // namespace nibble::cpu
