// The whole model: loss and gradients of every parameter tensor against central finite
// differences of the FP32 forward pass, for tied and untied heads with and without GQA; the
// recipe's effect on activation memory; telemetry.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <random>
#include <vector>

#include "model/transformer.h"
#include "recipe/recipe.h"
#include "support/random.h"
#include "support/tiny_model.h"

using namespace nibble;
using namespace nibble::model;

namespace {

ModelConfig tiny_config(bool tied, int64_t kv_heads) {
  ModelConfig c = nibble_test::tiny_model({.vocab = 11, .layers = 2, .width = 16, .context = 8, .mlp_hidden = 32});
  c.kv_heads = kv_heads;
  c.tied_embeddings = tied;
  c.init_std = 0.3f;  // large enough that every path carries gradient well above FP32 noise
  return c;
}

void random_tokens(std::vector<int32_t>& v, size_t n, int64_t vocab, uint32_t seed) { v = nibble_test::random_tokens(n, vocab, seed); }

}  // namespace

class ModelGradient : public ::testing::TestWithParam<std::tuple<bool, int64_t>> {};

TEST_P(ModelGradient, EveryParameterMatchesFiniteDifferences) {
  const auto [tied, kv_heads] = GetParam();
  Transformer m(tiny_config(tied, kv_heads), ops::cpu());
  m.init_weights(3);
  const int64_t batch = 2, seq = 8;
  std::vector<int32_t> tokens, targets;
  random_tokens(tokens, batch * seq, m.config().vocab, 1);
  random_tokens(targets, batch * seq, m.config().vocab, 2);
  ModelStep step;  // no recipe: FP32 GEMMs

  m.params().zero_grads();
  const double loss = m.forward(tokens, targets, batch, seq, step);
  EXPECT_GT(loss, 0.5);
  m.backward(1.0f);
  std::vector<float> grads(m.params().grads().begin(), m.params().grads().end());

  // Directional derivative along a random unit direction v of each tensor: (L(p + h v) - L(p - h v)) / 2h.
  // FP32 evaluation of L carries rounding noise ~ eps * L * sqrt(ops) and the central difference
  // has truncation h^2 L''' / 6; with h = 1e-2 the first is ~1e-4 and the second ~1e-5 here, so
  // the bound below is 64 eps |L| / h plus 2% of the derivative itself.
  const double h = 1e-2, eps = std::ldexp(1.0, -23);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const auto& p : m.params().params()) {
    std::vector<float> v(static_cast<size_t>(p.size()));
    double norm = 0;
    for (auto& x : v) {
      x = normal(rng);
      norm += static_cast<double>(x) * x;
    }
    double analytic = 0;
    for (int64_t i = 0; i < p.size(); ++i) {
      v[i] = static_cast<float>(v[i] / std::sqrt(norm));
      analytic += static_cast<double>(grads[p.offset + i]) * v[i];
    }
    float* w = m.params().value(p.offset);
    std::vector<float> saved(w, w + p.size());
    auto loss_at = [&](double t) {
      for (int64_t i = 0; i < p.size(); ++i) w[i] = static_cast<float>(saved[i] + t * v[i]);
      return m.forward(tokens, targets, batch, seq, step);
    };
    const double numeric = (loss_at(h) - loss_at(-h)) / (2 * h);
    std::copy(saved.begin(), saved.end(), w);
    EXPECT_NEAR(analytic, numeric, 64 * eps * loss / h + 0.02 * std::fabs(numeric)) << p.name;
    EXPECT_GT(std::fabs(analytic), 1e-3) << p.name << " gets almost no gradient: the check would be vacuous";
  }
}

INSTANTIATE_TEST_SUITE_P(TiedAndGqa, ModelGradient,
                         ::testing::Values(std::make_tuple(true, int64_t{4}), std::make_tuple(false, int64_t{2}),
                                           std::make_tuple(true, int64_t{1})));

TEST(Model, InitialWeightsAreTheSerialBoxMullerStreamForAnyThreadCount) {
  // The initialisation's stream, written out serially: each weight tensor k (1-based, in parameter
  // order) draws from splitmix64 seeded with seed * 0x100000001B3 + k * golden, two outputs per
  // Box-Muller pair; norm gains are 1. init_weights fills the pairs in parallel: it must give these
  // bits with one thread or several, and a big enough tensor (8192 pairs) to actually split.
  ModelConfig c = tiny_config(false, 0);
  c.width = 64;
  c.mlp_hidden = 256;  // gate_up: 64 x 512 values
  const uint64_t seed = 12345;
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    Transformer m(c, ops::cpu());
    m.init_weights(seed);
    omp_set_num_threads(2);
    const float residual_std = c.init_std / std::sqrt(2.0f * static_cast<float>(c.layers));
    uint64_t k = 0;
    for (const auto& p : m.params().params()) {
      ++k;
      const float* got = m.params().values().data() + p.offset;
      const int64_t n = p.rows * p.cols;
      if (p.rows == 1) {
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], 1.0f) << p.name;
        continue;
      }
      const bool residual = p.name.ends_with(".attn_out") || p.name.ends_with(".down");
      const float std_dev = residual ? residual_std : c.init_std;
      uint64_t state = seed * 0x100000001B3ull + k * 0x9E3779B97F4A7C15ull;
      auto next = [&state] {
        uint64_t z = (state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
      };
      for (int64_t i = 0; i < n; i += 2) {
        const double u1 = (static_cast<double>(next() >> 11) + 1.0) * 0x1.0p-53;
        const double u2 = static_cast<double>(next() >> 11) * 0x1.0p-53;
        const double r = std::sqrt(-2.0 * std::log(u1)), a = 2.0 * M_PI * u2;
        ASSERT_EQ(got[i], static_cast<float>(r * std::cos(a) * std_dev)) << p.name << " [" << i << "] " << threads;
        if (i + 1 < n) {
          ASSERT_EQ(got[i + 1], static_cast<float>(r * std::sin(a) * std_dev)) << p.name << " [" << i + 1 << "]";
        }
      }
    }
  }
}

// The contract zero_grads() relies on: a backward pass overwrites the linears' and the head's
// gradients and adds into the rest, so a second one without zeroing leaves the first ones as they
// were and doubles the others. Untied, so that the embedding is one of the others.
TEST(Model, ASecondBackwardOverwritesTheLinearsAndAddsToTheRest) {
  Transformer m(tiny_config(false, 4), ops::cpu());
  std::vector<int32_t> tokens, targets;
  random_tokens(tokens, 16, 11, 3);
  random_tokens(targets, 16, 11, 4);
  m.params().zero_grads();
  m.forward(tokens, targets, 2, 8, {});
  m.backward(1.0f);
  std::vector<float> once(m.params().grads().begin(), m.params().grads().end());
  m.forward(tokens, targets, 2, 8, {});
  m.backward(1.0f);
  int64_t added = 0;
  for (const ParamInfo& p : m.params().params())
    for (int64_t i = p.offset; i < p.offset + p.size(); ++i) {
      if (p.grad_overwritten) {
        ASSERT_EQ(m.params().grads()[i], once[i]) << p.name;
      } else {
        // Up to the rounding of the extra additions (the embedding adds a row per occurrence).
        ASSERT_NEAR(m.params().grads()[i], 2.0f * once[i], 8 * 1.2e-7 * std::fabs(once[i]) + 1e-12) << p.name;
        added += once[i] != 0.0f;
      }
    }
  EXPECT_GT(added, 0);
}

TEST(Model, Nvfp4StaysCloseToFp32AndSavesActivationMemory) {
  ModelConfig c = tiny_config(true, 4);
  c.layers = 3;
  c.init_std = 0.02f;
  Transformer fp32(c, ops::cpu()), nvfp4(c, ops::cpu());
  fp32.init_weights(9);
  nvfp4.init_weights(9);
  std::vector<int32_t> tokens, targets;
  random_tokens(tokens, 32, c.vocab, 5);
  random_tokens(targets, 32, c.vocab, 6);
  RecipeConfig rc;
  rc.quantization = Quantization::nvfp4;
  rc.nvfp4.bf16_last_layers = 0;
  Recipe recipe(rc, 3, nvfp4.block_linear_shapes(), 32, nvfp4.backend());
  ModelStep q;
  q.recipe = &recipe;
  q.collect_stats = true;
  const double l32 = fp32.forward(tokens, targets, 4, 8, {});
  const double l4 = nvfp4.forward(tokens, targets, 4, 8, q);
  EXPECT_NEAR(l4, l32, 0.02 * l32);
  EXPECT_LT(nvfp4.saved_activation_bytes(), fp32.saved_activation_bytes());
  nvfp4.backward(1.0f);
  for (float g : nvfp4.params().grads()) ASSERT_TRUE(std::isfinite(g));
  // Six operands per linear, four linears per block.
  EXPECT_EQ(nvfp4.telemetry().size(), size_t{3 * 4 * 6});
}

namespace {
// One process's stand-in for distributed.shard=full's provider: it holds the whole arena, records
// what the model acquires, and hands a linear its quantized weight made from a clean copy after
// setting the arena's FP32 values of that weight to NaN, so a Linear that read them anyway would
// turn the loss or the gradients NaN.
class PoisoningProvider final : public WeightProvider {
 public:
  explicit PoisoningProvider(ParamArena& params) : params_(params), clean_(params.host_values()) {}
  void acquire(int64_t begin, int64_t end) override { fp32.emplace_back(begin, end); }
  void release(int64_t, int64_t) override {}
  bool provides_quantized(const QuantOptions& o) const override { return o.tile_16x16; }
  void acquire_quantized(const ParamInfo& w, const QuantOptions& o, int64_t, ops::Quantized& out) override {
    quantized.push_back(w.name);
    quantized_ranges.emplace_back(w.offset, w.offset + w.size());
    ops::cpu().quantize(clean_.data() + w.offset, w.rows, w.cols, o, out);
    std::fill(params_.value(w.offset), params_.value(w.offset) + w.size(), std::nanf(""));
  }
  std::vector<std::pair<int64_t, int64_t>> fp32, quantized_ranges;
  std::vector<std::string> quantized;

 private:
  ParamArena& params_;
  std::vector<float> clean_;
};
}  // namespace

// distributed.shard=full's NVFP4 weight gather, seen from the model: the linears whose weights are
// 16x16 NVFP4 tiles in fprop and dgrad (block 0; block 1 is BF16 by bf16_last_layers) take their
// quantized weight from the provider in forward and again in backward and never read the FP32 one;
// the rest comes in FP32 ranges that leave those weights out; loss and gradients are bitwise the
// unprovided model's. A step with telemetry (which reads the FP32 weights) takes FP32 only.
TEST(Model, ProvidedQuantizedWeightsServeFpropAndDgradBitwise) {
  const ModelConfig c = tiny_config(false, 2);
  Transformer plain(c, ops::cpu()), provided(c, ops::cpu());
  plain.init_weights(4);
  provided.init_weights(4);
  PoisoningProvider provider(provided.params());
  provided.set_weight_provider(&provider);
  std::vector<int32_t> tokens, targets;
  random_tokens(tokens, 32, c.vocab, 7);
  random_tokens(targets, 32, c.vocab, 8);
  RecipeConfig rc;
  rc.quantization = Quantization::nvfp4;
  rc.nvfp4.bf16_last_layers = 1;
  Recipe recipe(rc, 2, plain.block_linear_shapes(), 32, plain.backend());
  ModelStep step;
  step.recipe = &recipe;
  step.weight_version = 0;
  plain.params().zero_grads();
  provided.params().zero_grads();
  const double want = plain.forward(tokens, targets, 4, 8, step);
  const double got = provided.forward(tokens, targets, 4, 8, step);
  EXPECT_EQ(got, want);
  plain.backward(1.0f);
  provided.backward(1.0f);
  const std::vector<float> want_grads = plain.params().host_grads(), got_grads = provided.params().host_grads();
  EXPECT_EQ(got_grads, want_grads);
  const std::vector<std::string> block0{"block0.qkv", "block0.attn_out", "block0.gate_up", "block0.down"};
  std::vector<std::string> twice = block0;
  twice.insert(twice.end(), block0.begin(), block0.end());
  EXPECT_EQ(provider.quantized, twice);
  for (const auto& [b, e] : provider.fp32)
    for (const auto& [qb, qe] : provider.quantized_ranges)
      EXPECT_TRUE(e <= qb || b >= qe) << "FP32 range [" << b << ", " << e << ") overlaps a provided weight";
  provider.quantized.clear();
  provided.params().set_values(plain.params().host_values());  // the poisoned weights clean again
  step.collect_stats = true;
  step.weight_version = 1;
  provided.forward(tokens, targets, 4, 8, step);
  EXPECT_TRUE(provider.quantized.empty());
}

TEST(Model, RejectsBadConfigAndTokens) {
  ModelConfig c = tiny_config(true, 4);
  c.width = 18;
  EXPECT_THROW((Transformer{c, ops::cpu()}), UsageError);
  c = tiny_config(true, 3);
  EXPECT_THROW((Transformer{c, ops::cpu()}), UsageError);
  Transformer m(tiny_config(true, 4), ops::cpu());
  std::vector<int32_t> bad(16, 11), ok(16, 0);
  EXPECT_THROW(m.forward(bad, ok, 2, 8, {}), UsageError);
  EXPECT_THROW(m.forward(ok, ok, 1, 16, {}), UsageError);  // longer than the context
}

// Sampling runs the model's own blocks over a KV cache (Transformer::decode): a prompt fed at once
// gives the logits of feeding it token by token, and both match the full forward pass's last row
// within FP32 rounding of two summation orders (the blocks' GEMMs over 1 vs n rows).
TEST(Model, DecodeOfAPromptAtOnceMatchesTokenByToken) {
  const ModelConfig m = nibble_test::tiny_model({.vocab = 37, .layers = 2, .width = 32, .context = 16});
  Transformer model(m, ops::cpu());
  model.init_weights(5);
  for (float& v : model.params().values()) v *= 4.0f;
  std::mt19937 rng(6);
  std::vector<int32_t> prompt(11);
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % m.vocab);

  KvCache at_once(m, model.backend()), one_by_one(m, model.backend());
  const auto a = model.decode(at_once, prompt);
  const std::vector<float> batched(a.begin(), a.end());
  std::vector<float> stepped;
  for (int32_t t : prompt) {
    const auto l = model.decode(one_by_one, std::span<const int32_t>(&t, 1));
    stepped.assign(l.begin(), l.end());
  }
  EXPECT_EQ(at_once.length, 11);
  EXPECT_EQ(one_by_one.length, 11);
  ASSERT_EQ(batched.size(), static_cast<size_t>(m.vocab));
  float scale = 0;
  for (float v : batched) scale = std::max(scale, std::fabs(v));
  for (int64_t i = 0; i < m.vocab; ++i) EXPECT_NEAR(batched[i], stepped[i], 1e-4f * scale) << i;

  // The next token continues either cache the same way.
  const int32_t next = 3;
  const auto c1 = model.decode(at_once, std::span<const int32_t>(&next, 1));
  const std::vector<float> after_batched(c1.begin(), c1.end());
  const auto c2 = model.decode(one_by_one, std::span<const int32_t>(&next, 1));
  for (int64_t i = 0; i < m.vocab; ++i) EXPECT_NEAR(after_batched[i], c2[i], 1e-4f * scale) << i;

  // Refused, the cache unchanged: overflowing the context, a token outside the vocabulary, a cache
  // of another model shape.
  std::vector<int32_t> too_many(5, 1);
  EXPECT_THROW(model.decode(at_once, too_many), UsageError);
  const int32_t bad = 37;
  EXPECT_THROW(model.decode(at_once, std::span<const int32_t>(&bad, 1)), UsageError);
  EXPECT_EQ(at_once.length, 12);
  ModelConfig other = m;
  other.layers = 3;
  KvCache wrong(other, model.backend());
  EXPECT_THROW(model.decode(wrong, std::span<const int32_t>(&next, 1)), UsageError);
}

// The backward pass overwrites the linears' and the head's gradients, so zero_grads() zeros only
// what it adds into (norm gains, an untied embedding, the alignment gaps): a backward over gradients
// holding NaN where it overwrites gives a freshly zeroed arena's gradients, for the dense GEMMs (FP32,
// BF16: beta 0) and the quantized wgrad (NVFP4: Output::overwrite), tied and untied.
TEST(ModelGradient, OverwrittenGradientsNeedNoZeroingAndTheRestIsZeroed) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const bool tied : {true, false})
    for (const Quantization q : {Quantization::none, Quantization::bf16, Quantization::nvfp4}) {
      SCOPED_TRACE(::testing::Message() << "tied " << tied << ", quantization " << static_cast<int>(q));
      ModelConfig c = nibble_test::tiny_model({.vocab = 40, .layers = 2, .width = 32, .context = 32, .mlp_hidden = 64});
      c.tied_embeddings = tied;
      const int64_t batch = 2, seq = 32;
      Transformer fresh(c, ops::cpu(), 4), reused(c, ops::cpu(), 4);
      RecipeConfig rc;
      rc.quantization = q;
      const Recipe recipe(rc, static_cast<int>(c.layers), fresh.block_linear_shapes(), batch * seq, ops::cpu());
      ModelStep step;
      step.recipe = &recipe;
      std::vector<int32_t> tokens, targets;
      random_tokens(tokens, batch * seq, c.vocab, 7);
      random_tokens(targets, batch * seq, c.vocab, 8);

      std::span<float> g = reused.params().grads();
      std::fill(g.begin(), g.end(), nan);
      reused.params().zero_grads();
      int64_t overwritten = 0, covered = 0;
      for (const ParamInfo& p : reused.params().params()) {
        covered += (p.size() + 15) / 16 * 16;
        if (p.grad_overwritten) overwritten += p.size();
        const bool left_as_is = p.grad_overwritten;
        for (int64_t i = 0; i < p.size(); ++i)
          ASSERT_EQ(std::isnan(g[p.offset + i]), left_as_is) << p.name << " [" << i << "]";
        for (int64_t i = p.offset + p.size(); i < std::min<int64_t>(p.offset + (p.size() + 15) / 16 * 16, g.size()); ++i)
          ASSERT_EQ(g[i], 0.0f) << "the gap after " << p.name;
      }
      EXPECT_EQ(covered, static_cast<int64_t>(g.size()));
      EXPECT_GT(overwritten, static_cast<int64_t>(g.size()) / 2);  // most of the arena is not written twice

      fresh.forward(tokens, targets, batch, seq, step);
      fresh.backward(1.0f);
      reused.forward(tokens, targets, batch, seq, step);
      reused.backward(1.0f);
      const std::span<const float> want = fresh.params().grads();
      for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(g[i], want[i]) << "gradient element " << i;
    }
}
