// Every high-precision layer's backward against central finite differences in double precision:
// the layers are templated on the scalar type, so the check is not limited by FP32 rounding.
// Each test probes L = sum(out * R) for a fixed random R, so dL/dout = R.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "kernels/cpu/common/cpu_features.h"
#include "kernels/cpu/layers/vector_math.h"
#include "kernels/cpu/layers/attention_ref.h"
#include "kernels/cpu/layers/cross_entropy.h"
#include "kernels/cpu/layers/embedding.h"
#include "kernels/cpu/layers/rmsnorm.h"
#include "kernels/cpu/layers/rope.h"
#include "kernels/cpu/layers/swiglu.h"
#include "kernels/cpu/quantize/quantize.h"
#include "support/random.h"

using namespace nibble::cpu;
// The plain loops (double: the finite-difference reference) next to the fused FP32 kernels.
using nibble::ref::attention_backward;
using nibble::ref::attention_forward;

namespace {

using nibble_test::normal_doubles;
using nibble_test::normal_floats;

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences of loss() with respect to every element of x, against `analytic`.
// Truncation error is O(h^2 |f'''|) ~ 1e-10 and rounding error O(eps |L| / h) ~ 1e-10 for h = 1e-5
// and O(1) values, so 1e-7 (relative to max(1, |g|)) separates a correct gradient from a wrong one.
void expect_gradient(std::vector<double>& x, const std::function<double()>& loss, const std::vector<double>& analytic,
                     const char* what) {
  ASSERT_EQ(x.size(), analytic.size());
  const double h = 1e-5;
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double up = loss();
    x[i] = saved - h;
    const double down = loss();
    x[i] = saved;
    const double numeric = (up - down) / (2 * h);
    ASSERT_NEAR(analytic[i], numeric, 1e-7 * std::max(1.0, std::fabs(numeric))) << what << " element " << i;
  }
}

}  // namespace

TEST(ModelLayers, EmbeddingBackwardMatchesFiniteDifferences) {
  const int64_t vocab = 7, width = 5, n = 9;
  std::vector<int32_t> tokens = {0, 3, 3, 6, 1, 0, 2, 3, 5};
  auto table = normal_doubles(vocab * width, 1);
  auto r = normal_doubles(n * width, 2);
  std::vector<double> out(n * width);
  auto loss = [&] {
    embedding_forward(tokens.data(), n, table.data(), width, out.data());
    return dot(out, r);
  };
  std::vector<double> dtable(vocab * width, 0.0);
  embedding_backward(tokens.data(), n, r.data(), width, dtable.data());
  expect_gradient(table, loss, dtable, "dtable");
}

TEST(ModelLayers, RmsNormBackwardMatchesFiniteDifferences) {
  const int64_t n = 4, width = 12;
  auto x = normal_doubles(n * width, 3), gain = normal_doubles(width, 4, 0.5);
  for (auto& g : gain) g += 1.0;
  auto r = normal_doubles(n * width, 5);
  std::vector<double> y(n * width), rstd(n);
  auto loss = [&] {
    rmsnorm_forward(x.data(), gain.data(), n, width, 1e-5, y.data(), rstd.data());
    return dot(y, r);
  };
  loss();
  std::vector<double> dx(n * width, 0.0), dgain(width, 0.0);
  rmsnorm_backward(x.data(), gain.data(), rstd.data(), r.data(), n, width, dx.data(), dgain.data());
  expect_gradient(x, loss, dx, "dx");
  expect_gradient(gain, loss, dgain, "dgain");
}

TEST(ModelLayers, RmsNormBackwardAccumulatesIntoDx) {
  const int64_t n = 2, width = 8;
  auto x = normal_doubles(n * width, 6), gain = std::vector<double>(width, 1.0), dy = normal_doubles(n * width, 7);
  std::vector<double> y(n * width), rstd(n), dx0(n * width, 0.0), dx1(n * width, 3.0), dg(width, 0.0);
  rmsnorm_forward(x.data(), gain.data(), n, width, 1e-5, y.data(), rstd.data());
  rmsnorm_backward(x.data(), gain.data(), rstd.data(), dy.data(), n, width, dx0.data(), dg.data());
  rmsnorm_backward(x.data(), gain.data(), rstd.data(), dy.data(), n, width, dx1.data(), dg.data());
  for (size_t i = 0; i < dx0.size(); ++i) EXPECT_DOUBLE_EQ(dx1[i], dx0[i] + 3.0);
}

TEST(ModelLayers, RopeBackwardMatchesFiniteDifferencesAndPreservesNorms) {
  const int64_t batch = 2, seq = 5, heads = 3, hd = 8, stride = heads * hd + 4, first = 2;
  RopeTable<double> table(seq, hd, 10000.0);
  auto x0 = normal_doubles(batch * seq * stride, 8);
  auto r = normal_doubles(batch * seq * stride, 9);
  std::vector<double> x = x0, y;
  auto loss = [&] {
    y = x;
    rope_forward(y.data(), batch * seq, seq, stride, first, heads, table);
    return dot(y, r);
  };
  std::vector<double> dx = r;
  rope_backward(dx.data(), batch * seq, seq, stride, first, heads, table);
  expect_gradient(x, loss, dx, "dx");
  // A rotation: every token's norm is unchanged, and position 0 is the identity.
  loss();
  for (int64_t n = 0; n < batch * seq; ++n) {
    double a = 0, b = 0;
    for (int64_t c = 0; c < stride; ++c) {
      a += x[n * stride + c] * x[n * stride + c];
      b += y[n * stride + c] * y[n * stride + c];
    }
    EXPECT_NEAR(a, b, 1e-12 * a);
    if (n % seq == 0) {
      for (int64_t c = 0; c < stride; ++c) EXPECT_EQ(x[n * stride + c], y[n * stride + c]);
    }
  }
}

class AttentionGradient : public ::testing::TestWithParam<int64_t> {};

TEST_P(AttentionGradient, BackwardMatchesFiniteDifferences) {
  const AttentionShape s{2, 5, 4, GetParam(), 6};
  auto qkv = normal_doubles(s.batch * s.seq * s.qkv_stride(), 10);
  auto r = normal_doubles(s.batch * s.seq * s.out_width(), 11);
  std::vector<double> out(s.batch * s.seq * s.out_width()), stats(s.softmax_stats_size());
  auto loss = [&] {
    attention_forward(s, qkv.data(), out.data(), stats.data());
    return dot(out, r);
  };
  loss();
  std::vector<double> dqkv(qkv.size(), -7.0);  // garbage: backward must overwrite
  attention_backward(s, qkv.data(), stats.data(), r.data(), dqkv.data());
  expect_gradient(qkv, loss, dqkv, "dqkv");
}

INSTANTIATE_TEST_SUITE_P(HeadsAndGroupedQueryHeads, AttentionGradient, ::testing::Values(4, 2, 1));

TEST(ModelLayers, AttentionIsCausal) {
  const AttentionShape s{1, 6, 2, 2, 4};
  auto qkv = normal_doubles(s.seq * s.qkv_stride(), 12);
  std::vector<double> out(s.seq * s.out_width()), out2(out.size()), stats(s.softmax_stats_size());
  std::vector<float> qkv_f(qkv.begin(), qkv.end()), out_f(out.size()), out2_f(out.size()), stats_f(stats.size());
  attention_forward(s, qkv.data(), out.data(), stats.data());
  attention_forward(s, qkv_f.data(), out_f.data(), stats_f.data());
  // Changing the last token's q, k, v must leave every earlier output unchanged, in the reference and
  // in the fused kernel (whose diagonal block multiplies the later keys' values by exact zeros).
  for (int64_t c = 0; c < s.qkv_stride(); ++c) qkv[(s.seq - 1) * s.qkv_stride() + c] += 1.0;
  for (int64_t c = 0; c < s.qkv_stride(); ++c) qkv_f[(s.seq - 1) * s.qkv_stride() + c] += 1.0f;
  attention_forward(s, qkv.data(), out2.data(), stats.data());
  attention_forward(s, qkv_f.data(), out2_f.data(), stats_f.data());
  for (int64_t i = 0; i < (s.seq - 1) * s.out_width(); ++i) EXPECT_EQ(out[i], out2[i]);
  for (int64_t i = 0; i < (s.seq - 1) * s.out_width(); ++i) EXPECT_EQ(out_f[i], out2_f[i]);
  // The first row attends only to itself: its output is its own value vector, max its own score.
  for (int64_t h = 0; h < s.heads; ++h)
    for (int64_t i = 0; i < s.head_dim; ++i)
      EXPECT_NEAR(out[h * s.head_dim + i], qkv[(s.heads + h / (s.heads / s.kv_heads)) * s.head_dim + s.kv_heads * s.head_dim + i],
                  1e-15);
  for (int64_t t = 0; t < s.seq; ++t) EXPECT_GE(stats[t * 2 + 1], 1.0 / static_cast<double>(t + 1) - 1e-15);
}

TEST(ModelLayers, SwigluBackwardMatchesFiniteDifferences) {
  const int64_t n = 3, hidden = 7;
  auto gu = normal_doubles(n * 2 * hidden, 13, 2.0);
  auto r = normal_doubles(n * hidden, 14);
  std::vector<double> a(n * hidden);
  auto loss = [&] {
    swiglu_forward(gu.data(), n, hidden, a.data());
    return dot(a, r);
  };
  std::vector<double> dgu(gu.size());
  swiglu_backward(gu.data(), r.data(), n, hidden, dgu.data());
  expect_gradient(gu, loss, dgu, "dgate_up");
}

TEST(ModelLayers, CrossEntropyBackwardMatchesFiniteDifferences) {
  const int64_t n = 5, vocab = 9;
  auto logits = normal_doubles(n * vocab, 15, 3.0);
  std::vector<int32_t> targets = {0, 8, 3, 3, 5};
  std::vector<double> per_token(n);
  const double scale = 0.7;
  auto loss = [&] { return scale * cross_entropy_forward(logits.data(), targets.data(), n, vocab, per_token.data()); };
  std::vector<double> dlogits(logits.size());
  cross_entropy_backward(logits.data(), targets.data(), n, vocab, scale, dlogits.data());
  expect_gradient(logits, loss, dlogits, "dlogits");
}

// Training's pair (the forward keeping each row's max and 1 / sum, the backward taking them, in place
// as the model runs it) gives the plain calls' bits, on a GPT-2-sized row as well.
TEST(ModelLayers, CrossEntropyWithKeptRowStatsIsThePlainCallsBits) {
  for (const auto& [n, vocab] : {std::pair<int64_t, int64_t>{7, 65}, {3, 50304}}) {
    const auto logits = normal_floats(n * vocab, 19, 4.0f);
    std::vector<int32_t> targets(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) targets[i] = static_cast<int32_t>((i * 7919) % vocab);
    std::vector<float> loss(n), grad(logits.size()), kept_loss(n), stats(2 * n), kept = logits;
    const double total = cross_entropy_forward(logits.data(), targets.data(), n, vocab, loss.data());
    cross_entropy_backward(logits.data(), targets.data(), n, vocab, 0.3f, grad.data());
    EXPECT_EQ(cross_entropy_forward_keeping(logits.data(), targets.data(), n, vocab, kept_loss.data(), stats.data()), total);
    cross_entropy_backward_kept(kept.data(), targets.data(), n, vocab, 0.3f, stats.data(), kept.data());
    EXPECT_EQ(std::memcmp(kept_loss.data(), loss.data(), loss.size() * sizeof(float)), 0) << vocab;
    EXPECT_EQ(std::memcmp(kept.data(), grad.data(), grad.size() * sizeof(float)), 0) << vocab;
  }
}

TEST(ModelLayers, CrossEntropyOfUniformLogitsIsLogVocab) {
  const int64_t n = 3, vocab = 65;
  std::vector<float> logits(n * vocab, 0.25f), per_token(n);
  std::vector<int32_t> targets = {1, 2, 64};
  double total = cross_entropy_forward(logits.data(), targets.data(), n, vocab, per_token.data());
  EXPECT_NEAR(total / n, std::log(65.0), 4e-7);  // a few FP32 ulps of log(65) = 4.17
}

// Attention forward and backward on the same random inputs (seeds `seed`, `seed` + 1) in double (the
// reference loops) and in float (the GEMM path of shape s).
struct AttentionRuns {
  std::vector<double> qkv_d, dout_d, out_d, stats_d, dqkv_d;
  std::vector<float> out_f, stats_f, dqkv_f;
  AttentionRuns(const AttentionShape& s, uint32_t seed)
      : qkv_d(normal_doubles(s.batch * s.seq * s.qkv_stride(), seed)),
        dout_d(normal_doubles(s.batch * s.seq * s.out_width(), seed + 1)),
        out_d(dout_d.size()), stats_d(s.softmax_stats_size()), dqkv_d(qkv_d.size()),
        out_f(out_d.size()), stats_f(stats_d.size()), dqkv_f(qkv_d.size(), 5.0f) {
    const std::vector<float> qkv_f(qkv_d.begin(), qkv_d.end()), dout_f(dout_d.begin(), dout_d.end());
    attention_forward(s, qkv_d.data(), out_d.data(), stats_d.data());
    attention_forward(s, qkv_f.data(), out_f.data(), stats_f.data());
    attention_backward(s, qkv_d.data(), stats_d.data(), dout_d.data(), dqkv_d.data());
    attention_backward(s, qkv_f.data(), stats_f.data(), dout_f.data(), dqkv_f.data());
  }
};

TEST(ModelLayers, FloatAttentionAgreesWithTheDoubleReference) {
  // The FP32 attention is the fused kernel (blocks of 16 query rows, so 24 rows make a full and a
  // partial block), the double one the plain loops that the finite-difference tests check: forward
  // and backward must agree within FP32 rounding.
  for (int64_t kv_heads : {4, 2}) {
    const AttentionShape s{2, 24, 4, kv_heads, 8};
    const AttentionRuns runs(s, 16);
    const auto& [qkv_d, dout_d, out_d, stats_d, dqkv_d, out_f, stats_f, dqkv_f] = runs;
    // Sums of up to seq * head_dim terms of O(1) values: a few hundred FP32 ulps.
    const double tol = 256 * 1.2e-7;
    for (size_t i = 0; i < stats_d.size(); i += 2) {
      ASSERT_NEAR(stats_f[i], stats_d[i], tol * (1 + std::fabs(stats_d[i])));  // the row's max score
      ASSERT_NEAR(stats_f[i + 1], stats_d[i + 1], 2 * tol * stats_d[i + 1]);    // 1 / sum of exp
    }
    for (size_t i = 0; i < out_d.size(); ++i) ASSERT_NEAR(out_f[i], out_d[i], tol * (1 + std::fabs(out_d[i])));
    for (size_t i = 0; i < dqkv_d.size(); ++i) ASSERT_NEAR(dqkv_f[i], dqkv_d[i], 4 * tol * (1 + std::fabs(dqkv_d[i])));
  }
}

TEST(ModelLayers, Bf16AttentionAgreesWithTheDoubleReferenceWithinBf16Rounding) {
  // bf16_matmuls rounds each product's operands to BF16 (8 significant bits: unit roundoff u = 2^-8
  // for RN, so a product of two rounded values errs by < 2u + u^2 =: u2 relative) and accumulates in
  // FP32. Scores then err by at most u2 * scale * sum_i |q_i k_i| =: e, so a softmax row by a factor
  // within exp(+-2e) and its output by about 2e * max|v| + u2 * max|v| more for rounding P and V. The backward products chain the same bounds once more; the checks use those bounds.
  const AttentionShape s{2, 24, 4, 2, 8, /*bf16_matmuls=*/true};
  const AttentionRuns runs(s, 26);
  const auto& [qkv_d, dout_d, out_d, stats_d, dqkv_d, out_f, stats_f, dqkv_f] = runs;
  double max_qkv = 0, max_dout = 0;
  for (double v : qkv_d) max_qkv = std::max(max_qkv, std::fabs(v));
  for (double v : dout_d) max_dout = std::max(max_dout, std::fabs(v));
  const double u2 = std::ldexp(1.0, -7) + std::ldexp(1.0, -16), scale = 1.0 / std::sqrt(8.0);
  const int64_t S = s.seq, hd = s.head_dim, stride = s.qkv_stride(), group = s.heads / s.kv_heads;
  bool any_differs_from_fp32 = false;
  double e_max = 0;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t t = 0; t < S; ++t) {
        // e_t: the bound on this row's score errors, from the actual |q_i k_i|.
        double e_t = 0, max_v = 0;
        const double* q = qkv_d.data() + (b * S + t) * stride + h * hd;
        for (int64_t j = 0; j <= t; ++j) {
          const double* k = qkv_d.data() + (b * S + j) * stride + (s.heads + h / group) * hd;
          const double* v = qkv_d.data() + (b * S + j) * stride + (s.heads + s.kv_heads + h / group) * hd;
          double sum = 0;
          for (int64_t i = 0; i < hd; ++i) sum += std::fabs(q[i] * k[i]), max_v = std::max(max_v, std::fabs(v[i]));
          e_t = std::max(e_t, u2 * scale * sum);
        }
        e_max = std::max(e_max, e_t);
        const double rel = std::expm1(2 * e_t);
        // The row's max score errs by at most e_t; each exp(score - max) by a factor within
        // exp(+-2 e_t), and so 1 / their sum.
        const size_t si = static_cast<size_t>(((b * s.heads + h) * S + t) * 2);
        ASSERT_NEAR(stats_f[si], stats_d[si], e_t + 1e-6);
        ASSERT_NEAR(stats_f[si + 1], stats_d[si + 1], rel * stats_d[si + 1] + 1e-7);
        for (int64_t i = 0; i < hd; ++i) {
          const size_t oi = static_cast<size_t>((b * S + t) * s.out_width() + h * hd + i);
          ASSERT_NEAR(out_f[oi], out_d[oi], (2 * rel + 2 * u2) * max_v + 1e-6);
          any_differs_from_fp32 |= std::fabs(out_f[oi] - out_d[oi]) > 1e-5;
        }
      }
  // Backward: dP = dO V^T, dS = P (dP - rowsum(P dP)) scale, dQ = dS K, dK = dS^T Q, dV = P^T dO. Each
  // factor carries the forward's relative error (probabilities) or a BF16 operand rounding; summed over at
  // most seq terms of magnitude <= max|dout| * max|qkv|^2 * scale (dQ/dK) or max|dout| (dV).
  const double rel = std::expm1(2 * e_max) + 4 * u2;
  const double grad_tol = 2 * rel * S * max_dout * std::max(1.0, max_qkv * max_qkv * max_qkv * scale);
  for (size_t i = 0; i < dqkv_d.size(); ++i) ASSERT_NEAR(dqkv_f[i], dqkv_d[i], grad_tol);
  EXPECT_TRUE(any_differs_from_fp32) << "bf16_matmuls had no effect: the products ran in FP32";
}

TEST(ModelLayers, VectorExpIsWithinTwoUlpsOnEveryIsa) {
  // nibble::cpu::exp_f32 is glibc's vector expf on AVX-512/AVX2 (documented within 1 ulp) and std::exp
  // otherwise; compare with the exact value (double) on every variant this machine runs, with tails.
  std::mt19937 rng(31);
  std::uniform_real_distribution<float> dist(-87.0f, 88.0f);
  std::vector<float> x(1000);
  for (auto& v : x) v = dist(rng);
  x[0] = 0.0f, x[1] = -104.0f, x[2] = 89.0f, x[3] = -0.0f, x[4] = 1e-8f;
  for (nibble::cpu::Isa isa : {nibble::cpu::Isa::scalar, nibble::cpu::Isa::avx2, nibble::cpu::Isa::avx512}) {
    if (isa > nibble::cpu::detected_isa()) continue;
    nibble::cpu::set_isa_limit(isa);
    for (int64_t n : {int64_t{1000}, int64_t{37}, int64_t{5}}) {
      std::vector<float> out(static_cast<size_t>(n), -1.0f);
      nibble::cpu::exp_f32(x.data(), out.data(), n);
      // exp_neg_f32 is exp_f32 of the negated values, bit for bit.
      std::vector<float> negated(x.begin(), x.begin() + n), of_negated(static_cast<size_t>(n)), neg(static_cast<size_t>(n), -1.0f);
      for (float& v : negated) v = -v;
      nibble::cpu::exp_f32(negated.data(), of_negated.data(), n);
      nibble::cpu::exp_neg_f32(x.data(), neg.data(), n);
      EXPECT_EQ(0, std::memcmp(neg.data(), of_negated.data(), static_cast<size_t>(n) * sizeof(float)))
          << nibble::cpu::to_string(isa) << " n=" << n;
      for (int64_t i = 0; i < n; ++i) {
        const double want = std::exp(static_cast<double>(x[i]));
        if (want > 3.4028234663852886e38) {
          EXPECT_TRUE(std::isinf(out[i])) << nibble::cpu::to_string(isa) << " exp(" << x[i] << ")";
          continue;
        }
        const double ulp = std::max(std::ldexp(1.0, -149), std::ldexp(1.0, std::ilogb(want) - 23));
        EXPECT_LE(std::fabs(out[i] - want), 3 * ulp) << nibble::cpu::to_string(isa) << " exp(" << x[i] << ") = " << out[i];
      }
    }
  }
  nibble::cpu::set_isa_limit(nibble::cpu::detected_isa());
}

TEST(ModelLayers, FloatSwigluAgreesWithTheDoubleReference) {
  const int64_t n = 5, hidden = 37;  // a vector tail in every row
  auto gu_d = normal_doubles(n * 2 * hidden, 41, 3.0);
  auto da_d = normal_doubles(n * hidden, 42);
  std::vector<float> gu_f(gu_d.begin(), gu_d.end()), da_f(da_d.begin(), da_d.end());
  std::vector<double> a_d(n * hidden), dgu_d(gu_d.size());
  std::vector<float> a_f(a_d.size()), dgu_f(gu_d.size());
  swiglu_forward(gu_d.data(), n, hidden, a_d.data());
  swiglu_forward(gu_f.data(), n, hidden, a_f.data());
  swiglu_backward(gu_d.data(), da_d.data(), n, hidden, dgu_d.data());
  swiglu_backward(gu_f.data(), da_f.data(), n, hidden, dgu_f.data());
  // A handful of FP32 operations on O(1..10) values, exp within 3 ulps: 16 ulps of the magnitude.
  const double u = std::ldexp(1.0, -24);
  for (size_t i = 0; i < a_d.size(); ++i) ASSERT_NEAR(a_f[i], a_d[i], 16 * u * (1 + std::fabs(a_d[i])));
  for (size_t i = 0; i < dgu_d.size(); ++i) ASSERT_NEAR(dgu_f[i], dgu_d[i], 16 * u * (1 + std::fabs(dgu_d[i])) * 4);
}

// RMSNorm and SwiGLU (forward and backward) and RoPE's backward with the next quantization's amax
// gathered in their epilogue: their outputs are
// the plain ops' bits (RMSNorm backward's dx added to a gradient already there, as the residual
// stream's is, and its gain gradient), and the gathered amaxes (with and without the RHT) those of one gather over
// the whole output, on every ISA the quantize kernels dispatch to and with 1, 2 and 3 threads (the
// stripes then fall to threads in any order). Shapes large enough to thread.
TEST(ModelLayers, GatheringProducersAgreeWithThePlainOpsAndOneGather) {
  const int64_t n = 272, width = 400, hidden = 208;
  auto xd = normal_doubles(n * width, 51, 2.0), gd = normal_doubles(width, 52), gud = normal_doubles(n * 2 * hidden, 53, 3.0);
  const std::vector<float> x(xd.begin(), xd.end()), gain(gd.begin(), gd.end()), gate_up(gud.begin(), gud.end());
  const auto dad = normal_doubles(n * hidden, 54);
  const std::vector<float> da(dad.begin(), dad.end());
  std::vector<float> y(n * width), rstd(n), a(n * hidden), dgu(n * 2 * hidden);
  const auto dyd = normal_doubles(n * width, 55), dx0d = normal_doubles(n * width, 56, 4.0);
  const std::vector<float> dy(dyd.begin(), dyd.end()), dx0(dx0d.begin(), dx0d.end());
  std::vector<float> dx, dgain;
  // A qkv gradient [n, 3 * 64 * 3] (3 query, 3 key, 3 value heads of 64; stride 576), its query and key
  // heads rotated back over sequences of 136 tokens.
  const int64_t hd = 64, heads = 3, stride = 3 * heads * hd, seq = 136;
  const RopeTable<float> rope(seq, hd, 10000.0);
  const auto dqkvd = normal_doubles(n * stride, 57);
  const std::vector<float> dqkv0(dqkvd.begin(), dqkvd.end());
  std::vector<float> dqkv;
  auto whole = [](const std::vector<float>& t, int64_t rows, int64_t cols, bool rht) {
    nibble::SourceAmax s;
    s.rht = rht;
    gather_source_amax(t.data(), cols, 0, rows, s);
    return s;
  };
  auto same = [](const nibble::SourceAmax& want, const nibble::SourceAmax& got) {
    return got.valid && want.max_abs_bits == got.max_abs_bits && want.transposed_rht_amax == got.transposed_rht_amax;
  };
  const int default_threads = omp_get_max_threads();
  const Isa default_isa = active_isa();
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
    if (isa > detected_isa()) continue;
    set_isa_limit(isa);
    // The plain ops on this level (SwiGLU's vector exp is chosen by it).
    rmsnorm_forward(x.data(), gain.data(), n, width, 1e-5f, y.data(), rstd.data());
    swiglu_forward(gate_up.data(), n, hidden, a.data());
    swiglu_backward(gate_up.data(), da.data(), n, hidden, dgu.data());
    dx = dx0, dgain.assign(width, 0.5f);
    rmsnorm_backward(x.data(), gain.data(), rstd.data(), dy.data(), n, width, dx.data(), dgain.data());
    dqkv = dqkv0;
    rope_backward(dqkv.data(), n, seq, stride, 0, heads, rope);
    rope_backward(dqkv.data(), n, seq, stride, heads * hd, heads, rope);
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      SCOPED_TRACE(std::string(to_string(isa)) + ", " + std::to_string(threads) + " threads");
      for (bool rht : {false, true}) {
        std::vector<float> y2(y.size()), rstd2(n), a2(a.size());
        nibble::SourceAmax norm_amax, act_amax;
        norm_amax.rht = act_amax.rht = rht;
        rmsnorm_forward_gathering(x.data(), gain.data(), n, width, 1e-5f, y2.data(), rstd2.data(), norm_amax);
        swiglu_forward_gathering(gate_up.data(), n, hidden, a2.data(), act_amax);
        std::vector<float> dgu2(dgu.size());
        nibble::SourceAmax grad_amax;
        grad_amax.rht = rht;
        swiglu_backward_gathering(gate_up.data(), da.data(), n, hidden, dgu2.data(), grad_amax);
        std::vector<float> dx2 = dx0, dgain2(width, 0.5f);
        nibble::SourceAmax residual_amax;
        residual_amax.rht = rht;
        rmsnorm_backward_gathering(x.data(), gain.data(), rstd.data(), dy.data(), n, width, dx2.data(), dgain2.data(),
                                   residual_amax);
        std::vector<float> dqkv2 = dqkv0;
        nibble::SourceAmax qkv_amax;
        qkv_amax.rht = rht;
        rope_backward_gathering(dqkv2.data(), n, seq, stride, 0, heads, heads * hd, heads, rope, qkv_amax);
        ASSERT_EQ(dqkv, dqkv2);
        EXPECT_TRUE(same(whole(dqkv, n, stride, rht), qkv_amax));
        ASSERT_EQ(dx, dx2);
        ASSERT_EQ(dgain, dgain2);
        EXPECT_TRUE(same(whole(dx, n, width, rht), residual_amax));
        ASSERT_EQ(y, y2);
        ASSERT_EQ(rstd, rstd2);
        ASSERT_EQ(a, a2);
        ASSERT_EQ(dgu, dgu2);
        EXPECT_TRUE(same(whole(y, n, width, rht), norm_amax));
        EXPECT_TRUE(same(whole(a, n, hidden, rht), act_amax));
        EXPECT_TRUE(same(whole(dgu, n, 2 * hidden, rht), grad_amax));
        EXPECT_GT(norm_amax.max_abs_bits, 0u);
        if (rht) EXPECT_GT(norm_amax.transposed_rht_amax, 0.0f);
      }
    }
  }
  set_isa_limit(default_isa);
  omp_set_num_threads(default_threads);
}
