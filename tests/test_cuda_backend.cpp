// The CUDA backend of the seam (ops/cuda_backend.cpp) against the CPU backend.
//  * Host twins (run everywhere, CI included): the per-row arithmetic the CUDA layer kernels run
//    (kernels/cuda/layer_math.h, compiled here by g++) gives the CPU kernels' bits for RMSNorm, RoPE,
//    AdamW and the gradient norm.
//  * GPU (skipped with the reason when no GPU is usable): every op of ops::cuda() on fresh random
//    inputs against ops::cpu(): bitwise for quantization, element-wise ops, embedding, RMSNorm, RoPE,
//    AdamW and the gradient norm; within bounds derived from FP32 rounding for the GEMMs and the
//    layers with exp/log (SwiGLU, cross-entropy, attention), whose device expf is not glibc's.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "format/quantize.h"
#include "kernels/cpu/common/cpu_features.h"
#include "kernels/cpu/layers/adamw.h"
#include "kernels/cpu/layers/attention.h"
#include "kernels/cpu/layers/attention_ref.h"
#include "kernels/cpu/layers/cross_entropy.h"
#include "kernels/cpu/layers/rmsnorm.h"
#include "kernels/cpu/layers/rope.h"
#include "kernels/cpu/layers/swiglu.h"
#include "kernels/cuda/layer_math.h"
#include "ops/backend.h"
#include "support/attention_bounds.h"
#include "support/check.h"
#include "support/random.h"
#if defined(NIBBLE_HAVE_CUDA)
#include "kernels/cuda/cuda_error.h"
#include "ops/host_quantized.h"
#endif

using namespace nibble;
namespace lm = nibble::cuda::lm;

namespace {

using nibble_test::normal_floats;
using nibble_test::same_bits;

// ------------------------------------------------------------------ host twins ----------------------

TEST(CudaLayerMath, RmsnormRowsAreTheCpuKernelsBits) {
  for (const auto [n, width] : {std::pair<int64_t, int64_t>{9, 16}, {9, 37}, {9, 384}, {600, 40}}) {  // 600: three gain tiles
    const auto x = normal_floats(n * width, 1), gain = normal_floats(width, 2), dy = normal_floats(n * width, 3);
    std::vector<float> y(x.size()), rstd(n), dx(x.size(), 0.5f), dgain(width, 0.25f);
    cpu::rmsnorm_forward(x.data(), gain.data(), n, width, 1e-5f, y.data(), rstd.data());
    cpu::rmsnorm_backward(x.data(), gain.data(), rstd.data(), dy.data(), n, width, dx.data(), dgain.data());
    std::vector<float> y2(x.size()), rstd2(n), dx2(x.size(), 0.5f), dgain2(width, 0.25f);
    for (int64_t i = 0; i < n; ++i) {
      rstd2[i] = lm::rmsnorm_row_forward(x.data() + i * width, gain.data(), width, 1e-5f, y2.data() + i * width);
      lm::rmsnorm_row_backward(x.data() + i * width, gain.data(), rstd2[i], dy.data() + i * width, width,
                               dx2.data() + i * width);
    }
    for (int64_t c = 0; c < width; ++c) lm::rmsnorm_gain_column(x.data(), rstd2.data(), dy.data(), n, width, c, dgain2.data());
    EXPECT_TRUE(same_bits(y, y2)) << width;
    EXPECT_TRUE(same_bits(rstd, rstd2)) << width;
    EXPECT_TRUE(same_bits(dx, dx2)) << width;
    EXPECT_TRUE(same_bits(dgain, dgain2)) << width;
  }
}

TEST(CudaLayerMath, RopeTableAndRotationAreTheCpuKernelsBits) {
  const int64_t seq = 12, heads = 3, hd = 8, stride = heads * hd + 5, tokens = 2 * seq, half = hd / 2;
  const double theta = 10000.0;
  const cpu::RopeTable<float> table(seq + 4, hd, theta);
  for (int64_t p = 0; p < seq + 4; ++p)
    for (int64_t i = 0; i < half; ++i) {
      float c, s;
      lm::rope_angle(p, i, hd, theta, &c, &s);
      ASSERT_EQ(c, table.cos[p * half + i]);
      ASSERT_EQ(s, table.sin[p * half + i]);
    }
  for (float direction : {1.0f, -1.0f}) {
    auto x = normal_floats(tokens * stride, 4), x2 = x;
    if (direction > 0)
      cpu::rope_forward(x.data(), tokens, seq, stride, 2, heads, table, 4);
    else
      cpu::rope_backward(x.data(), tokens, seq, stride, 2, heads, table, 4);
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const int64_t pos = 4 + t % seq;
          float* v = x2.data() + t * stride + 2 + h * hd;
          lm::rope_pair(v + i, v + i + half, table.cos[pos * half + i], table.sin[pos * half + i], direction);
        }
    EXPECT_TRUE(same_bits(x, x2)) << direction;
  }
}

TEST(CudaLayerMath, AdamwAndGradientNormAreTheCpuKernelsBits) {
  const int64_t n = (int64_t{1} << 15) + 77;  // two full chunks and a partial one
  const auto g = normal_floats(n, 5), w0 = normal_floats(n, 6);
  auto m = normal_floats(n, 7, 0.01f), v = normal_floats(n, 8, 0.01f);
  for (auto& x : v) x = x * x;
  std::vector<uint8_t> mask(n);
  for (int64_t i = 0; i < n; ++i) mask[i] = static_cast<uint8_t>(i % 3 == 0);
  auto m2 = m, v2 = v, w = w0, w2 = w0;
  const cpu::AdamWConstants k{0.5f, 0.9f, 0.99f, 0.19f, 0.0199f, 1e-4f, 1e-3f, 1e-8f};
  cpu::adamw_update(k, g.data(), m.data(), v.data(), w.data(), mask.data(), n);
  const lm::AdamWScalars k2{k.clip, k.b1, k.b2, k.bias1, k.bias2, k.decay, k.lr, k.eps};
  for (int64_t i = 0; i < n; ++i) lm::adamw_element(k2, g[i], &m2[i], &v2[i], &w2[i], mask[i]);
  EXPECT_TRUE(same_bits(m, m2));
  EXPECT_TRUE(same_bits(v, v2));
  EXPECT_TRUE(same_bits(w, w2));

  double total = 0;
  for (int64_t b = 0; b < n; b += lm::kSumOfSquaresChunk)
    total += lm::sum_of_squares_chunk(g.data(), b, std::min(n, b + lm::kSumOfSquaresChunk));
  EXPECT_EQ(total, cpu::sum_of_squares(g.data(), n));
}

// The CPU sums four whole chunks side by side (for the adds' latency) and the rest one at a time:
// every chunk's partial sum is still the reference's, bit for bit, at either end of a task.
TEST(CudaLayerMath, GradientNormChunksAreTheReferencesChunkByChunk) {
  for (const int64_t n : {11 * lm::kSumOfSquaresChunk + 77, 8 * lm::kSumOfSquaresChunk, int64_t{5000}}) {
    const auto g = normal_floats(n, 9, 3.0f);
    const int64_t chunks = (n + lm::kSumOfSquaresChunk - 1) / lm::kSumOfSquaresChunk;
    std::vector<double> partial(static_cast<size_t>(chunks), -1.0);
    cpu::sum_of_squares_by_chunk(g.data(), n, partial.data());
    for (int64_t c = 0; c < chunks; ++c)
      EXPECT_EQ(partial[c], lm::sum_of_squares_chunk(g.data(), c * lm::kSumOfSquaresChunk,
                                                     std::min(n, (c + 1) * lm::kSumOfSquaresChunk)))
          << "n " << n << ", chunk " << c;
  }
}

TEST(CudaLayerMath, TileTransposeIsTheReferences) {
  QuantOptions o;
  o.tile_16x16 = true;
  const int64_t rows = 48, cols = 80;
  const auto x = normal_floats(rows * cols, 9, 2.0f);
  const QuantizedTensor q = ref::quantize(x, rows, cols, o), want = ref::transpose_tiles(q);
  std::vector<uint8_t> codes(want.codes.size()), scales(want.scales.size());
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = lm::transposed_tile_code_byte(q.codes.data(), rows, cols, static_cast<int64_t>(i));
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = lm::transposed_tile_scale(q.scales.data(), rows, cols, static_cast<int64_t>(i));
  EXPECT_EQ(codes, want.codes);
  EXPECT_EQ(scales, want.scales);
}

// The attention, SwiGLU and cross-entropy the GPU runs, on the host: the same operations in the same
// order as the CPU kernels, so with the CPU's scalar exp (NIBBLE_ISA=scalar: std::exp, which the host
// twins call too) the same bits; on the GPU only expf/logf differ (the GPU tests bound that).
class CudaLayerMathScalarExp : public ::testing::Test {
 protected:
  void SetUp() override { cpu::set_isa_limit(cpu::Isa::scalar); }
  void TearDown() override { cpu::set_isa_limit(cpu::detected_isa()); }
};

TEST_F(CudaLayerMathScalarExp, AttentionRowsAreTheCpuKernelsBits) {
  for (bool bf16 : {false, true})
    for (int64_t kv_heads : {4, 2, 1}) {
      const AttentionShape s{2, 21, 4, kv_heads, 8, bf16};
      const float scale = 1.0f / std::sqrt(8.0f);
      const auto qkv = normal_floats(s.batch * s.seq * s.qkv_stride(), 61), dout = normal_floats(s.batch * s.seq * 4 * 8, 62);
      std::vector<float> out(dout.size()), stats(s.softmax_stats_size()), dqkv(qkv.size(), 9.0f);
      cpu::attention_forward(s, qkv.data(), out.data(), stats.data());
      cpu::attention_backward(s, qkv.data(), stats.data(), dout.data(), dqkv.data());
      std::vector<float> out2(out.size()), stats2(stats.size()), dqkv2(qkv.size(), 7.0f), row_dot(stats.size() / 2);
      const int64_t rows = s.batch * s.heads * s.seq, key_rows = s.batch * s.kv_heads * s.seq;
      for (int64_t r = 0; r < rows; ++r) lm::attention_forward_row(s, qkv.data(), r, scale, out2.data(), stats2.data());
      for (int64_t r = 0; r < rows; ++r)
        lm::attention_backward_query_row(s, qkv.data(), stats2.data(), dout.data(), r, scale, dqkv2.data(), row_dot.data());
      for (int64_t r = 0; r < key_rows; ++r)
        lm::attention_backward_key_row(s, qkv.data(), stats2.data(), dout.data(), row_dot.data(), r, scale, dqkv2.data());
      EXPECT_TRUE(same_bits(out2, out)) << "bf16 " << bf16 << " kv_heads " << kv_heads;
      EXPECT_TRUE(same_bits(stats2, stats)) << "bf16 " << bf16 << " kv_heads " << kv_heads;
      EXPECT_TRUE(same_bits(dqkv2, dqkv)) << "bf16 " << bf16 << " kv_heads " << kv_heads;
    }
}

TEST_F(CudaLayerMathScalarExp, DecodeSwigluAndCrossEntropyAreTheCpuKernelsBits) {
  // KV-cache decoding: 3 prompt tokens, then 2 more.
  const AttentionShape s3{1, 3, 4, 2, 8, false}, s2{1, 2, 4, 2, 8, false};
  const float scale = 1.0f / std::sqrt(8.0f);
  const int64_t capacity = 8, kv_width = 2 * 8;
  std::vector<float> kc(capacity * kv_width), vc(kc.size()), kc2(kc.size()), vc2(kc.size());
  for (const auto& [s, past, seed] : {std::tuple{s3, int64_t{0}, 71u}, std::tuple{s2, int64_t{3}, 72u}}) {
    const auto qkv = normal_floats(s.seq * s.qkv_stride(), seed);
    std::vector<float> out(s.seq * s.heads * s.head_dim), out2(out.size());
    cpu::attention_decode(s, past, qkv.data(), kc.data(), vc.data(), out.data());
    for (int64_t e = 0; e < s.seq * kv_width; ++e) lm::kv_append_element(s, past, qkv.data(), e, kc2.data(), vc2.data());
    for (int64_t e = 0; e < s.seq * s.heads; ++e)
      lm::attention_decode_head(s, past, qkv.data(), kc2.data(), vc2.data(), e, scale, out2.data());
    EXPECT_TRUE(same_bits(out2, out)) << "past " << past;
    EXPECT_TRUE(same_bits(kc2, kc) && same_bits(vc2, vc)) << "past " << past;
  }
  // SwiGLU.
  const int64_t n = 7, hidden = 40, vocab = 33;
  const auto gu = normal_floats(n * 2 * hidden, 73, 2.0f), da = normal_floats(n * hidden, 74);
  std::vector<float> a(n * hidden), a2(a.size()), dg(gu.size()), dg2(gu.size());
  cpu::swiglu_forward(gu.data(), n, hidden, a.data());
  cpu::swiglu_backward(gu.data(), da.data(), n, hidden, dg.data());
  for (int64_t e = 0; e < n * hidden; ++e) {
    a2[e] = lm::swiglu_element(gu.data(), hidden, e);
    lm::swiglu_backward_element(gu.data(), da.data(), hidden, e, dg2.data());
  }
  EXPECT_TRUE(same_bits(a2, a));
  EXPECT_TRUE(same_bits(dg2, dg));
  // Cross-entropy, backward in place as training runs it.
  const auto logits = normal_floats(n * vocab, 75, 3.0f);
  std::vector<int32_t> targets(n);
  for (int64_t i = 0; i < n; ++i) targets[i] = static_cast<int32_t>((i * 5) % vocab);
  std::vector<float> loss(n), loss2(n), grad(logits.size()), grad2 = logits;
  cpu::cross_entropy_forward(logits.data(), targets.data(), n, vocab, loss.data());
  cpu::cross_entropy_backward(logits.data(), targets.data(), n, vocab, 0.25f, grad.data());
  for (int64_t i = 0; i < n; ++i) {
    loss2[i] = lm::cross_entropy_row(logits.data() + i * vocab, targets[i], vocab);
    lm::cross_entropy_backward_row(grad2.data() + i * vocab, targets[i], vocab, 0.25f, grad2.data() + i * vocab);
  }
  EXPECT_TRUE(same_bits(loss2, loss));
  EXPECT_TRUE(same_bits(grad2, grad));
}

TEST(CudaBackend, WithoutCudaOrAGpuTheErrorNamesTheFix) {
  if (ops::cuda_built()) {
#if defined(NIBBLE_HAVE_CUDA)
    if (cuda::probe_devices().available) GTEST_SKIP() << "a GPU is usable here";
#endif
  }
  try {
    ops::cuda();
    FAIL() << "ops::cuda() succeeded without a usable GPU";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("device=cpu"), std::string::npos) << e.what();
  }
}

// ------------------------------------------------------------------ GPU -----------------------------
#if defined(NIBBLE_HAVE_CUDA)

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto a = cuda::probe_devices();
    if (!a.available) GTEST_SKIP() << "skipping GPU test: " << a.reason;
  }
  ops::Backend& gpu() { return ops::cuda(); }
  ops::Backend& host() { return ops::cpu(); }
  template <typename T>
  ops::Array<T> upload(const std::vector<T>& v) {
    ops::Array<T> a(gpu());
    a.assign_from_host(v.data(), v.size());
    return a;
  }
  template <typename T>
  std::vector<T> download(const ops::Array<T>& a) {
    return a.to_host();
  }
};

void expect_same_quantized(const QuantizedTensor& a, const QuantizedTensor& b, const std::string& what) {
  EXPECT_EQ(a.rows, b.rows) << what;
  EXPECT_EQ(a.cols, b.cols) << what;
  EXPECT_EQ(a.block, b.block) << what;
  EXPECT_EQ(a.codes, b.codes) << what;
  EXPECT_EQ(a.scales, b.scales) << what;
  EXPECT_EQ(std::bit_cast<uint32_t>(a.amax), std::bit_cast<uint32_t>(b.amax)) << what;
  EXPECT_EQ(std::bit_cast<uint32_t>(a.decode_scale), std::bit_cast<uint32_t>(b.decode_scale)) << what;
}

TEST_F(CudaOps, QuantizersGiveTheCpuBytes) {
  const int64_t rows = 64, cols = 96;
  const auto x = normal_floats(rows * cols, 11, 3.0f);
  auto dx = upload(x);
  std::vector<std::pair<std::string, QuantOptions>> cases;
  QuantOptions o;
  cases.push_back({"nvfp4 1x16 RN", o});
  o.tile_16x16 = true;
  cases.push_back({"nvfp4 16x16", o});
  o = {};
  o.rounding = Rounding::stochastic, o.seed = 42, o.offset = 7;
  cases.push_back({"nvfp4 SR", o});
  o.rht = true;
  cases.push_back({"nvfp4 RHT SR", o});
  o = {};
  o.format = Format::mxfp4;
  cases.push_back({"mxfp4", o});
  o.format = Format::fp8_e4m3;
  cases.push_back({"fp8 e4m3", o});
  for (const auto& [name, opt] : cases) {
    auto g = gpu().new_quantized(), c = host().new_quantized();
    gpu().quantize(dx.data(), rows, cols, opt, *g);
    host().quantize(x.data(), rows, cols, opt, *c);
    expect_same_quantized(g->to_host(), c->to_host(), name);
    gpu().quantize_transposed(dx.data(), rows, cols, opt, *g);
    host().quantize_transposed(x.data(), rows, cols, opt, *c);
    expect_same_quantized(g->to_host(), c->to_host(), name + " transposed");
    EXPECT_EQ(g->amax(), c->amax()) << name;
    // Dequantized values.
    std::vector<float> back_c(x.size());
    host().dequantize(*c, back_c.data());
    ops::Array<float> back_g(gpu(), x.size());
    gpu().dequantize(*g, back_g.data());
    EXPECT_TRUE(same_bits(download(back_g), back_c)) << name;
  }
  // Both orientations at once (the Linear's X and dY), and the exact tile transpose (its weights).
  QuantOptions row, t;
  row.rounding = Rounding::stochastic, row.seed = 3;
  t.rounding = Rounding::stochastic, t.seed = 4, t.rht = true;
  auto gr = gpu().new_quantized(), gt = gpu().new_quantized(), cr = host().new_quantized(), ct = host().new_quantized();
  gpu().quantize_both(dx.data(), rows, cols, row, *gr, t, *gt);
  host().quantize_both(x.data(), rows, cols, row, *cr, t, *ct);
  expect_same_quantized(gr->to_host(), cr->to_host(), "both: row-wise");
  expect_same_quantized(gt->to_host(), ct->to_host(), "both: column-wise");
  QuantOptions w;
  w.tile_16x16 = true;
  gpu().quantize(dx.data(), rows, cols, w, *gr);
  host().quantize(x.data(), rows, cols, w, *cr);
  gpu().transpose_tiles(*gr, *gt);
  host().transpose_tiles(*cr, *ct);
  expect_same_quantized(gt->to_host(), ct->to_host(), "tile transpose");
  // A transposed 16x16-tiled tensor is tiled too: transposing it back gives the original bytes.
  auto back = gpu().new_quantized();
  gpu().transpose_tiles(*gt, *back);
  expect_same_quantized(back->to_host(), cr->to_host(), "tile transpose, back");
  // 1x16 blocks have no exact transpose, on either backend.
  gpu().quantize(dx.data(), rows, cols, row, *gr);
  host().quantize(x.data(), rows, cols, row, *cr);
  EXPECT_THROW(gpu().transpose_tiles(*gr, *gt), UsageError);
  EXPECT_THROW(host().transpose_tiles(*cr, *ct), UsageError);
}

// |C_gpu - C_exact| <= gamma_{K+2} sum_k |a_mk b_nk| (+ the same for the CPU), with C_exact the FP64
// product of the same (quantized or BF16-rounded) operands: FP32 summation of exact products in any
// order, plus the alpha scaling.
double gamma(int64_t k) {
  const double u = std::ldexp(1.0, -24);
  return static_cast<double>(k) * u / (1.0 - static_cast<double>(k) * u);
}

// A quantization's non-finite check waits for the step's next read (no host sync per quantization):
// the quantize calls return, the gradient norm's read (which AdamW::step makes before it writes any
// weight) throws NumericalError naming the first bad quantization and the value, once.
TEST_F(CudaOps, NonFiniteQuantizerInputThrowsAtTheNextReadBeforeTheOptimizer) {
  auto x = normal_floats(32 * 64, 12);
  x[5 * 64 + 9] = std::nanf("");
  auto dx = upload(x);
  const auto g = normal_floats(100, 13);
  auto dg = upload(g);
  auto q = gpu().new_quantized(), t = gpu().new_quantized();
  // The context is the thread's, shared with the tests before: a read first settles their checks,
  // so the count below starts at this test's first quantization.
  EXPECT_EQ(gpu().sum_of_squares(dg.data(), 100), host().sum_of_squares(g.data(), 100));
  EXPECT_NO_THROW(gpu().quantize(dx.data(), 32, 64, QuantOptions{}, *q));
  EXPECT_NO_THROW(gpu().quantize_both(dx.data(), 32, 64, QuantOptions{}, *q, QuantOptions{}, *t));
  const std::string message = nibble_test::error_of([&] { gpu().sum_of_squares(dg.data(), 100); });
  EXPECT_NE(message.find("non-finite value at index [5, 9] (flat 329) of quantization 1 of 2"), std::string::npos)
      << message;
  EXPECT_EQ(gpu().sum_of_squares(dg.data(), 100), host().sum_of_squares(g.data(), 100));  // reported once
}

TEST_F(CudaOps, GemmsAgreeWithTheCpuWithinTheFp32SummationBound) {
  const int64_t M = 48, N = 80, K = 128;
  const auto a = normal_floats(M * K, 21), b = normal_floats(N * K, 22);
  auto da = upload(a), db = upload(b);
  // Quantized (NVFP4, 1x16 x 16x16): against the FP64 product of the dequantized operands.
  QuantOptions oa, ob;
  ob.tile_16x16 = true;
  auto ga = gpu().new_quantized(), gb = gpu().new_quantized();
  gpu().quantize(da.data(), M, K, oa, *ga);
  gpu().quantize(db.data(), N, K, ob, *gb);
  ops::Array<float> dc(gpu(), M * N);
  gpu().gemm(*ga, *gb, dc.data(), N, 1.0f, ops::Output::overwrite, ops::Summation::fp32_products);
  const auto c = download(dc);
  std::vector<float> av(a.size()), bv(b.size());
  host().dequantize(ops::HostQuantized(ga->to_host()), av.data());
  host().dequantize(ops::HostQuantized(gb->to_host()), bv.data());
  auto check = [&](const std::vector<float>& got, const std::vector<float>& A, const std::vector<float>& B,
                   const std::string& what) {
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double exact = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          exact += static_cast<double>(A[m * K + k]) * B[n * K + k];
          mag += std::fabs(static_cast<double>(A[m * K + k]) * B[n * K + k]);
        }
        ASSERT_NEAR(got[m * N + n], exact, gamma(K + 2) * mag + 1e-30) << what << " at " << m << "," << n;
      }
  };
  check(c, av, bv, "nvfp4");
  EXPECT_THROW(gpu().gemm(*ga, *gb, dc.data(), N, 1.0f, ops::Output::overwrite, ops::Summation::block_exact),
               UsageError);
  // FP32 and BF16 (operands rounded to BF16 first).
  gpu().gemm_f32(ops::DenseGemmShape::a_bt(M, N, K), 1.0f, da.data(), db.data(), 0.0f, dc.data());
  check(download(dc), a, b, "fp32");
  gpu().gemm_bf16(ops::DenseGemmShape::a_bt(M, N, K), 1.0f, da.data(), db.data(), 0.0f, dc.data());
  std::vector<float> a16(a.size()), b16(b.size());
  for (size_t i = 0; i < a.size(); ++i) a16[i] = bf16_to_float(bf16_from_float_rn(a[i]));
  for (size_t i = 0; i < b.size(); ++i) b16[i] = bf16_to_float(bf16_from_float_rn(b[i]));
  check(download(dc), a16, b16, "bf16");
}

TEST_F(CudaOps, DeterministicLayersGiveTheCpuBits) {
  const int64_t n = 40, width = 96, vocab = 50;
  const auto table = normal_floats(vocab * width, 31), x = normal_floats(n * width, 32), gain = normal_floats(width, 33);
  const auto dy = normal_floats(n * width, 34);
  std::vector<int32_t> tokens(n);
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>((i * 7) % vocab);
  auto dtokens = upload(tokens);
  auto dtable = upload(table), dx = upload(x), dgain = upload(gain), ddy = upload(dy);

  // Embedding.
  std::vector<float> out(n * width), dtab(table.size(), 0.0f);
  host().embedding_forward(tokens.data(), n, table.data(), width, out.data());
  host().embedding_backward(tokens.data(), n, dy.data(), width, dtab.data());
  ops::Array<float> gout(gpu(), out.size()), gdtab(gpu());
  gdtab.resize_zeroed(table.size());
  gpu().embedding_forward(dtokens.data(), n, dtable.data(), width, gout.data());
  gpu().embedding_backward(dtokens.data(), n, ddy.data(), width, gdtab.data());
  EXPECT_TRUE(same_bits(download(gout), out));
  EXPECT_TRUE(same_bits(download(gdtab), dtab));

  // RMSNorm.
  std::vector<float> y(x.size()), rstd(n), gx(x.size(), 0.0f), gg(width, 0.0f);
  host().rmsnorm_forward({n, width}, x.data(), gain.data(), 1e-5f, y.data(), rstd.data());
  host().rmsnorm_backward({n, width}, x.data(), gain.data(), rstd.data(), dy.data(), gx.data(), gg.data());
  ops::Array<float> gy(gpu(), y.size()), grstd(gpu(), n), ggx(gpu()), ggg(gpu());
  ggx.resize_zeroed(x.size());
  ggg.resize_zeroed(width);
  gpu().rmsnorm_forward({n, width}, dx.data(), dgain.data(), 1e-5f, gy.data(), grstd.data());
  gpu().rmsnorm_backward({n, width}, dx.data(), dgain.data(), grstd.data(), ddy.data(), ggx.data(), ggg.data());
  EXPECT_TRUE(same_bits(download(gy), y));
  EXPECT_TRUE(same_bits(download(grstd), rstd));
  EXPECT_TRUE(same_bits(download(ggx), gx));
  EXPECT_TRUE(same_bits(download(ggg), gg));

  // RoPE (4 heads of 24 from column 0 of 96-wide rows; sequences of 20), forward at an offset and back.
  auto r = x;
  auto dr = upload(x);
  const ops::RopeShape rope{.tokens = n, .seq = 20, .stride = width, .first_col = 0, .heads = 4, .head_dim = 24,
                            .theta = 10000.0};
  host().rope_forward(r.data(), rope, 3);
  gpu().rope_forward(dr.data(), rope, 3);
  EXPECT_TRUE(same_bits(download(dr), r));
  host().rope_backward(r.data(), rope);
  gpu().rope_backward(dr.data(), rope);
  EXPECT_TRUE(same_bits(download(dr), r));

  // Element-wise, AdamW and the gradient norm.
  auto s = x;
  auto ds = upload(x);
  host().add(s.data(), dy.data(), n * width);
  gpu().add(ds.data(), ddy.data(), n * width);
  EXPECT_TRUE(same_bits(download(ds), s));
  std::vector<bf16> h16(x.size());
  ops::Array<bf16> g16(gpu(), x.size());
  host().round_to_bf16(x.data(), h16.data(), n * width);
  gpu().round_to_bf16(dx.data(), g16.data(), n * width);
  const auto g16h = download(g16);
  for (size_t i = 0; i < h16.size(); ++i) ASSERT_EQ(g16h[i].bits, h16[i].bits) << i;
  EXPECT_EQ(gpu().sum_of_squares(dx.data(), n * width), host().sum_of_squares(x.data(), n * width));
  std::vector<uint8_t> mask(x.size());
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = static_cast<uint8_t>(i % 2);
  auto dmask = upload(mask);
  std::vector<float> m(x.size(), 0.01f), v(x.size(), 0.001f), w = x;
  auto dm_ = upload(m), dv = upload(v), dw = upload(w);
  const ops::AdamWStep k{0.7f, 0.9f, 0.99f, 0.271f, 0.0297f, 1e-4f, 1e-3f, 1e-8f};
  host().adamw_update(k, dy.data(), m.data(), v.data(), w.data(), mask.data(), n * width);
  gpu().adamw_update(k, ddy.data(), dm_.data(), dv.data(), dw.data(), dmask.data(), n * width);
  EXPECT_TRUE(same_bits(download(dm_), m));
  EXPECT_TRUE(same_bits(download(dv), v));
  EXPECT_TRUE(same_bits(download(dw), w));
}

TEST_F(CudaOps, ExpLayersAgreeWithTheCpuWithinTheirBounds) {
  // SwiGLU and cross-entropy: expf differs from glibc's by a few ulps (CUDA documents <= 2 ulps,
  // glibc <= 1), so each output, a handful of FP32 operations on one exp, errs by <= 8 u relative
  // per side; the loss sums `vocab` exponentials: (vocab + 8) u.
  const double u = std::ldexp(1.0, -24);
  const int64_t n = 30, hidden = 64, vocab = 77;
  const auto gu = normal_floats(n * 2 * hidden, 41, 2.0f), da = normal_floats(n * hidden, 42);
  auto dgu = upload(gu), dda = upload(da);
  std::vector<float> a(n * hidden), dg(gu.size());
  host().swiglu_forward(gu.data(), n, hidden, a.data());
  host().swiglu_backward(gu.data(), da.data(), n, hidden, dg.data());
  ops::Array<float> ga(gpu(), a.size()), gdg(gpu(), dg.size());
  gpu().swiglu_forward(dgu.data(), n, hidden, ga.data());
  gpu().swiglu_backward(dgu.data(), dda.data(), n, hidden, gdg.data());
  const auto a2 = download(ga), dg2 = download(gdg);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a2[i], a[i], 16 * u * std::fabs(a[i]) + 1e-30) << i;
  // dgate = da up sig (1 + g (1 - sig)) can cancel inside the bracket: its error is then relative to
  // the terms, |da up sig g (1 - sig)| <= |da up g|, not to the result.
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < 2 * hidden; ++c) {
      const size_t i = static_cast<size_t>(r * 2 * hidden + c);
      const double g = gu[r * 2 * hidden + c % hidden], up = gu[r * 2 * hidden + hidden + c % hidden];
      const double terms = std::fabs(da[r * hidden + c % hidden] * up * g);
      ASSERT_NEAR(dg2[i], dg[i], 16 * u * (std::fabs(dg[i]) + terms) + 1e-30) << r << "," << c;
    }

  const auto logits = normal_floats(n * vocab, 43, 3.0f);
  std::vector<int32_t> targets(n);
  for (int64_t i = 0; i < n; ++i) targets[i] = static_cast<int32_t>((i * 5) % vocab);
  auto dlogits = upload(logits);
  auto dt = upload(targets);
  std::vector<float> loss(n);
  ops::Array<float> gloss(gpu(), n);
  const double total = host().cross_entropy_forward(logits.data(), targets.data(), n, vocab, loss.data());
  const double gtotal = gpu().cross_entropy_forward(dlogits.data(), dt.data(), n, vocab, gloss.data());
  const auto loss2 = download(gloss);
  for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(loss2[i], loss[i], 2 * (vocab + 8) * u * (std::fabs(loss[i]) + 3 * 3.0)) << i;
  EXPECT_NEAR(gtotal, total, 2 * (vocab + 8) * u * n * 12.0);
  std::vector<float> grad(logits.size());
  host().cross_entropy_backward(logits.data(), targets.data(), n, vocab, 0.5f, grad.data());
  gpu().cross_entropy_backward(dlogits.data(), dt.data(), n, vocab, 0.5f, dlogits.data());  // in place, as training does
  const auto grad2 = download(dlogits);
  for (size_t i = 0; i < grad.size(); ++i) ASSERT_NEAR(grad2[i], grad[i], 2 * (vocab + 8) * u * 0.5) << i;
}

TEST_F(CudaOps, AttentionAgreesWithTheDoubleReferenceAsTheCpuKernelDoes) {
  // The CPU's own bound (test_model_layers: FloatAttentionAgreesWithTheDoubleReference): sums of up to
  // seq * head_dim O(1) terms, a few hundred FP32 ulps.
  for (int64_t kv_heads : {4, 2}) {
    const AttentionShape s{2, 24, 4, kv_heads, 8, false};
    const auto qkv = normal_floats(s.batch * s.seq * s.qkv_stride(), 51), dout = normal_floats(s.batch * s.seq * s.out_width(), 52);
    const std::vector<double> qkv_d(qkv.begin(), qkv.end()), dout_d(dout.begin(), dout.end());
    std::vector<double> out_d(dout.size()), stats_d(s.softmax_stats_size()), dqkv_d(qkv.size());
    ref::attention_forward(s, qkv_d.data(), out_d.data(), stats_d.data());
    ref::attention_backward(s, qkv_d.data(), stats_d.data(), dout_d.data(), dqkv_d.data());
    auto dq = upload(qkv), ddo = upload(dout);
    ops::Array<float> out(gpu(), dout.size()), stats(gpu(), s.softmax_stats_size()), dqkv(gpu(), qkv.size());
    gpu().attention_forward(s, dq.data(), out.data(), stats.data());
    gpu().attention_backward(s, dq.data(), stats.data(), ddo.data(), dqkv.data());
    const auto out_f = download(out), stats_f = download(stats), dqkv_f = download(dqkv);
    const double tol = 256 * 1.2e-7;
    for (size_t i = 0; i < stats_d.size(); i += 2) {
      ASSERT_NEAR(stats_f[i], stats_d[i], tol * (1 + std::fabs(stats_d[i])));
      ASSERT_NEAR(stats_f[i + 1], stats_d[i + 1], 2 * tol * stats_d[i + 1]);
    }
    for (size_t i = 0; i < out_d.size(); ++i) ASSERT_NEAR(out_f[i], out_d[i], tol * (1 + std::fabs(out_d[i])));
    for (size_t i = 0; i < dqkv_d.size(); ++i) ASSERT_NEAR(dqkv_f[i], dqkv_d[i], 4 * tol * (1 + std::fabs(dqkv_d[i])));
  }
}

// The tiled tensor-core attention (BF16 products, head_dim 32/64) against the CPU's BF16 attention
// within support/attention_bounds.h's bounds, with the tensor cores' accumulation taken as
// truncating (u = 2^-23); the backward given the CPU's stats (the bounds' premise); twice, the same bits.
TEST_F(CudaOps, TiledAttentionIsWithinTheBf16BoundsOfTheCpuAndTheSameBitsTwice) {
  for (const AttentionShape s : {AttentionShape{2, 200, 4, 2, 64, true}, AttentionShape{1, 130, 3, 1, 32, true}}) {
    const auto qkv = normal_floats(s.batch * s.seq * s.qkv_stride(), 53), dout = normal_floats(s.batch * s.seq * s.out_width(), 54);
    std::vector<float> out(dout.size()), stats(s.softmax_stats_size()), dqkv(qkv.size());
    host().attention_forward(s, qkv.data(), out.data(), stats.data());
    host().attention_backward(s, qkv.data(), stats.data(), dout.data(), dqkv.data());
    const nibble_test::AttentionBounds bound = nibble_test::attention_bounds(s, qkv, dout, 0x1p-23);
    std::vector<float> first_out, first_dqkv;
    for (int run = 0; run < 2; ++run) {
      auto dq = upload(qkv), ddo = upload(dout), cpu_stats = upload(stats);
      ops::Array<float> gout(gpu(), dout.size()), gstats(gpu(), stats.size()), gdqkv(gpu(), qkv.size());
      gpu().attention_forward(s, dq.data(), gout.data(), gstats.data());
      gpu().attention_backward(s, dq.data(), cpu_stats.data(), ddo.data(), gdqkv.data());
      const auto o = download(gout), st = download(gstats), g = download(gdqkv);
      for (size_t i = 0; i < o.size(); ++i) ASSERT_LE(std::fabs(o[i] - out[i]), bound.out[i]) << "O " << i;
      for (size_t i = 0; i < st.size(); i += 2) {
        ASSERT_LE(std::fabs(st[i] - stats[i]), bound.max_error) << "row max " << i / 2;
        ASSERT_LE(std::fabs(st[i + 1] - stats[i + 1]), bound.inverse_relative * stats[i + 1]) << "row 1/sum " << i / 2;
      }
      for (size_t i = 0; i < g.size(); ++i) ASSERT_LE(std::fabs(g[i] - dqkv[i]), bound.dqkv[i]) << "dqkv " << i;
      if (run == 0) {
        first_out = o, first_dqkv = g;
      } else {
        EXPECT_TRUE(same_bits(o, first_out) && same_bits(g, first_dqkv));
      }
    }
  }
}

#endif  // NIBBLE_HAVE_CUDA

}  // namespace
