#include "model/attention.h"
#include "model/parallel.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "format/quantized_tensor.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/vector_math.h"

namespace nibble::model {

template <typename T>
void attention_forward(const AttentionShape& s, const T* qkv, T* out, T* probs) {
  NIBBLE_CHECK(s.kv_heads > 0 && s.heads % s.kv_heads == 0);
  const int64_t S = s.seq, hd = s.head_dim, stride = s.qkv_stride(), ow = s.out_width();
  const int64_t group = s.heads / s.kv_heads;
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
  // Each (sequence, query head, query position) is independent: any thread count gives the same bits.
#pragma omp parallel for collapse(2) schedule(static) if (s.batch * s.heads * S * S * hd >= kMinParallelWork)
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t kcol = (s.heads + h / group) * hd, vcol = (s.heads + s.kv_heads + h / group) * hd;
      for (int64_t t = 0; t < S; ++t) {
        const T* q = qkv + (b * S + t) * stride + h * hd;
        T* p = probs + ((b * s.heads + h) * S + t) * S;
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
        std::fill(p + t + 1, p + S, T(0));
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
void attention_backward(const AttentionShape& s, const T* qkv, const T* probs, const T* dout, T* dqkv) {
  const int64_t S = s.seq, hd = s.head_dim, stride = s.qkv_stride(), ow = s.out_width();
  const int64_t group = s.heads / s.kv_heads;
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
  // dK and dV of a key/value head collect contributions from every query head of its group, so the
  // work is split by (sequence, kv head) and the group's query heads run in a fixed order inside.
#pragma omp parallel for collapse(2) schedule(static) if (s.batch * s.heads * S * S * hd >= kMinParallelWork)
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t g = 0; g < s.kv_heads; ++g) {
      const int64_t kcol = (s.heads + g) * hd, vcol = (s.heads + s.kv_heads + g) * hd;
      for (int64_t t = 0; t < S; ++t) {
        std::fill(dqkv + (b * S + t) * stride + kcol, dqkv + (b * S + t) * stride + kcol + hd, T(0));
        std::fill(dqkv + (b * S + t) * stride + vcol, dqkv + (b * S + t) * stride + vcol + hd, T(0));
      }
      std::vector<T> dp(static_cast<size_t>(S));
      for (int64_t h = g * group; h < (g + 1) * group; ++h)
        for (int64_t t = 0; t < S; ++t) {
          const T* p = probs + ((b * s.heads + h) * S + t) * S;
          const T* dO = dout + (b * S + t) * ow + h * hd;
          const T* q = qkv + (b * S + t) * stride + h * hd;
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

// FP32: the same math with the per-head products through oneDNN (the plain loops above cannot be
// vectorised without reassociating their sums, which the project's no-fast-math rule forbids).
// Heads run in parallel and each GEMM inside runs on one thread (OpenMP does not nest), so the
// result is the same for any thread count. The causal half of QK^T is computed and then masked.
template <>
void attention_forward<float>(const AttentionShape& s, const float* qkv, float* out, float* probs) {
  NIBBLE_CHECK(s.kv_heads > 0 && s.heads % s.kv_heads == 0);
  const int64_t S = s.seq, hd = s.head_dim, stride = s.qkv_stride(), ow = s.out_width();
  const int64_t group = s.heads / s.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const auto gemm = s.bf16_matmuls ? &cpu::gemm_bf16 : &cpu::gemm_f32;
#pragma omp parallel for collapse(2) schedule(static) if (s.batch * s.heads * S * S * hd >= kMinParallelWork)
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const float* base = qkv + b * S * stride;
      const float* q = base + h * hd;
      const float* k = base + (s.heads + h / group) * hd;
      const float* v = base + (s.heads + s.kv_heads + h / group) * hd;
      float* p = probs + (b * s.heads + h) * S * S;
      gemm(cpu::Trans::no, cpu::Trans::yes, S, S, hd, scale, q, stride, k, stride, 0.0f, p, S);
      for (int64_t t = 0; t < S; ++t) {
        float* row = p + t * S;
        float maxv = -INFINITY;
        for (int64_t j = 0; j <= t; ++j) maxv = std::max(maxv, row[j]);
        for (int64_t j = 0; j <= t; ++j) row[j] -= maxv;
        cpu::exp_f32(row, row, t + 1);
        float sum = 0;
        for (int64_t j = 0; j <= t; ++j) sum += row[j];
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j <= t; ++j) row[j] *= inv;
        std::fill(row + t + 1, row + S, 0.0f);
      }
      gemm(cpu::Trans::no, cpu::Trans::no, S, hd, S, 1.0f, p, S, v, stride, 0.0f, out + b * S * ow + h * hd, ow);
    }
}

template <>
void attention_backward<float>(const AttentionShape& s, const float* qkv, const float* probs, const float* dout,
                               float* dqkv) {
  const int64_t S = s.seq, hd = s.head_dim, stride = s.qkv_stride(), ow = s.out_width();
  const int64_t group = s.heads / s.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const auto gemm = s.bf16_matmuls ? &cpu::gemm_bf16 : &cpu::gemm_f32;
#pragma omp parallel for collapse(2) schedule(static) if (s.batch * s.heads * S * S * hd >= kMinParallelWork)
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t g = 0; g < s.kv_heads; ++g) {
      static thread_local std::vector<float> ds;  // fully overwritten below; reused across calls
      ds.resize(static_cast<size_t>(S * S));
      const float* base = qkv + b * S * stride;
      float* dbase = dqkv + b * S * stride;
      const int64_t kcol = (s.heads + g) * hd, vcol = (s.heads + s.kv_heads + g) * hd;
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const float* p = probs + (b * s.heads + h) * S * S;
        const float* dO = dout + b * S * ow + h * hd;
        const float beta = h == g * group ? 0.0f : 1.0f;  // dK, dV: the group's first head overwrites
        // dP = dO V^T, then dS = P * (dP - rowsum(P * dP)) * scale (zero above the diagonal, where P is).
        gemm(cpu::Trans::no, cpu::Trans::yes, S, S, hd, 1.0f, dO, ow, base + vcol, stride, 0.0f, ds.data(), S);
        for (int64_t t = 0; t < S; ++t) {
          float* row = ds.data() + t * S;
          const float* prow = p + t * S;
          float pdp = 0;
          for (int64_t j = 0; j <= t; ++j) pdp += prow[j] * row[j];
          for (int64_t j = 0; j <= t; ++j) row[j] = prow[j] * (row[j] - pdp) * scale;
          std::fill(row + t + 1, row + S, 0.0f);
        }
        gemm(cpu::Trans::no, cpu::Trans::no, S, hd, S, 1.0f, ds.data(), S, base + kcol, stride, 0.0f,
                      dbase + h * hd, stride);
        gemm(cpu::Trans::yes, cpu::Trans::no, S, hd, S, 1.0f, ds.data(), S, base + h * hd, stride, beta,
                      dbase + kcol, stride);
        gemm(cpu::Trans::yes, cpu::Trans::no, S, hd, S, 1.0f, p, S, dO, ow, beta, dbase + vcol, stride);
      }
    }
}

template void attention_forward<double>(const AttentionShape&, const double*, double*, double*);
template void attention_backward<double>(const AttentionShape&, const double*, const double*, const double*, double*);

}  // namespace nibble::model
