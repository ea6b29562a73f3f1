#include "kernels/cpu/layers/adamw.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/common/parallel.h"
#include "kernels/cpu/common/simd_clones.h"

namespace nibble::cpu {

namespace {
constexpr int64_t kChunk = 1 << 14;  // the AdamW update's work unit

// The update of n consecutive elements. Element-wise and IEEE (vdivps/vsqrtps round like their
// scalar forms), so the vector clones give the scalar loop's bits; cloned per ISA because the
// baseline x86-64 build runs it scalar, and it touches every parameter each step.
NIBBLE_SIMD_CLONES void adamw_range(
    const AdamWConstants& k, const float* __restrict g_in, float* __restrict mp, float* __restrict vp,
    float* __restrict wp, const uint8_t* __restrict dp, int64_t n) {
  const float clip = k.clip, b1 = k.b1, b2 = k.b2, bias1 = k.bias1, bias2 = k.bias2, decay = k.decay, lr = k.lr,
              eps = k.eps;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float g = g_in[i] * clip;
    const float m = b1 * mp[i] + (1.0f - b1) * g;
    const float v = b2 * vp[i] + (1.0f - b2) * g * g;
    mp[i] = m;
    vp[i] = v;
    const float m_hat = m / bias1, v_hat = v / bias2;
    // Decoupled decay, not part of the adaptive gradient; written without a branch (dp is 0 or 1,
    // and w - 0 * w == w) so that the loop vectorises.
    const float w = wp[i] - (static_cast<float>(dp[i]) * decay) * wp[i];
    wp[i] = w - lr * m_hat / (std::sqrt(v_hat) + eps);
  }
}

// Chunks [c0, c1) of g, each summed in eight interleaved double lanes (lane i % 8) added in a fixed
// order: the same bits for any thread count because the chunks are fixed, and for any vector width
// because a float's square is exact in double. A lane adds once per eight values, so one chunk at a
// time is bound by the add's latency (about 2.5x the time of reading g on AVX-512 machines): the
// full chunks go four at a time, four independent chains, each chunk's lanes in its own order.
NIBBLE_SIMD_CLONES void sum_of_squares_chunks(const float* __restrict g, int64_t n, int64_t c0, int64_t c1,
                                               double* __restrict partial) {
  constexpr int kTogether = 4;
  const auto fold = [](const double* l) { return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])); };
  const int64_t full_end = std::min(c1, n / kSumOfSquaresChunk);
  int64_t c = c0;
  for (; c + kTogether <= full_end; c += kTogether) {
    double lanes[kTogether][8] = {};
    const float* x = g + c * kSumOfSquaresChunk;
    for (int64_t i = 0; i < kSumOfSquaresChunk; i += 8)
      for (int k = 0; k < kTogether; ++k)
        for (int l = 0; l < 8; ++l) {
          const double v = x[k * kSumOfSquaresChunk + i + l];
          lanes[k][l] += v * v;
        }
    for (int k = 0; k < kTogether; ++k) partial[c + k] = fold(lanes[k]);
  }
  for (; c < c1; ++c) {
    double lanes[8] = {};
    const int64_t begin = c * kSumOfSquaresChunk, end = std::min(n, (c + 1) * kSumOfSquaresChunk);
    int64_t i = begin;
    for (; i + 8 <= end; i += 8)
      for (int l = 0; l < 8; ++l) {
        const double v = g[i + l];
        lanes[l] += v * v;
      }
    for (; i < end; ++i) lanes[0] += static_cast<double>(g[i]) * g[i];
    partial[c] = fold(lanes);
  }
}
}  // namespace

void sum_of_squares_by_chunk(const float* g, int64_t n, double* partial) {
  constexpr int64_t kChunksPerTask = 4;
  const int64_t chunks = (n + kSumOfSquaresChunk - 1) / kSumOfSquaresChunk;
  const int64_t tasks = (chunks + kChunksPerTask - 1) / kChunksPerTask;
#pragma omp parallel for schedule(dynamic, dynamic_chunk(tasks)) if (n >= kMinParallelWork)
  for (int64_t t = 0; t < tasks; ++t)
    sum_of_squares_chunks(g, n, t * kChunksPerTask, std::min(chunks, (t + 1) * kChunksPerTask), partial);
}

double sum_of_squares(const float* g, int64_t n) {
  std::vector<double> partial(static_cast<size_t>((n + kSumOfSquaresChunk - 1) / kSumOfSquaresChunk), 0.0);
  sum_of_squares_by_chunk(g, n, partial.data());
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

void adamw_update(const AdamWConstants& k, const float* g, float* m, float* v, float* w, const uint8_t* decay_mask,
                  int64_t n) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(dynamic, dynamic_chunk(chunks)) if (n >= kMinParallelWork)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk, end = std::min(n, begin + kChunk);
    adamw_range(k, g + begin, m + begin, v + begin, w + begin, decay_mask + begin, end - begin);
  }
}

}  // namespace nibble::cpu
