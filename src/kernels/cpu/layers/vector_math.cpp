#include "kernels/cpu/layers/vector_math.h"

#include <cmath>

#include "kernels/cpu/common/cpu_features.h"

namespace nibble::cpu {
namespace vector_math {
void exp_avx512(const float* x, float* out, int64_t n, bool negate);
void exp_avx2(const float* x, float* out, int64_t n, bool negate);
}  // namespace vector_math

namespace {
void exp_of(const float* x, float* out, int64_t n, bool negate) {
  const Isa isa = active_isa();
  if (isa >= Isa::avx512) return vector_math::exp_avx512(x, out, n, negate);
  if (isa == Isa::avx2) return vector_math::exp_avx2(x, out, n, negate);
  for (int64_t i = 0; i < n; ++i) out[i] = std::exp(negate ? -x[i] : x[i]);
}
}  // namespace

void exp_f32(const float* x, float* out, int64_t n) { exp_of(x, out, n, false); }
void exp_neg_f32(const float* x, float* out, int64_t n) { exp_of(x, out, n, true); }

}  // namespace nibble::cpu
