// The start-up report of `nibble train`: the model, data, compute, memory and recipe of a run,
// printed before its first step.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer.h"
#include "model/transformer.h"
#include "recipe/recipe.h"
#include "run/config.h"

namespace nibble::train {

// "324.3 MiB", "1.30 GiB": bytes for people.
std::string bytes_text(double bytes);

// Bytes of training state for one micro-batch, estimated from the shapes (model/transformer.h's
// saved activations; scratch buffers that live only inside one layer are not counted).
struct MemoryEstimate {
  int64_t weights = 0, gradients = 0, optimizer = 0;
  int64_t activations_fp32 = 0;       // every saved tensor in FP32
  int64_t activations_recipe = 0;     // the linears' saved wgrad inputs in the recipe's formats
  // What training holds at once: the state and one micro-batch's activations as the recipe saves them.
  int64_t total() const { return weights + gradients + optimizer + activations_recipe; }
};
// Without a recipe (before the Trainer that builds it exists), the wgrad operands the recipe keeps
// are left out: a lower bound, enough to refuse a model that cannot fit before allocating it.
MemoryEstimate estimate_memory(const model::ModelConfig& m, const Recipe* recipe, int64_t batch, int64_t seq);

// A CPU run whose estimate exceeds the machine's memory (MemTotal) would be killed or fail in its
// first step, after minutes of start-up: refused (UsageError) naming the keys that lower it. Nothing
// is checked where /proc/meminfo is missing, or for device=cuda (the GPU's memory holds the run).
void refuse_beyond_memory(const MemoryEstimate& estimate, const RunConfig& config);

// The resolved precision of every module (one line per run of blocks that resolved alike, then
// lm_head, each with the rule that decided it), the share of GEMM FLOPs in each quantization, and
// the GEMMs of each quantization in use, e.g.
//   "  blocks 1-2:  qkv bf16 (rule 1), attn_out nvfp4, gate_up nvfp4, down nvfp4"
//   "nvfp4: fprop nvfp4 x nvfp4(16x16) | dgrad nvfp4/SR x nvfp4(16x16) | wgrad nvfp4/SR/RHT x nvfp4/RHT"
std::vector<std::string> describe_recipe_per_module(const Recipe& recipe, const model::ModelConfig& m);

// Everything printed before the first step; `tokenizer` describes it ("char tokenizer").
std::string startup_report(const RunConfig& config, const model::Transformer& model, const Recipe& recipe,
                           std::string_view tokenizer, int64_t train_tokens, int64_t val_tokens, double peak_flops);

}  // namespace nibble::train
