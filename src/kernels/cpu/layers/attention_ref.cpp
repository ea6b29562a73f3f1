#include "kernels/cpu/common/parallel.h"
#include "kernels/cpu/layers/attention_ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/error.h"

namespace nibble::ref {

template <typename T>
void attention_forward(const AttentionShape& s, const T* qkv, T* out, T* softmax_stats) {
  NIBBLE_CHECK(s.kv_heads > 0 && s.heads % s.kv_heads == 0, "attention shape: heads a multiple of kv_heads");
  const int64_t S = s.seq, hd = s.head_dim, stride = s.qkv_stride(), ow = s.out_width();
  const int64_t group = s.heads / s.kv_heads;
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
  // Each (sequence, query head, query position) is independent: any thread count gives the same bits.
#pragma omp parallel for collapse(2) schedule(static) if (s.batch * s.heads * S * S * hd >= cpu::kMinParallelWork)
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t kcol = (s.heads + h / group) * hd, vcol = (s.heads + s.kv_heads + h / group) * hd;
      std::vector<T> row(static_cast<size_t>(S));
      for (int64_t t = 0; t < S; ++t) {
        const T* q = qkv + (b * S + t) * stride + h * hd;
        T* p = row.data();
        T maxv = -INFINITY;
        for (int64_t j = 0; j <= t; ++j) {
          const T* k = qkv + (b * S + j) * stride + kcol;
          T dot = 0;
          for (int64_t i = 0; i < hd; ++i) dot += q[i] * k[i];
          p[j] = dot * scale;
          maxv = std::max(maxv, p[j]);
        }
        T sum = 0;
        for (int64_t j = 0; j <= t; ++j) {
          p[j] = std::exp(p[j] - maxv);
          sum += p[j];
        }
        const T inv = T(1) / sum;
        for (int64_t j = 0; j <= t; ++j) p[j] *= inv;
        T* stats = softmax_stats + ((b * s.heads + h) * S + t) * 2;
        stats[0] = maxv, stats[1] = inv;
        T* o = out + (b * S + t) * ow + h * hd;
        std::fill(o, o + hd, T(0));
        for (int64_t j = 0; j <= t; ++j) {
          const T* v = qkv + (b * S + j) * stride + vcol;
          const T pj = p[j];
          for (int64_t i = 0; i < hd; ++i) o[i] += pj * v[i];
        }
      }
    }
}

template <typename T>
void attention_backward(const AttentionShape& s, const T* qkv, const T* softmax_stats, const T* dout, T* dqkv) {
  const int64_t S = s.seq, hd = s.head_dim, stride = s.qkv_stride(), ow = s.out_width();
  const int64_t group = s.heads / s.kv_heads;
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
  // dK and dV of a key/value head collect contributions from every query head of its group, so the
  // work is split by (sequence, kv head) and the group's query heads run in a fixed order inside.
#pragma omp parallel for collapse(2) schedule(static) if (s.batch * s.heads * S * S * hd >= cpu::kMinParallelWork)
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t g = 0; g < s.kv_heads; ++g) {
      const int64_t kcol = (s.heads + g) * hd, vcol = (s.heads + s.kv_heads + g) * hd;
      for (int64_t t = 0; t < S; ++t) {
        std::fill(dqkv + (b * S + t) * stride + kcol, dqkv + (b * S + t) * stride + kcol + hd, T(0));
        std::fill(dqkv + (b * S + t) * stride + vcol, dqkv + (b * S + t) * stride + vcol + hd, T(0));
      }
      std::vector<T> dp(static_cast<size_t>(S)), p(static_cast<size_t>(S));
      for (int64_t h = g * group; h < (g + 1) * group; ++h)
        for (int64_t t = 0; t < S; ++t) {
          // The forward's probabilities of row t, from its saved maximum and 1 / sum.
          const T* stats = softmax_stats + ((b * s.heads + h) * S + t) * 2;
          const T* q = qkv + (b * S + t) * stride + h * hd;
          for (int64_t j = 0; j <= t; ++j) {
            const T* k = qkv + (b * S + j) * stride + kcol;
            T dot = 0;
            for (int64_t i = 0; i < hd; ++i) dot += q[i] * k[i];
            p[j] = std::exp(dot * scale - stats[0]) * stats[1];
          }
          const T* dO = dout + (b * S + t) * ow + h * hd;
          T* dq = dqkv + (b * S + t) * stride + h * hd;
          T pdp = 0;
          for (int64_t j = 0; j <= t; ++j) {
            const T* v = qkv + (b * S + j) * stride + vcol;
            T* dv = dqkv + (b * S + j) * stride + vcol;
            T dot = 0;
            for (int64_t i = 0; i < hd; ++i) {
              dot += dO[i] * v[i];
              dv[i] += p[j] * dO[i];
            }
            dp[j] = dot;
            pdp += p[j] * dot;
          }
          std::fill(dq, dq + hd, T(0));
          for (int64_t j = 0; j <= t; ++j) {
            const T ds = p[j] * (dp[j] - pdp) * scale;
            const T* k = qkv + (b * S + j) * stride + kcol;
            T* dk = dqkv + (b * S + j) * stride + kcol;
            for (int64_t i = 0; i < hd; ++i) {
              dq[i] += ds * k[i];
              dk[i] += ds * q[i];
            }
          }
        }
    }
}

template void attention_forward<double>(const AttentionShape&, const double*, double*, double*);
template void attention_backward<double>(const AttentionShape&, const double*, const double*, const double*, double*);

}  // namespace nibble::ref
