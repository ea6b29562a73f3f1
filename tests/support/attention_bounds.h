// Bounds of the tiled tensor-core attention (kernels/cuda/flash_attention.cuh) against the CPU
// attention with BF16 products, per output element, derived below: used under the CUDA model
// (test_cuda_model_flash, FP32 sums rounded to nearest: kU = 2^-24) and on a GPU (test_cuda_backend:
// the tensor cores' accumulation is not documented; measured behaviour (Fasi et al., "Numerical
// behavior of NVIDIA tensor cores", 2021) truncates, whose error per addition is below 2^-23, so
// kU = 2^-23 there, which also covers the device expf's 2 ulps).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "format/attention_shape.h"
#include "kernels/cuda/device_math.h"

namespace nibble_test {

using nibble::AttentionShape;
namespace dm = nibble::cuda::dm;

// Bounds of the tiled attention against the CPU's (same operands rounded to BF16, FP32 sums; the
// CPU rounds P = exp(s - max) / sum to BF16 after normalising, the GPU rounds exp(s - running max)
// before). Per row t of a head, keys j <= t, with x^ = bf16(x), p the exact softmax of the exact
// scores s = scale q^.k^, first-order terms (the product of two is below 2^-5 of either: the factor
// 1 + 2^-4 covers them):
//  - a score, in FP32 on either side (its own order of hd products, then the scale):
//    |ds| <= Es = max over (t, j) of 2 (gamma(hd) scale sum |q^ k^| + u |s|);
//  - P relative, FP32 effects only: the scores move p by exp(2 Es) - 1, each side's sum of S terms
//    gamma(S), exp/sub/mul/div and the per-tile rescale (exp, mul) a few u each:
//    Ep = 2 Es + 2 gamma(S) + (8 tiles + 16) u;
//  - O = sum_j bf16(p) v^: two BF16 roundings of p (one per side), Ep, each side's sum gamma(S):
//    |dO_i| <= (1 + 2^-4) (2 ub + Ep + 2 gamma(S)) sum_j p_j |v^_ji|;
//  - stats: the maximum within Es; 1/sum relative (1 + 2^-4) Ep + 2u.
// Backward, both sides given the CPU's stats, D = rowsum(P dP) on the CPU and rowsum(dO^ O) on the GPU
// (= sum_j bf16(p_j) dP_j in exact arithmetic):
//  - P relative: Epb = (1 + 2^-4) Es + 8 u (same max and 1/sum, scores within Es);
//  - dP = dO^.v^: |ddP| <= 2 gamma(hd) M_tj, M_tj = sum_i |dO^_ti v^_ji|;
//  - D: |dD| <= (ub + Ep + Epb + gamma(S)) PD_t + (2 gamma(S) + 5 gamma(hd)) MD_t, PD_t = sum_j p_j |dP_tj|,
//    MD_t = sum_j p_j M_tj (the GPU's O carries bf16(p), its FP32 sums, and the sum over i);
//  - dS = p (dP - D) scale, then BF16 on each side (|bf16(x) - bf16(y)| <= |x - y| + ub (|x| + |y|)):
//    |d dS| <= E_tj = (1 + 2^-4) scale p_tj ((Epb + 3u + 2 ub) |dP_tj - D_t| + 2 gamma(hd) M_tj + |dD|);
//  - dQ_ti = sum_j dS^ k^: sum_j (E_tj + (1 + 2^-4) 2 gamma(S) |dS_tj|) |k^_ji|;
//    dK_ji = sum over the group's heads and t >= j of dS^ q^: likewise with gamma(group S) and |q^_ti|;
//    dV_ji = sum bf16(p) dO^: ((1 + 2^-4)(2 ub + Epb) + 2 gamma(group S)) sum p |dO^|.
struct AttentionBounds {
  std::vector<double> out, dqkv;
  double max_error = 0, inverse_relative = 0;
};

inline AttentionBounds attention_bounds(const AttentionShape& a, const std::vector<float>& qkv,
                                        const std::vector<float>& dout, double kU) {
  constexpr double kUb = 0x1p-8;  // BF16 unit roundoff (8 significant bits, round to nearest even)
  const auto gamma = [kU](double n) { return n * kU / (1 - n * kU); };  // n+1 terms summed, any order
  const int64_t S = a.seq, hd = a.head_dim, stride = a.qkv_stride(), ow = a.out_width(), group = a.group();
  const double scale = 1.0 / std::sqrt(static_cast<float>(hd)), tiles = static_cast<double>((S + 63) / 64);
  const double second = 1 + 0x1p-4;
  const auto bf = [](float x) { return static_cast<double>(dm::round_to_bf16(x)); };
  // Pass 1: the score error Es over every pair.
  double es = 0;
  for (int64_t b = 0; b < a.batch; ++b)
    for (int64_t h = 0; h < a.heads; ++h)
      for (int64_t t = 0; t < S; ++t)
        for (int64_t j = 0; j <= t; ++j) {
          double dot = 0, mag = 0;
          for (int64_t i = 0; i < hd; ++i) {
            const double x = bf(qkv[(b * S + t) * stride + h * hd + i]) *
                             bf(qkv[(b * S + j) * stride + (a.heads + h / group) * hd + i]);
            dot += x, mag += std::fabs(x);
          }
          es = std::max(es, 2 * (gamma(hd) * scale * mag + kU * std::fabs(dot * scale)));
        }
  const double ep = 2 * es + 2 * gamma(S) + (8 * tiles + 16) * kU, epb = second * es + 8 * kU;
  AttentionBounds r;
  r.max_error = es;
  r.inverse_relative = second * ep + 2 * kU;
  r.out.assign(dout.size(), 0.0);
  r.dqkv.assign(qkv.size(), 0.0);
  for (int64_t b = 0; b < a.batch; ++b)
    for (int64_t h = 0; h < a.heads; ++h)
      for (int64_t t = 0; t < S; ++t) {
        const int64_t kc = (a.heads + h / group) * hd, vc = (a.heads + a.kv_heads + h / group) * hd;
        const auto q = [&](int64_t i) { return bf(qkv[(b * S + t) * stride + h * hd + i]); };
        const auto k = [&](int64_t j, int64_t i) { return bf(qkv[(b * S + j) * stride + kc + i]); };
        const auto v = [&](int64_t j, int64_t i) { return bf(qkv[(b * S + j) * stride + vc + i]); };
        const auto g = [&](int64_t i) { return bf(dout[(b * S + t) * ow + h * hd + i]); };
        std::vector<double> p(t + 1), dp(t + 1, 0.0), m(t + 1, 0.0);
        double top = -INFINITY, sum = 0, d = 0, md = 0, pd = 0;
        for (int64_t j = 0; j <= t; ++j) {
          double dot = 0;
          for (int64_t i = 0; i < hd; ++i) dot += q(i) * k(j, i), dp[j] += g(i) * v(j, i), m[j] += std::fabs(g(i) * v(j, i));
          p[j] = dot * scale;
          top = std::max(top, p[j]);
        }
        for (int64_t j = 0; j <= t; ++j) sum += (p[j] = std::exp(p[j] - top));
        for (int64_t j = 0; j <= t; ++j) p[j] /= sum, d += p[j] * dp[j], md += p[j] * m[j], pd += p[j] * std::fabs(dp[j]);
        const double dd = (kUb + ep + epb + gamma(S)) * pd + (2 * gamma(S) + 5 * gamma(hd)) * md;
        for (int64_t j = 0; j <= t; ++j) {
          const double ds = scale * p[j] * std::fabs(dp[j] - d);
          const double e = second * scale * p[j] * ((epb + 3 * kU + 2 * kUb) * std::fabs(dp[j] - d) + 2 * gamma(hd) * m[j] + dd);
          for (int64_t i = 0; i < hd; ++i) {
            r.out[(b * S + t) * ow + h * hd + i] += second * (2 * kUb + ep + 2 * gamma(S)) * p[j] * std::fabs(v(j, i));
            r.dqkv[(b * S + t) * stride + h * hd + i] += (e + second * 2 * gamma(S) * ds) * std::fabs(k(j, i));
            r.dqkv[(b * S + j) * stride + kc + i] += (e + second * 2 * gamma(group * S) * ds) * std::fabs(q(i));
            r.dqkv[(b * S + j) * stride + vc + i] +=
                (second * (2 * kUb + epb) + 2 * gamma(group * S)) * p[j] * std::fabs(g(i));
          }
        }
      }
  return r;
}

}  // namespace nibble_test
