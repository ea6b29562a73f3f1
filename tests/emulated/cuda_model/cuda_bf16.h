// <cuda_bf16.h> for the CUDA model: the BF16 type and its conversions with CUDA's rounding.
#pragma once
#include <cstdint>

#include "cuda_runtime.h"

struct __nv_bfloat16 {
  unsigned short __x;
};
// Round to nearest even; NaN becomes the canonical 0x7FFF (as cuda_bf16.hpp's conversion).
inline __nv_bfloat16 __float2bfloat16(float f) {
  const unsigned u = __float_as_uint(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return {0x7FFF};
  return {static_cast<unsigned short>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16)};
}
inline float __bfloat162float(__nv_bfloat16 b) { return __uint_as_float(static_cast<unsigned>(b.__x) << 16); }
