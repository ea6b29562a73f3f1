// Element-wise transcendental functions for the model's FP32 layers (SwiGLU, softmax), vectorised.
#pragma once
#include <cstdint>

namespace nibble::cpu {

// out[i] = exp(x[i]) for i < n (in place allowed). With AVX-512 or AVX2 this is glibc's vector expf
// (libmvec, a well-kept library: <= 1 ulp from the exact value, like the scalar expf, but not always
// the same bits), else std::exp. The choice follows active_isa(), so a run is deterministic on one
// machine whatever its thread count. Vectorised because softmax and SwiGLU call it on every
// activation, where one value at a time shows in a training step.
void exp_f32(const float* x, float* out, int64_t n);
// out[i] = exp(-x[i]): exp_f32 of the negated values (negation is exact: the same bits), negated as
// they are loaded instead of in a pass of their own (SwiGLU's sigmoid).
void exp_neg_f32(const float* x, float* out, int64_t n);

}  // namespace nibble::cpu
