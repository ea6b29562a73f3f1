// The optimizer's element-wise kernels: the fixed-order sum of squares behind the global gradient
// norm, and the AdamW update (decoupled weight decay, Loshchilov & Hutter) of a parameter range.
#pragma once
#include <cstdint>

namespace nibble::cpu {

// The summation unit of sum_of_squares (ops::kSumOfSquaresChunk, which ZeRO shards align to).
inline constexpr int64_t kSumOfSquaresChunk = int64_t{1} << 14;
// sum g[i]^2 in double, in chunks of kSumOfSquaresChunk whose partial sums are added in order, each
// chunk in eight interleaved lanes: the same bits for any thread count.
double sum_of_squares(const float* g, int64_t n);
// The partial sums themselves, one per chunk (ceil(n / kSumOfSquaresChunk) of them): sum_of_squares
// is 0.0 + partial[0] + partial[1] + ... in that order.
void sum_of_squares_by_chunk(const float* g, int64_t n, double* partial);

struct AdamWConstants {
  float clip, b1, b2, bias1, bias2, decay, lr, eps;
};
// For each i < n:
//   g = g_in * clip;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   w = w - decay_mask * decay * w;  w -= lr (m / bias1) / (sqrt(v / bias2) + eps)
// Element-wise and IEEE, so any split over threads and vector widths gives the same bits.
void adamw_update(const AdamWConstants& k, const float* g, float* m, float* v, float* w, const uint8_t* decay_mask,
                  int64_t n);

}  // namespace nibble::cpu
