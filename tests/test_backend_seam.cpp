// The seam's memory contract, checked on the CPU: every pointer recipe/, model/ and train/ hand to a
// backend must point into memory that backend allocated (on a GPU a host pointer there is a fault or
// garbage). StrictBackend forwards every op to ops::cpu() after checking that each device pointer
// lies inside one of its own live allocations, so a std::vector leaking into a backend call fails
// here, on every machine, before any GPU sees it.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "model/kv_cache.h"
#include "model/transformer.h"
#include "recipe/recipe.h"
#include "train/distributed.h"
#include "train/optimizer.h"
#include "support/random.h"
#include "support/tiny_model.h"

using namespace nibble;

namespace {

class StrictBackend final : public ops::Backend {
 public:
  int64_t checked() const { return checked_; }
  // As the GPU's tiled attention: the backward wants the forward's output O (attention_backward_with_output).
  // Each forward's O is recorded by its qkv (one per layer) to check the backward is given that layer's.
  void take_attention_output() { takes_output_ = true; }
  int64_t outputs_given() const { return outputs_given_; }
  int64_t outputs_wrong() const { return outputs_wrong_; }

  ops::Device device() const override { return ops::Device::cpu; }
  std::string describe() const override { return "strict " + cpu_.describe(); }
  double measure_peak_f32_flops(double s) override { return cpu_.measure_peak_f32_flops(s); }

  void* allocate(size_t bytes) override {
    void* p = cpu_.allocate(bytes);
    if (p) live_[reinterpret_cast<uintptr_t>(p)] = bytes;
    return p;
  }
  void release(void* p) noexcept override {
    live_.erase(reinterpret_cast<uintptr_t>(p));
    cpu_.release(p);
  }
  void copy(const void* src, void* dst, size_t bytes) override {
    mine(src, bytes, "copy src"), mine(dst, bytes, "copy dst");
    cpu_.copy(src, dst, bytes);
  }
  void copy_to_host(const void* src, void* host, size_t bytes) override {
    mine(src, bytes, "copy_to_host src");
    cpu_.copy_to_host(src, host, bytes);
  }
  void copy_from_host(const void* host, void* dst, size_t bytes) override {
    mine(dst, bytes, "copy_from_host dst");
    cpu_.copy_from_host(host, dst, bytes);
  }
  void fill_zero(void* p, size_t bytes) override {
    mine(p, bytes, "fill_zero");
    cpu_.fill_zero(p, bytes);
  }
  void synchronize() override {}

  std::unique_ptr<ops::Quantized> new_quantized() override { return cpu_.new_quantized(); }
  void quantize(const float* x, int64_t rows, int64_t cols, const QuantOptions& o, ops::Quantized& out) override {
    mine(x, rows * cols, "quantize x");
    cpu_.quantize(x, rows, cols, o, out);
  }
  void quantize_transposed(const float* x, int64_t rows, int64_t cols, const QuantOptions& o,
                           ops::Quantized& out) override {
    mine(x, rows * cols, "quantize_transposed x");
    cpu_.quantize_transposed(x, rows, cols, o, out);
  }
  void quantize_both(const float* x, int64_t rows, int64_t cols, const QuantOptions& ro, ops::Quantized& r,
                     const QuantOptions& to, ops::Quantized& t) override {
    mine(x, rows * cols, "quantize_both x");
    cpu_.quantize_both(x, rows, cols, ro, r, to, t);
  }
  void transpose_tiles(const ops::Quantized& q, ops::Quantized& out) override { cpu_.transpose_tiles(q, out); }
  void dequantize(const ops::Quantized& q, float* out) override {
    mine(out, q.layout().rows * q.layout().cols, "dequantize out");
    cpu_.dequantize(q, out);
  }
  bool fp32_products_available(Format f) const override { return cpu_.fp32_products_available(f); }
  bool block_exact_available() const override { return true; }
  std::string describe_summation(Format f, ops::Summation s) const override { return cpu_.describe_summation(f, s); }
  void gemm(const ops::Quantized& a, const ops::Quantized& b, float* c, int64_t ldc, float alpha, ops::Output o,
            ops::Summation s) override {
    mine(c, (a.layout().rows - 1) * ldc + b.layout().rows, "gemm c");
    cpu_.gemm(a, b, c, ldc, alpha, o, s);
  }
  void gemm_f32(const ops::DenseGemmShape& s, float alpha, const float* a, const float* b, float beta,
                float* c) override {
    dense("gemm_f32", s, a, b, c);
    cpu_.gemm_f32(s, alpha, a, b, beta, c);
  }
  void gemm_bf16(const ops::DenseGemmShape& s, float alpha, const float* a, const float* b, float beta,
                 float* c) override {
    dense("gemm_bf16", s, a, b, c);
    cpu_.gemm_bf16(s, alpha, a, b, beta, c);
  }
  void add(float* y, const float* x, int64_t n) override {
    mine(y, n, "add y"), mine(x, n, "add x");
    cpu_.add(y, x, n);
  }
  void round_to_bf16(const float* x, bf16* y, int64_t n) override {
    mine(x, n, "round_to_bf16 x"), mine(y, n, "round_to_bf16 y");
    cpu_.round_to_bf16(x, y, n);
  }
  void widen_bf16(const bf16* x, float* y, int64_t n) override {
    mine(x, n, "widen_bf16 x"), mine(y, n, "widen_bf16 y");
    cpu_.widen_bf16(x, y, n);
  }

  void embedding_forward(const int32_t* t, int64_t n, const float* table, int64_t w, float* out) override {
    mine(t, n, "embedding tokens"), mine(table, w, "embedding table"), mine(out, n * w, "embedding out");
    cpu_.embedding_forward(t, n, table, w, out);
  }
  void embedding_backward(const int32_t* t, int64_t n, const float* dout, int64_t w, float* dtable) override {
    mine(t, n, "embedding tokens"), mine(dout, n * w, "embedding dout"), mine(dtable, w, "embedding dtable");
    cpu_.embedding_backward(t, n, dout, w, dtable);
  }
  void rmsnorm_forward(const ops::RowsShape& s, const float* x, const float* g, float eps, float* y, float* r) override {
    const int64_t n = s.rows, w = s.cols;
    mine(x, n * w, "rmsnorm x"), mine(g, w, "rmsnorm gain"), mine(y, n * w, "rmsnorm y"), mine(r, n, "rmsnorm rstd");
    cpu_.rmsnorm_forward(s, x, g, eps, y, r);
  }
  void rmsnorm_backward(const ops::RowsShape& s, const float* x, const float* g, const float* r, const float* dy,
                        float* dx, float* dg) override {
    const int64_t n = s.rows, w = s.cols;
    mine(x, n * w, "rmsnorm x"), mine(g, w, "rmsnorm gain"), mine(r, n, "rmsnorm rstd"), mine(dy, n * w, "rmsnorm dy");
    mine(dx, n * w, "rmsnorm dx"), mine(dg, w, "rmsnorm dgain");
    cpu_.rmsnorm_backward(s, x, g, r, dy, dx, dg);
  }
  void rope_forward(float* x, const ops::RopeShape& s, int64_t first) override {
    mine(x, s.tokens * s.stride, "rope x");
    cpu_.rope_forward(x, s, first);
  }
  void rope_backward(float* dx, const ops::RopeShape& s) override {
    mine(dx, s.tokens * s.stride, "rope dx");
    cpu_.rope_backward(dx, s);
  }
  void attention_forward(const ops::AttentionShape& s, const float* qkv, float* out, float* st) override {
    const int64_t N = s.batch * s.seq;
    mine(qkv, N * s.qkv_stride(), "attention qkv"), mine(out, N * s.out_width(), "attention out");
    mine(st, s.softmax_stats_size(), "attention stats");
    cpu_.attention_forward(s, qkv, out, st);
    if (takes_output_) outputs_[qkv].assign(out, out + N * s.out_width());
  }
  bool attention_backward_takes_output(const ops::AttentionShape&) const override { return takes_output_; }
  void attention_backward_with_output(const ops::AttentionShape& s, const float* qkv, const float* st, const float* out,
                                      const float* dout, float* dqkv) override {
    const int64_t N = s.batch * s.seq;
    mine(out, N * s.out_width(), "attention out (given to backward)");
    ++outputs_given_;
    if (outputs_[qkv] != std::vector<float>(out, out + N * s.out_width())) ++outputs_wrong_;
    attention_backward(s, qkv, st, dout, dqkv);
  }
  void attention_backward(const ops::AttentionShape& s, const float* qkv, const float* st, const float* dout,
                          float* dqkv) override {
    const int64_t N = s.batch * s.seq;
    mine(qkv, N * s.qkv_stride(), "attention qkv"), mine(st, s.softmax_stats_size(), "attention stats");
    mine(dout, N * s.out_width(), "attention dout"), mine(dqkv, N * s.qkv_stride(), "attention dqkv");
    cpu_.attention_backward(s, qkv, st, dout, dqkv);
  }
  void attention_decode(const ops::AttentionShape& s, int64_t past, const float* qkv, float* kc, float* vc,
                        float* out) override {
    const int64_t kv = s.kv_heads * s.head_dim;
    mine(qkv, s.seq * s.qkv_stride(), "decode qkv"), mine(kc, (past + s.seq) * kv, "decode k cache");
    mine(vc, (past + s.seq) * kv, "decode v cache"), mine(out, s.seq * s.out_width(), "decode out");
    cpu_.attention_decode(s, past, qkv, kc, vc, out);
  }
  void swiglu_forward(const float* gu, int64_t n, int64_t h, float* a) override {
    mine(gu, n * 2 * h, "swiglu gate_up"), mine(a, n * h, "swiglu a");
    cpu_.swiglu_forward(gu, n, h, a);
  }
  void swiglu_backward(const float* gu, const float* da, int64_t n, int64_t h, float* dgu) override {
    mine(gu, n * 2 * h, "swiglu gate_up"), mine(da, n * h, "swiglu da"), mine(dgu, n * 2 * h, "swiglu dgate_up");
    cpu_.swiglu_backward(gu, da, n, h, dgu);
  }
  double cross_entropy_forward(const float* l, const int32_t* t, int64_t n, int64_t v, float* loss) override {
    mine(l, n * v, "cross_entropy logits"), mine(t, n, "cross_entropy targets"), mine(loss, n, "cross_entropy loss");
    return cpu_.cross_entropy_forward(l, t, n, v, loss);
  }
  void cross_entropy_backward(const float* l, const int32_t* t, int64_t n, int64_t v, float scale, float* d) override {
    mine(l, n * v, "cross_entropy logits"), mine(t, n, "cross_entropy targets"), mine(d, n * v, "cross_entropy dlogits");
    cpu_.cross_entropy_backward(l, t, n, v, scale, d);
  }
  double cross_entropy_forward_keeping(const float* l, const int32_t* t, int64_t n, int64_t v, float* loss,
                                       float* stats) override {
    mine(l, n * v, "cross_entropy logits"), mine(t, n, "cross_entropy targets"), mine(loss, n, "cross_entropy loss");
    mine(stats, 2 * n, "cross_entropy row stats");
    return cpu_.cross_entropy_forward_keeping(l, t, n, v, loss, stats);
  }
  void cross_entropy_backward_kept(const float* l, const int32_t* t, int64_t n, int64_t v, float scale,
                                   const float* stats, float* d) override {
    mine(l, n * v, "cross_entropy logits"), mine(t, n, "cross_entropy targets"), mine(d, n * v, "cross_entropy dlogits");
    mine(stats, 2 * n, "cross_entropy row stats");
    cpu_.cross_entropy_backward_kept(l, t, n, v, scale, stats, d);
  }
  double sum_of_squares(const float* g, int64_t n) override {
    mine(g, n, "sum_of_squares");
    return cpu_.sum_of_squares(g, n);
  }
  std::vector<double> sum_of_squares_by_chunk(const float* g, int64_t n) override {
    mine(g, n, "sum_of_squares_by_chunk");
    return cpu_.sum_of_squares_by_chunk(g, n);
  }
  void adamw_update(const ops::AdamWStep& k, const float* g, float* m, float* v, float* w, const uint8_t* mask,
                    int64_t n) override {
    mine(g, n, "adamw g"), mine(m, n, "adamw m"), mine(v, n, "adamw v"), mine(w, n, "adamw w"), mine(mask, n, "adamw mask");
    cpu_.adamw_update(k, g, m, v, w, mask, n);
  }

 private:
  // [p, p + count elements) inside one live allocation of this backend, else the test fails naming it.
  template <typename T>
  void mine(const T* p, int64_t count, const char* what) {
    ++checked_;
    const auto a = reinterpret_cast<uintptr_t>(p);
    const uintptr_t end = a + static_cast<uintptr_t>(count) * sizeof(T);
    auto it = live_.upper_bound(a);
    const bool inside = it != live_.begin() && (--it, a >= it->first && end <= it->first + it->second);
    ADD_FAILURE_IF(!inside, what);
  }
  // Untyped memory (the memory calls): `bytes` bytes.
  void mine(const void* p, size_t bytes, const char* what) {
    mine(static_cast<const std::byte*>(p), static_cast<int64_t>(bytes), what);
  }
  static void ADD_FAILURE_IF(bool bad, const char* what) {
    if (bad) ADD_FAILURE() << what << ": a pointer outside the backend's memory was handed to it";
  }
  void dense(const char* what, const ops::DenseGemmShape& s, const float* a, const float* b, float* c) {
    mine(a, s.ta == ops::Trans::no ? (s.m - 1) * s.lda + s.k : (s.k - 1) * s.lda + s.m, what);
    mine(b, s.tb == ops::Trans::no ? (s.k - 1) * s.ldb + s.n : (s.n - 1) * s.ldb + s.k, what);
    mine(c, (s.m - 1) * s.ldc + s.n, what);
  }

  ops::Backend& cpu_ = ops::cpu();
  std::map<uintptr_t, size_t> live_;
  int64_t checked_ = 0;
  bool takes_output_ = false;
  std::map<const float*, std::vector<float>> outputs_;
  int64_t outputs_given_ = 0, outputs_wrong_ = 0;
};

model::ModelConfig small_model() {
  return nibble_test::tiny_model({.vocab = 40, .layers = 3, .width = 32, .context = 32, .mlp_hidden = 64});
}

TEST(BackendSeam, TrainingAndSamplingHandTheBackendOnlyItsOwnMemory) {
  StrictBackend strict;
  const model::ModelConfig m = small_model();
  model::Transformer model(m, strict);
  model.init_weights(3);
  const int64_t batch = 2, seq = 32, N = batch * seq;
  std::mt19937 rng(5);
  const std::vector<int32_t> tokens = nibble_test::random_tokens(N, m.vocab, rng);
  const std::vector<int32_t> targets = nibble_test::random_tokens(N, m.vocab, rng);
  train::AdamW adamw(model.params(), train::AdamWConfig{}, strict);
  train::GradientSum sum(strict);
  // Every recipe family: FP32, BF16 (X saved in BF16), NVFP4 (quantized operands, tile transpose,
  // BF16-kept layers, telemetry), MXFP4.
  for (Quantization q : {Quantization::none, Quantization::bf16, Quantization::nvfp4, Quantization::mxfp4}) {
    RecipeConfig rc;
    rc.quantization = q;
    const Recipe recipe(rc, static_cast<int>(m.layers), model.block_linear_shapes(), N, strict);
    for (int64_t step = 0; step < 2; ++step) {
      model::ModelStep ms;
      ms.recipe = &recipe;
      ms.micro_step = step;
      ms.weight_version = step;
      ms.collect_stats = step == 1;
      for (int micro = 0; micro < 3; ++micro) {  // gradient accumulation through the fixed tree
        model.params().zero_grads();
        EXPECT_TRUE(std::isfinite(model.forward(tokens, targets, batch, seq, ms)));
        model.backward(1.0f / 3);
        sum.add(model.params().grads());
      }
      sum.finish(model.params().grads());
      EXPECT_TRUE(std::isfinite(adamw.step(model.params(), 1e-3f)));
    }
    EXPECT_FALSE(model.telemetry().empty() && q == Quantization::nvfp4);
  }
  // Evaluation and sampling on the same model.
  model::ModelStep eval;
  eval.training = false;
  EXPECT_TRUE(std::isfinite(model.forward(tokens, targets, batch, seq, eval)));
  model::KvCacheDecoder decoder(model);
  decoder.feed(std::span<const int32_t>(tokens.data(), 5));
  EXPECT_EQ(decoder.step(1).size(), static_cast<size_t>(m.vocab));
  EXPECT_GT(strict.checked(), 1000);
  EXPECT_EQ(adamw.first_moments().size(), model.params().values().size());
}

// A backend whose attention backward takes the forward's output (the GPU's tiled kernels) is given
// each layer's own O, kept from its forward (not the scratch the layers share), in the backend's
// memory; the step's loss and gradients are bitwise those of the plain CPU backend.
TEST(BackendSeam, AttentionBackwardIsGivenEachLayersOwnForwardOutput) {
  StrictBackend strict;
  strict.take_attention_output();
  const model::ModelConfig m = small_model();
  model::Transformer given(m, strict), plain(m, ops::cpu());
  given.init_weights(7);
  plain.init_weights(7);
  const int64_t batch = 2, seq = 32, N = batch * seq;
  std::mt19937 rng(9);
  const std::vector<int32_t> tokens = nibble_test::random_tokens(N, m.vocab, rng);
  const std::vector<int32_t> targets = nibble_test::random_tokens(N, m.vocab, rng);
  RecipeConfig rc;
  rc.quantization = Quantization::nvfp4;  // attention with BF16 operands, as the tiled kernels run it
  const Recipe recipe(rc, static_cast<int>(m.layers), plain.block_linear_shapes(), N, ops::cpu());
  model::ModelStep ms;
  ms.recipe = &recipe;
  ms.weight_version = 0;
  given.params().zero_grads();
  plain.params().zero_grads();
  EXPECT_EQ(given.forward(tokens, targets, batch, seq, ms), plain.forward(tokens, targets, batch, seq, ms));
  given.backward(1.0f);
  plain.backward(1.0f);
  EXPECT_EQ(given.params().host_grads(), plain.params().host_grads());
  EXPECT_EQ(strict.outputs_given(), m.layers);
  EXPECT_EQ(strict.outputs_wrong(), 0);
}

// The check itself: host memory handed to the backend fails the test, the backend's own passes.
TEST(BackendSeam, TheStrictBackendCatchesHostMemory) {
  static StrictBackend strict;
  static std::vector<float> host(8, 1.0f);
  static ops::Array<float> own(strict, 8);
  EXPECT_NONFATAL_FAILURE(strict.add(own.data(), host.data(), 8), "add x: a pointer outside the backend's memory");
  // Runs past the array's end (inside the 64-byte rounding of the allocation, so the read itself is safe).
  EXPECT_NONFATAL_FAILURE(strict.sum_of_squares(own.data() + 4, 8), "sum_of_squares");
  strict.add(own.data(), own.data(), 8);
}

}  // namespace
