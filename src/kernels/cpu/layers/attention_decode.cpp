// Causal attention of a few new tokens over a KV cache (kernels/cpu/layers/attention.h: attention_decode).
// One token's work is small, so threads are used only when a step's work is large.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/common/parallel.h"
#include "kernels/cpu/layers/attention.h"

namespace nibble::cpu {

void attention_decode(const AttentionShape& s, int64_t past, const float* qkv, float* k_cache, float* v_cache,
                      float* out) {
  NIBBLE_CHECK(s.batch == 1 && !s.bf16_matmuls && s.kv_heads > 0 && s.heads % s.kv_heads == 0 && past >= 0,
               "attention_decode: one FP32 sequence, heads a multiple of kv_heads, past >= 0");
  const int64_t n = s.seq, H = s.heads, hd = s.head_dim, kv_width = s.kv_heads * hd, stride = s.qkv_stride();
  const int64_t group = H / s.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int64_t t = 0; t < n; ++t) {
    const float* row = qkv + t * stride;
    std::copy(row + H * hd, row + H * hd + kv_width, k_cache + (past + t) * kv_width);
    std::copy(row + H * hd + kv_width, row + H * hd + 2 * kv_width, v_cache + (past + t) * kv_width);
  }
  const int64_t keys = past + n;
#pragma omp parallel for collapse(2) schedule(static) if (n * H * keys * hd * 2 >= kMinParallelWork)
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const float* q = qkv + t * stride + h * hd;
      const int64_t g = h / group, last = past + t;  // keys [0, last]
      std::vector<float> scores(static_cast<size_t>(last + 1));
      float max_score = -INFINITY;
      for (int64_t j = 0; j <= last; ++j) {
        const float* k = k_cache + j * kv_width + g * hd;
        float dot = 0;
        for (int64_t i = 0; i < hd; ++i) dot += q[i] * k[i];
        scores[j] = dot * scale;
        max_score = std::max(max_score, scores[j]);
      }
      float sum = 0;
      for (int64_t j = 0; j <= last; ++j) sum += (scores[j] = std::exp(scores[j] - max_score));
      float* o = out + t * H * hd + h * hd;
      std::fill(o, o + hd, 0.0f);
      for (int64_t j = 0; j <= last; ++j) {
        const float p = scores[j] / sum;
        const float* v = v_cache + j * kv_width + g * hd;
        for (int64_t i = 0; i < hd; ++i) o[i] += p * v[i];
      }
    }
}

}  // namespace nibble::cpu
