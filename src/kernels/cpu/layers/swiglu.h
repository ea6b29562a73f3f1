// SwiGLU activation of the MLP: a = silu(gate) * up, where gate and up are the two halves of the
// fused first linear's output. Kept in high precision.
#pragma once
#include <cstdint>

#include "format/source_amax.h"

namespace nibble::cpu {

// gate_up: [N, 2*hidden] (gate in columns [0, hidden), up in [hidden, 2*hidden)); a: [N, hidden].
template <typename T>
void swiglu_forward(const T* gate_up, int64_t n, int64_t hidden, T* a);
// dgate_up: [N, 2*hidden] overwritten.
//   dgate = da * up * silu'(gate), silu'(g) = s (1 + g (1 - s)) with s = sigmoid(g);  dup = da * silu(gate)
template <typename T>
void swiglu_backward(const T* gate_up, const T* da, int64_t n, int64_t hidden, T* dgate_up);

// FP32: the exponentials through the vector exp (cpu::exp_f32); the double versions are the plain
// loops that the finite-difference tests check. Tests check that the two agree.
template <>
void swiglu_forward<float>(const float* gate_up, int64_t n, int64_t hidden, float* a);
// As swiglu_forward<float>, with a's SourceAmax (amax.rht set by the caller) gathered 16 rows at a
// time in the same pass (rmsnorm_forward_gathering). hidden % 16 == 0; with amax.rht, N % 16 == 0.
void swiglu_forward_gathering(const float* gate_up, int64_t n, int64_t hidden, float* a, SourceAmax& amax);
// As swiglu_backward<float>, with dgate_up's SourceAmax ([N, 2*hidden]) gathered in the same pass,
// for the gate_up linear's backward quantization of its dY.
void swiglu_backward_gathering(const float* gate_up, const float* da, int64_t n, int64_t hidden, float* dgate_up,
                               SourceAmax& amax);
template <>
void swiglu_backward<float>(const float* gate_up, const float* da, int64_t n, int64_t hidden, float* dgate_up);

}  // namespace nibble::cpu
