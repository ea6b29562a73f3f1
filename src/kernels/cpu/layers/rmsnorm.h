// RMSNorm: y = x / sqrt(mean(x^2) + eps) * gain, per row. Kept in high precision.
#pragma once
#include <cstdint>

#include "format/source_amax.h"

namespace nibble::cpu {

// x, y: [N, width]; gain: [width]; rstd: [N] (saved for backward).
template <typename T>
void rmsnorm_forward(const T* x, const T* gain, int64_t n, int64_t width, T eps, T* y, T* rstd);
// As rmsnorm_forward<float>, with the quantization of y that reads it next in its epilogue: y's
// SourceAmax (amax.rht set by the caller) gathered 16 rows at a time while they are in cache.
// width % 16 == 0; with amax.rht, N % 16 == 0. y and rstd are rmsnorm_forward's bits.
void rmsnorm_forward_gathering(const float* x, const float* gain, int64_t n, int64_t width, float eps, float* y,
                               float* rstd, SourceAmax& amax);
// The gain gradient's summation order (ops::kGainTileTokens): per column, the terms in token order
// within tiles of this many tokens, the tiles' sums added in order.
inline constexpr int64_t kGainTileTokens = 256;
// dx[N, width] += dL/dx; dgain[width] += dL/dgain.
//   xhat = x * rstd;  dxhat = dy * gain;  dx = rstd * (dxhat - xhat * mean(dxhat * xhat))
//   dgain[c] += sum over tiles k in order of (sum over tokens i of tile k in order of dy[i][c] x[i][c] rstd[i])
template <typename T>
void rmsnorm_backward(const T* x, const T* gain, const T* rstd, const T* dy, int64_t n, int64_t width, T* dx,
                      T* dgain);
// As rmsnorm_backward<float>, with the SourceAmax of the whole dx (after the addition: the residual
// stream's gradient, which the linear before it quantizes as its dY) gathered 16 rows at a time as
// they are written. width % 16 == 0; with amax.rht, N % 16 == 0. dx and dgain are rmsnorm_backward's bits.
void rmsnorm_backward_gathering(const float* x, const float* gain, const float* rstd, const float* dy, int64_t n,
                                int64_t width, float* dx, float* dgain, SourceAmax& amax);

}  // namespace nibble::cpu
