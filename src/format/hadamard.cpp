#include "format/hadamard.h"

#include "format/codecs.h"

namespace nibble {
namespace {
// Sylvester butterfly: y_j = sum_i v_i * (-1)^popcount(i & j).
void walsh_hadamard16(float* v) {
  for (int h = 1; h < kRhtSize; h <<= 1)
    for (int i = 0; i < kRhtSize; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        float a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
}
}  // namespace

void rht16_forward(float* v) {
  for (int i = 0; i < kRhtSize; ++i) v[i] *= kRhtSigns[i];
  walsh_hadamard16(v);
  for (int i = 0; i < kRhtSize; ++i) v[i] *= 0.25f;
}

void rht16_inverse(float* v) {
  walsh_hadamard16(v);
  for (int i = 0; i < kRhtSize; ++i) v[i] *= 0.25f * kRhtSigns[i];
}

void rht_rows(std::span<const float> x, int64_t rows, int64_t cols, std::span<float> out, bool round_bf16) {
  for (int64_t i = 0; i < rows * cols; i += kRhtSize) {
    float* v = out.data() + i;
    for (int k = 0; k < kRhtSize; ++k) v[k] = x[i + k];
    rht16_forward(v);
    if (round_bf16)
      for (int k = 0; k < kRhtSize; ++k) v[k] = round_to_bf16(v[k]);
  }
}

void rht_rows_inverse(std::span<float> x, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows * cols; i += kRhtSize) rht16_inverse(x.data() + i);
}

}  // namespace nibble
