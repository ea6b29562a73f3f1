// Optimizer, schedules, data, and the training loop: a short run's loss falls, a tiny model
// overfits a periodic text, and runs are bitwise reproducible across thread counts.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <string>
#include <vector>

#include "model/transformer.h"
#include "data/data.h"
#include "kernels/cpu/common/cpu_features.h"
#include "kernels/cpu/gemm/gemm.h"
#include "train/experiment.h"
#include "train/optimizer.h"
#include "train/trainer.h"

using namespace nibble;
using namespace nibble::train;

TEST(Schedule, WarmupThenCosineToMinLr) {
  ScheduleConfig s;
  s.lr = 1e-3f;
  s.min_lr = 1e-4f;
  s.warmup_steps = 10;
  s.total_steps = 110;
  EXPECT_FLOAT_EQ(learning_rate(s, 0), 1e-4f);
  EXPECT_FLOAT_EQ(learning_rate(s, 9), 1e-3f);
  EXPECT_FLOAT_EQ(learning_rate(s, 10), 1e-3f);
  EXPECT_NEAR(learning_rate(s, 60), 5.5e-4f, 1e-9);  // halfway: (lr + min_lr) / 2
  EXPECT_FLOAT_EQ(learning_rate(s, 110), 1e-4f);
  EXPECT_FLOAT_EQ(learning_rate(s, 500), 1e-4f);
  for (int64_t t = 11; t < 110; ++t) EXPECT_LE(learning_rate(s, t), learning_rate(s, t - 1));
}

TEST(Schedule, WarmupStableDecay) {
  ScheduleConfig s;
  s.kind = Schedule::wsd;
  s.lr = 1.0f;
  s.min_lr = 0.0f;
  s.warmup_steps = 10;
  s.total_steps = 100;
  s.wsd_decay_fraction = 0.2f;
  EXPECT_FLOAT_EQ(learning_rate(s, 50), 1.0f);
  EXPECT_FLOAT_EQ(learning_rate(s, 79), 1.0f);
  EXPECT_FLOAT_EQ(learning_rate(s, 90), 0.5f);
  EXPECT_FLOAT_EQ(learning_rate(s, 100), 0.0f);
  EXPECT_EQ(parse_schedule("wsd"), Schedule::wsd);
  EXPECT_THROW(parse_schedule("linear"), UsageError);
  s.min_lr = 2.0f;
  EXPECT_THROW(s.validate(), UsageError);
}

namespace {
model::ParamArena two_tensor_arena() {
  model::ParamArena a(ops::cpu());
  a.add("matrix", 2, 3, /*weight_decay=*/true);
  a.add("norm", 1, 3, /*weight_decay=*/false);
  a.allocate();
  const auto& p = a.params();
  for (int64_t i = 0; i < 6; ++i) {
    a.value(p[0].offset)[i] = 0.5f + 0.1f * static_cast<float>(i);
    a.grad(p[0].offset)[i] = 0.3f - 0.1f * static_cast<float>(i);
  }
  for (int64_t i = 0; i < 3; ++i) {
    a.value(p[1].offset)[i] = 1.0f;
    a.grad(p[1].offset)[i] = 0.2f * static_cast<float>(i + 1);
  }
  return a;
}
}  // namespace

TEST(AdamW, TwoStepsMatchTheFormulaWithDecoupledDecayOnMatricesOnly) {
  model::ParamArena a = two_tensor_arena();
  AdamWConfig c;
  c.beta1 = 0.9f;
  c.beta2 = 0.99f;
  c.eps = 1e-8f;
  c.weight_decay = 0.1f;
  c.clip_norm = 0.0f;
  AdamW opt(a, c, ops::cpu());
  const float lr = 0.01f;
  std::vector<double> w(a.values().begin(), a.values().end()), g(a.grads().begin(), a.grads().end());
  std::vector<double> m(w.size(), 0), v(w.size(), 0);
  for (int t = 1; t <= 2; ++t) {
    opt.step(a, lr);
    for (const auto& p : a.params())
      for (int64_t i = p.offset; i < p.offset + p.size(); ++i) {
        m[i] = 0.9 * m[i] + 0.1 * g[i];
        v[i] = 0.99 * v[i] + 0.01 * g[i] * g[i];
        double mh = m[i] / (1 - std::pow(0.9, t)), vh = v[i] / (1 - std::pow(0.99, t));
        if (p.weight_decay) w[i] -= lr * 0.1 * w[i];
        w[i] -= lr * mh / (std::sqrt(vh) + 1e-8);
        EXPECT_NEAR(a.values()[i], w[i], 4e-7 * std::fabs(w[i])) << p.name << " step " << t;
      }
  }
}

TEST(AdamW, ClipsByGlobalNorm) {
  model::ParamArena a = two_tensor_arena(), b = two_tensor_arena();
  const double norm = global_grad_norm(a.grads(), ops::cpu());
  double expect = 0;
  for (float x : a.grads()) expect += static_cast<double>(x) * x;
  EXPECT_NEAR(norm, std::sqrt(expect), 1e-12);
  // eps = 1 makes the first update depend on the gradient's size, so clipping is visible: clipping
  // a to norm 0.1 must equal an unclipped step on b's gradients scaled to norm 0.1.
  AdamWConfig clip;
  clip.eps = 1.0f;
  clip.weight_decay = 0;
  clip.clip_norm = 0.1f;
  AdamWConfig noclip = clip;
  noclip.clip_norm = 0;
  for (float& x : b.grads()) x = static_cast<float>(x * (0.1 / norm));
  AdamW oa(a, clip, ops::cpu()), ob(b, noclip, ops::cpu());
  EXPECT_NEAR(oa.step(a, 0.5f), norm, 1e-12);
  ob.step(b, 0.5f);
  for (size_t i = 0; i < a.values().size(); ++i) EXPECT_NEAR(a.values()[i], b.values()[i], 1e-7);
}

TEST(Data, TokenizerSplitAndDeterministicSampling) {
  CharTokenizer tok("hello world");
  EXPECT_EQ(tok.vocab_size(), 8);
  auto ids = tok.encode("low");
  EXPECT_EQ(tok.decode(ids), "low");
  EXPECT_THROW(tok.encode("z"), UsageError);
  std::vector<int32_t> all(1000);
  for (int i = 0; i < 1000; ++i) all[i] = i;
  TokenSplit s = split_tokens(all);
  EXPECT_EQ(s.train.size(), 900u);
  EXPECT_EQ(s.val.front(), 900);
  BatchSampler a(&s.train, 16, 7), b(&s.train, 16, 7), c(&s.train, 16, 8);
  std::vector<int32_t> xa, ya, xb, yb, xc, yc;
  a.sample(3, 4, xa, ya);
  b.sample(3, 4, xb, yb);
  c.sample(3, 4, xc, yc);
  EXPECT_EQ(xa, xb);
  EXPECT_NE(xa, xc);
  for (size_t i = 0; i < xa.size(); ++i) EXPECT_EQ(ya[i], xa[i] + 1);  // targets are the next token
  EXPECT_THROW(BatchSampler(&s.val, 200, 1), UsageError);
}

namespace {

std::vector<int32_t> shakespeare_prefix(size_t chars, int64_t& vocab) {
  std::string text = read_text_file(std::string(NIBBLE_SOURCE_DIR) + "/data/tinyshakespeare.txt").substr(0, chars);
  CharTokenizer tok(text);
  vocab = tok.vocab_size();
  return tok.encode(text);
}

TrainConfig tiny_run(int64_t vocab, Quantization q) {
  TrainConfig c;
  c.model.vocab = vocab;
  c.model.layers = 2;
  c.model.heads = 2;
  c.model.width = 32;
  c.model.mlp_hidden = 64;
  c.model.context = 16;
  c.batch = 4;
  c.grad_accum = 2;
  c.eval_batches = 2;
  c.schedule.lr = 3e-3f;
  c.schedule.min_lr = 3e-4f;
  c.schedule.warmup_steps = 5;
  c.schedule.total_steps = 60;
  c.recipe.quantization = q;
  if (q == Quantization::nvfp4) {
    c.recipe.nvfp4.bf16_last_layers = 0;  // every block in NVFP4, SR and RHT included
    c.recipe.nvfp4_knobs_given = true;
  }
  return c;
}

// tiny_run large enough (512 tokens x width 128) that every parallel loop of the model splits.
TrainConfig splitting_run(int64_t vocab, Quantization q) {
  TrainConfig c = tiny_run(vocab, q);
  c.model.width = 128;
  c.model.heads = 4;
  c.model.mlp_hidden = 256;
  c.model.context = 32;
  c.batch = 16;
  return c;
}

}  // namespace

TEST(Trainer, RunsAreBitwiseEqualAcrossThreadCounts) {
  int64_t vocab = 0;
  auto corpus = shakespeare_prefix(20000, vocab);
  for (Quantization q : {Quantization::nvfp4, Quantization::none}) {
    std::vector<double> losses[2];
    std::vector<float> weights[2];
    const TrainConfig c = splitting_run(vocab, q);
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      Trainer t(c, corpus);
      for (int s = 0; s < 4; ++s) losses[threads - 1].push_back(t.step().loss);
      losses[threads - 1].push_back(t.evaluate());
      weights[threads - 1].assign(t.model().params().values().begin(), t.model().params().values().end());
    }
    omp_set_num_threads(2);
    EXPECT_EQ(losses[0], losses[1]) << to_string(q);  // bitwise: EXPECT_EQ on doubles
    EXPECT_EQ(weights[0], weights[1]) << to_string(q);
  }
}

// BF16 GEMMs and attention products sum in pair order by vdpbf16ps or by two FMAs, whichever this
// CPU runs faster (cpu::bf16_pair_kernel): a run's bits must not depend on which. Needs AVX512-BF16
// (elsewhere only the FMAs run; test_gemm and test_attention check them against the written-out order).
TEST(Trainer, RunsAreBitwiseEqualWhicheverInstructionSumsTheBf16Pairs) {
  if (cpu::active_isa() < cpu::Isa::avx512bf16 || cpu::amx_bf16_active())
    GTEST_SKIP() << "needs AVX512-BF16 without AMX-BF16 (which has its own BF16 kernels)";
  int64_t vocab = 0;
  auto corpus = shakespeare_prefix(20000, vocab);
  for (Quantization q : {Quantization::bf16, Quantization::nvfp4}) {
    std::vector<double> losses[2];
    std::vector<float> weights[2];
    TrainConfig c = splitting_run(vocab, q);
    if (q == Quantization::nvfp4) c.recipe.nvfp4.bf16_last_layers = 1;  // a BF16-kept block beside an NVFP4 one
    int run = 0;
    for (cpu::Bf16PairKernel kernel : {cpu::Bf16PairKernel::fma, cpu::Bf16PairKernel::dpbf16}) {
      cpu::set_bf16_pair_kernel(kernel);
      Trainer t(c, corpus);
      for (int s = 0; s < 4; ++s) losses[run].push_back(t.step().loss);
      losses[run].push_back(t.evaluate());
      weights[run].assign(t.model().params().values().begin(), t.model().params().values().end());
      ++run;
    }
    cpu::set_bf16_pair_kernel(std::nullopt);
    EXPECT_EQ(losses[0], losses[1]) << to_string(q);  // bitwise: EXPECT_EQ on doubles
    EXPECT_EQ(weights[0], weights[1]) << to_string(q);
  }
}

TEST(Trainer, SameSeedSameRunDifferentSeedDifferentRun) {
  int64_t vocab = 0;
  auto corpus = shakespeare_prefix(20000, vocab);
  TrainConfig c = tiny_run(vocab, Quantization::nvfp4);
  Trainer a(c, corpus), b(c, corpus);
  c.seed += 1;
  Trainer d(c, corpus);
  for (int s = 0; s < 3; ++s) {
    double la = a.step().loss, lb = b.step().loss, ld = d.step().loss;
    EXPECT_EQ(la, lb);
    EXPECT_NE(la, ld);
  }
}

TEST(Trainer, ShortRunLossFallsUnderEveryRecipe) {
  int64_t vocab = 0;
  auto corpus = shakespeare_prefix(60000, vocab);
  for (Quantization q : {Quantization::none, Quantization::bf16, Quantization::nvfp4}) {
    TrainConfig c = tiny_run(vocab, q);
    Trainer t(c, corpus);
    const double before = t.evaluate();
    EXPECT_NEAR(before, std::log(static_cast<double>(vocab)), 0.1);  // an untrained model is near uniform
    double last = 0;
    for (int s = 0; s < 60; ++s) last = t.step().loss;
    const double after = t.evaluate();
    EXPECT_TRUE(std::isfinite(last));
    EXPECT_LT(after, before - 0.8) << to_string(q);  // past the unigram entropy plateau's start
  }
}

// nvfp4.row_scaled_activations (TE's row_scaled_activation, with the RHT off as TE requires):
// trains, and is not the per-tensor run (the knob reaches the GEMMs).
TEST(Trainer, RowScaledActivationsLossFallsAndChangeTheRun) {
  int64_t vocab = 0;
  auto corpus = shakespeare_prefix(60000, vocab);
  TrainConfig c = tiny_run(vocab, Quantization::nvfp4);
  c.recipe.nvfp4.rht = false;
  TrainConfig per_tensor = c;
  c.recipe.nvfp4.row_scaled_activations = true;
  Trainer t(c, corpus), u(per_tensor, corpus);
  const double before = t.evaluate();
  double last = 0;
  bool differs = false;
  for (int s = 0; s < 60; ++s) {
    last = t.step().loss;
    if (s < 3) differs = differs || last != u.step().loss;
  }
  const double after = t.evaluate();
  EXPECT_TRUE(differs) << "row scaling changed no loss of the first steps";
  EXPECT_TRUE(std::isfinite(last));
  EXPECT_LT(after, before - 0.8);
}

TEST(Trainer, RowScaledRunsAreBitwiseEqualAcrossThreadCounts) {
  int64_t vocab = 0;
  auto corpus = shakespeare_prefix(20000, vocab);
  std::vector<double> losses[2];
  std::vector<float> weights[2];
  TrainConfig c = splitting_run(vocab, Quantization::nvfp4);
  c.recipe.nvfp4.rht = false;
  c.recipe.nvfp4.row_scaled_activations = true;
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    Trainer t(c, corpus);
    for (int s = 0; s < 4; ++s) losses[threads - 1].push_back(t.step().loss);
    losses[threads - 1].push_back(t.evaluate());
    weights[threads - 1].assign(t.model().params().values().begin(), t.model().params().values().end());
  }
  omp_set_num_threads(2);
  EXPECT_EQ(losses[0], losses[1]);  // bitwise: EXPECT_EQ on doubles
  EXPECT_EQ(weights[0], weights[1]);
}

// precision_switch_at=0.5 of 10 steps: steps 0-4 are the unswitched run's bits; from step 5 on a
// forward-only switch (fprop in BF16, the backward still NVFP4) trains differently from the
// unswitched run, and from step 6 on from the switch of every GEMM.
TEST(Trainer, PrecisionSwitchScopeChangesTheRunFromTheSwitchOn) {
  int64_t vocab = 0;
  auto corpus = shakespeare_prefix(20000, vocab);
  auto losses = [&](double at, SwitchScope scope) {
    TrainConfig c = tiny_run(vocab, Quantization::nvfp4);
    c.schedule.total_steps = 10;
    c.recipe.precision_switch_at = at;
    c.recipe.precision_switch_scope = scope;
    Trainer t(c, corpus);
    std::vector<double> out;
    for (int s = 0; s < 8; ++s) out.push_back(t.step().loss);
    return out;
  };
  const auto never = losses(1.0, SwitchScope::all), all = losses(0.5, SwitchScope::all),
             forward = losses(0.5, SwitchScope::forward);
  for (int s = 0; s < 5; ++s) {
    EXPECT_EQ(all[s], never[s]) << s;
    EXPECT_EQ(forward[s], never[s]) << s;
  }
  // Step 5 is the first switched one: both switches ran its forward in BF16 on the same weights;
  // their backward passes differ, and so does every later step.
  EXPECT_NE(forward[5], never[5]);
  EXPECT_EQ(forward[5], all[5]);
  for (int s = 6; s < 8; ++s) {
    EXPECT_NE(forward[s], never[s]) << s;
    EXPECT_NE(forward[s], all[s]) << s;
  }
}

// A precision map changes exactly the GEMMs it names: every block's linears mapped to NVFP4 over a
// BF16 default trains bitwise like quantization=nvfp4 (no BF16 blocks); the LM head mapped to BF16
// changes the loss from the first step by no more than BF16 operands can.
TEST(Trainer, PrecisionMapRunsEachModuleInItsQuantization) {
  int64_t vocab = 0;
  auto corpus = shakespeare_prefix(20000, vocab);
  auto losses = [&](TrainConfig c) {
    c.schedule.total_steps = 10;
    Trainer t(c, corpus);
    std::vector<double> out;
    for (int s = 0; s < 4; ++s) out.push_back(t.step().loss);
    return out;
  };
  TrainConfig nvfp4 = tiny_run(vocab, Quantization::nvfp4);
  nvfp4.recipe.nvfp4.bf16_first_layers = 0;
  TrainConfig mapped = tiny_run(vocab, Quantization::bf16);
  mapped.recipe.precision_map = parse_precision_map("block*=nvfp4");
  const auto reference = losses(nvfp4);
  EXPECT_EQ(losses(mapped), reference);
  TrainConfig bf16 = tiny_run(vocab, Quantization::bf16);
  EXPECT_NE(losses(bf16), reference);

  TrainConfig head = nvfp4;
  head.recipe.precision_map = parse_precision_map("lm_head=bf16");
  const auto with_bf16_head = losses(head);
  // Each logit is a width-32 dot product of operands rounded to BF16 (relative error 2^-9 each), so
  // |dlogit| <= 2^-8 (1 + 2^-9) sum |x w|; with RMS-normed x (|x| <= sqrt(32)) and |w| < 0.1 at
  // initialisation that is < 2^-8 * 32 * sqrt(32) * 0.1, and the mean loss moves by at most 2 |dlogit|.
  EXPECT_NE(with_bf16_head[0], reference[0]);
  EXPECT_LT(std::abs(with_bf16_head[0] - reference[0]), 2 * std::ldexp(1.0, -8) * 32 * std::sqrt(32.0) * 0.1);
}

TEST(Trainer, TinyModelOverfitsAPeriodicText) {
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the quick brown fox. ";
  CharTokenizer tok(text);
  TrainConfig c = tiny_run(tok.vocab_size(), Quantization::none);
  c.schedule.total_steps = 150;
  Trainer t(c, tok.encode(text));
  double loss = 0;
  for (int s = 0; s < 150; ++s) loss = t.step().loss;
  EXPECT_LT(loss, 0.2);  // the text is periodic: a 16-token context predicts all but its first characters
  EXPECT_LT(t.evaluate(), 0.2);
}

TEST(Trainer, TelemetryEveryNSteps) {
  int64_t vocab = 0;
  auto corpus = shakespeare_prefix(20000, vocab);
  TrainConfig c = tiny_run(vocab, Quantization::nvfp4);
  c.telemetry_interval = 2;
  Trainer t(c, corpus);
  t.step();
  ASSERT_EQ(t.telemetry().size(), size_t{2 * 4 * 6});
  for (const auto& e : t.telemetry()) {
    EXPECT_GT(e.operand.stats.rel_rms_error, 0.0);
    EXPECT_LT(e.operand.stats.rel_rms_error, 0.3) << e.layer << " " << e.linear << " " << e.operand.operand;
  }
}

TEST(Trainer, RefusesBadConfig) {
  int64_t vocab = 0;
  auto corpus = shakespeare_prefix(20000, vocab);
  TrainConfig c = tiny_run(vocab, Quantization::nvfp4);
  c.batch = 3;  // 48 tokens: fine for 16-blocks
  EXPECT_NO_THROW(Trainer(c, corpus));
  c.seq = 10;  // 30 tokens: not a multiple of 16
  EXPECT_THROW(Trainer(c, corpus), UsageError);
  c = tiny_run(vocab, Quantization::none);
  c.seq = 64;
  EXPECT_THROW(Trainer(c, corpus), UsageError);
}

namespace nibble::train {
namespace {

// The ideal-step numerators of `nibble bench train` (issue 14), by hand for a small model: every
// linear's three GEMMs in the precision its layer's recipe gives them, the LM head in FP32, causal
// attention's six products, and each quantized operand's bytes.
TEST(StepWork, CountsEachGemmInItsLayersPrecisionAndTheCausalAttentionProducts) {
  model::ModelConfig m;
  m.vocab = 64, m.layers = 4, m.heads = 2, m.width = 64, m.context = 32, m.mlp_hidden = 128;
  const int64_t batch = 2, seq = 32;
  const double T = batch * seq, d = 64, f = 128, per_layer = d * 3 * d + d * d + d * 2 * f + f * d;  // in x out
  RecipeConfig rc;
  rc.quantization = Quantization::nvfp4;
  rc.nvfp4.bf16_first_layers = 1, rc.nvfp4.bf16_last_layers = 1;
  model::Transformer model(m, ops::cpu());
  const Recipe recipe(rc, 4, model.block_linear_shapes(), T, model.backend());
  const StepWork w = step_work(m, recipe, batch, seq, 1);
  EXPECT_DOUBLE_EQ(w.gemm_flops[static_cast<int>(GemmPrecision::quantized)], 2 * 3 * 2.0 * T * per_layer);
  EXPECT_DOUBLE_EQ(w.gemm_flops[static_cast<int>(GemmPrecision::bf16)], 2 * 3 * 2.0 * T * per_layer);
  EXPECT_DOUBLE_EQ(w.gemm_flops[static_cast<int>(GemmPrecision::fp32)], 3 * 2.0 * T * d * 64);  // the head
  // 4 layers x 6 products x 2 FLOPs x batch x heads x seq^2 / 2 x head_dim.
  EXPECT_DOUBLE_EQ(w.attention_flops, 4 * 6 * 2.0 * batch * 2 * (seq * seq / 2.0) * 32);
  EXPECT_TRUE(w.attention_bf16);
  // NVFP4 layers: fprop X and W, dgrad dY (W shared with fprop: 16x16 tiles), wgrad dY^T and X^T,
  // each read in FP32 (4 B) and written as codes + E4M3 scales (0.5625 B).
  const double in_plus_out = (d + 3 * d) + (d + d) + (d + 2 * f) + (f + d);
  // ... less one read of the X whose amax its producer gathers (qkv, gate_up: RMSNorm; down: SwiGLU)
  // and of every dY (qkv: RoPE backward; attn_out, down: RMSNorm backward; gate_up: SwiGLU backward).
  const double gathered_x = d + d + f + 3 * d + d + 2 * f + d;
  EXPECT_DOUBLE_EQ(w.quantize_bytes, 2 * 4.5625 * (2 * T * in_plus_out + per_layer) - 2 * 4 * T * gathered_x);
  // X and dY of each NVFP4 linear: one quantize_both pass each, read twice (amax, encode; once with
  // a gathered amax) and written twice (row-wise and transposed codes + scales); the weights are the rest.
  EXPECT_DOUBLE_EQ(w.fused_quantize_bytes, 2 * T * in_plus_out * (8 + 2 * 0.5625) - 2 * 4 * T * gathered_x);
  rc.nvfp4.row_scaled_activations = true, rc.nvfp4.rht = false;  // X and X^T row-scaled: made apart
  const StepWork row_scaled = step_work(m, Recipe(rc, 4, model.block_linear_shapes(), T, model.backend()), batch, seq, 1);
  EXPECT_DOUBLE_EQ(row_scaled.fused_quantize_bytes,
                   2 * T * (3 * d + d + 2 * f + d) * (8 + 2 * 0.5625) - 2 * 4 * T * (3 * d + d + 2 * f + d));  // dY alone
  EXPECT_GT(w.other_bytes, 0);

  RecipeConfig none;
  const Recipe fp32(none, 4, model.block_linear_shapes(), T, model.backend());
  const StepWork w32 = step_work(m, fp32, batch, seq, 1);
  EXPECT_DOUBLE_EQ(w32.gemm_flops[0], 4 * 3 * 2.0 * T * per_layer + 3 * 2.0 * T * d * 64);
  EXPECT_EQ(w32.quantize_bytes, 0);
  EXPECT_EQ(w32.fused_quantize_bytes, 0);
  EXPECT_FALSE(w32.attention_bf16);
  EXPECT_EQ(w32.other_bytes, w.other_bytes);  // the same ops around the GEMMs
}

// The ideal step judges the quantized GEMMs against the kernel training runs: gemm_summation as the
// recipe resolves it on this backend (auto is fp32_products where the CPU has the kernel, on
// AMX-BF16, whose tiles are another unit than the AMX-INT8 block_exact kernel's).
TEST(StepWork, CarriesTheSummationTheRecipeResolved) {
  model::ModelConfig m;
  m.vocab = 64, m.layers = 2, m.heads = 2, m.width = 64, m.context = 32, m.mlp_hidden = 128;
  model::Transformer model(m, ops::cpu());
  const auto work_of = [&](GemmSummation g) {
    RecipeConfig rc;
    rc.quantization = Quantization::nvfp4;
    rc.gemm_summation = g;
    return step_work(m, Recipe(rc, 2, model.block_linear_shapes(), 64, model.backend()), 2, 32, 1);
  };
  EXPECT_EQ(work_of(GemmSummation::block_exact).quantized_summation, ops::Summation::block_exact);
  const ops::Summation automatic = model.backend().fp32_products_available(Format::nvfp4) ? ops::Summation::fp32_products
                                                                                          : ops::Summation::block_exact;
  EXPECT_EQ(work_of(GemmSummation::automatic).quantized_summation, automatic);
  if (model.backend().fp32_products_available(Format::nvfp4)) {
    EXPECT_EQ(work_of(GemmSummation::fp32_products).quantized_summation, ops::Summation::fp32_products);
  }
}

}  // namespace
}  // namespace nibble::train
