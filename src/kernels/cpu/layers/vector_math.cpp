#include "kernels/cpu/layers/vector_math.h"

#include <cmath>

#include "kernels/cpu/common/cpu_features.h"

namespace nibble::cpu {
namespace vector_math {
void exp_avx512(const float* x, float* out, int64_t n);
void exp_avx2(const float* x, float* out, int64_t n);
}  // namespace vector_math

void exp_f32(const float* x, float* out, int64_t n) {
  const Isa isa = active_isa();
  if (isa >= Isa::avx512) return vector_math::exp_avx512(x, out, n);
  if (isa == Isa::avx2) return vector_math::exp_avx2(x, out, n);
  for (int64_t i = 0; i < n; ++i) out[i] = std::exp(x[i]);
}

}  // namespace nibble::cpu
