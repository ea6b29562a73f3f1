// The model of a training step's time on a GPU (bench/gpu_step_model.h): its work counts agree with
// the CPU benchmark's (train/experiment.h), its columns are ordered as their definitions require,
// and each recipe's GEMMs run on the unit the GPU has for them.
#include <gtest/gtest.h>

#include <algorithm>

#include "bench/gpu_step_model.h"
#include "common/error.h"
#include "train/experiment.h"

using namespace nibble;
using namespace nibble::bench;

namespace {

model::ModelConfig small_model() {
  model::ModelConfig m;
  m.layers = 4;
  m.width = 256;
  m.heads = 4;
  m.context = 128;
  m.vocab = 512;
  return m;
}

Recipe recipe_of(const std::string& text, const model::ModelConfig& m, int64_t tokens) {
  return Recipe(parse_recipe(text), static_cast<int>(m.layers), model::block_linear_shapes(m), tokens, ops::cpu());
}

const KernelKindTime& kind(const StepPrediction& p, const std::string& name) {
  for (const auto& k : p.kinds)
    if (k.kind == name) return k;
  throw std::runtime_error("no kind " + name);
}

}  // namespace

TEST(GpuStepModel, CountsTheFlopsTheCpuBenchmarkCounts) {
  const model::ModelConfig m = small_model();
  const int64_t batch = 4, seq = 128;
  for (const char* text : {"quantization=none", "quantization=bf16", "quantization=nvfp4"}) {
    const Recipe r = recipe_of(text, m, batch * seq);
    const StepPrediction p = predict_step(m, r, batch, seq, gpu_spec("h200"));
    const train::StepWork w = train::step_work(m, r, batch, seq, 1);
    const double cpu_gemm = w.gemm_flops[0] + w.gemm_flops[1] + w.gemm_flops[2];
    EXPECT_DOUBLE_EQ(kind(p, "linear GEMMs").flops + kind(p, "LM head GEMMs").flops, cpu_gemm) << text;
    EXPECT_DOUBLE_EQ(kind(p, "attention forward").flops + kind(p, "attention backward").flops, w.attention_flops);
    EXPECT_EQ(p.tokens, batch * seq);
  }
}

TEST(GpuStepModel, AsWrittenIsNeverFasterThanTheDesignNorADesignKernelThanItsLaunches) {
  const model::ModelConfig m = small_model();
  for (const char* gpu : {"h200", "b200"})
    for (const char* text : {"quantization=bf16", "quantization=nvfp4", "quantization=mxfp4"}) {
      const GpuSpec& g = gpu_spec(gpu);
      const StepPrediction p = predict_step(m, recipe_of(text, m, 512), 4, 128, g);
      double sum = 0;
      for (const auto& k : p.kinds) {
        EXPECT_GE(k.written_s, k.design_s) << gpu << " " << text << " " << k.kind;
        if (k.design_s > 0) {
          EXPECT_GE(k.design_s, g.launch_s) << k.kind;
        }
        sum += k.written_s;
      }
      EXPECT_DOUBLE_EQ(p.written_s, sum + p.syncs * g.sync_s);
      EXPECT_GT(p.torch_s, 0);
    }
}

// Hopper multiplies NVFP4 as BF16 (dequantized operands: the same GEMM time as bf16), Blackwell on its
// NVFP4 tensor cores (faster); as written no quantization synchronises: quantized recipes read the
// deferred non-finite flag twice a step, after the loss and the norm reads.
TEST(GpuStepModel, Nvfp4GemmsAreEmulatedOnHopperAndNativeOnBlackwell) {
  model::ModelConfig m = small_model();
  m.width = 2048;
  m.heads = 16;
  const int64_t tokens = 64 * 128;  // enough that the GEMMs are compute-bound, not their FP32 output
  const Recipe bf16 = recipe_of("quantization=bf16", m, tokens);
  const Recipe nvfp4 = recipe_of("quantization=nvfp4 nvfp4.bf16_first_layers=0 nvfp4.bf16_last_layers=0", m, tokens);
  const auto gemm_s = [&](const Recipe& r, const char* gpu) {
    return kind(predict_step(m, r, 64, 128, gpu_spec(gpu)), "linear GEMMs").design_s;
  };
  EXPECT_NEAR(gemm_s(nvfp4, "h200"), gemm_s(bf16, "h200"), 0.3 * gemm_s(bf16, "h200"));
  EXPECT_LT(gemm_s(nvfp4, "b200"), 0.5 * gemm_s(bf16, "b200"));
  const StepPrediction hopper = predict_step(m, nvfp4, 64, 128, gpu_spec("h200"));
  // The norm and the loss, each followed by the read of the quantizations' deferred flag.
  EXPECT_EQ(hopper.syncs, 2 + 2);
  // Per linear: X, W, dY (W^T shared by 16x16 tiles), dY^T, X^T; each one fused pass by design.
  EXPECT_EQ(kind(hopper, "quantize (amax, cast)").launches, 4.0 * 4 * 5);
  // As written the cast pass writes the emulated GEMM's BF16 operand (dgrad's 16x16-tile weight
  // takes it transposed, one pass per linear): no dequantize pass on either GPU.
  EXPECT_EQ(kind(hopper, "transpose tile weight's BF16 operand").launches, 4.0 * 4);
  for (const char* gpu : {"h200", "b200"}) {
    const StepPrediction p = predict_step(m, nvfp4, 64, 128, gpu_spec(gpu));
    EXPECT_TRUE(std::none_of(p.kinds.begin(), p.kinds.end(),
                             [](const KernelKindTime& k) { return k.kind.starts_with("dequantize"); }))
        << gpu;
  }
  EXPECT_EQ(predict_step(m, bf16, 64, 128, gpu_spec("h200")).syncs, 2);
}

TEST(GpuStepModel, AnUnknownGpuIsRefusedNamingTheModelledOnes) {
  try {
    gpu_spec("a100");
    FAIL() << "accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("use h200, b200"), std::string::npos) << e.what();
  }
}

// Attention as written: the tiled tensor-core kernels where the recipe keeps attention in BF16 (the
// quantized recipes) at head_dim 64, the design's forward and a backward of 7 products at the
// design's rate (compute-bound at this shape); FP32 attention keeps the per-row kernels, slower.
TEST(GpuStepModel, AttentionAsWrittenIsTheTiledKernelWhereAttentionIsBf16) {
  model::ModelConfig m = small_model();
  m.context = 1024;
  const GpuSpec& g = gpu_spec("h200");
  const StepPrediction tiled = predict_step(m, recipe_of("quantization=nvfp4", m, 8 * 1024), 8, 1024, g);
  const KernelKindTime& fwd = kind(tiled, "attention forward");
  const KernelKindTime& bwd = kind(tiled, "attention backward");
  EXPECT_DOUBLE_EQ(fwd.written_s, fwd.design_s);
  EXPECT_DOUBLE_EQ(bwd.written_s, 7.0 / 4.0 * bwd.flops / (g.bf16_flops * g.attention_bwd_efficiency));
  const StepPrediction fp32 = predict_step(m, recipe_of("quantization=none attention=fp32", m, 8 * 1024), 8, 1024, g);
  EXPECT_GT(kind(fp32, "attention forward").written_s, 10 * fwd.written_s);
}
