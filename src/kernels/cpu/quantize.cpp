// Dispatch for the CPU quantizers. Until the vectorised kernels land this forwards to the
// reference, which is already bit-exact by definition.
#include "kernels/cpu/quantize.h"

namespace nibble::cpu {

QuantizedTensor quantize(std::span<const float> x, int64_t rows, int64_t cols, const QuantOptions& opt) {
  return ref::quantize(x, rows, cols, opt);
}
QuantizedTensor quantize(std::span<const bf16> x, int64_t rows, int64_t cols, const QuantOptions& opt) {
  return ref::quantize(x, rows, cols, opt);
}
QuantizedTensor quantize_transposed(std::span<const float> x, int64_t rows, int64_t cols, const QuantOptions& opt) {
  return ref::quantize_transposed(x, rows, cols, opt);
}
void dequantize(const QuantizedTensor& q, std::span<float> out) { ref::dequantize(q, out); }

}  // namespace nibble::cpu
