// A precision recipe is data: for every linear layer and every GEMM role (fprop, dgrad, wgrad) it
// says how each of the two operands is represented (FP32, BF16, or a QuantOptions for the
// quantizer). It is chosen by one key, `quantization`, plus the nvfp4.* knobs, and validated once at
// start-up with messages that say why a combination is refused (spec section 5).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/hash.h"
#include "format/quantized_tensor.h"
#include "ops/backend.h"
#include "recipe/precision_map.h"

namespace nibble {

enum class Quantization : uint8_t { none, bf16, fp8, mxfp8, mxfp4, nvfp4 };
std::string_view to_string(Quantization q);
Quantization parse_quantization(std::string_view s);  // UsageError listing the valid names

enum class GemmRole : uint8_t { fprop, dgrad, wgrad };
inline constexpr GemmRole kGemmRoles[] = {GemmRole::fprop, GemmRole::dgrad, GemmRole::wgrad};
std::string_view to_string(GemmRole r);

// How one GEMM multiplies. fp32 and bf16 run the backend's gemm_f32 / gemm_bf16 on FP32 data;
// quantized runs its quantized gemm on two tensors quantized with `a` and `b`.
enum class GemmPrecision : uint8_t { fp32, bf16, quantized };
std::string_view to_string(GemmPrecision p);

// The operands of one GEMM in the TN form the quantized GEMM needs (both K-contiguous):
//   fprop  Y[T,out]  = X[T,in]     . W[out,in]^T     a = X,    b = W    (K = in)
//   dgrad  dX[T,in]  = dY[T,out]   . (W^T)[in,out]^T a = dY,   b = W^T  (K = out)
//   wgrad  dW[out,in]= (dY^T)[out,T] . (X^T)[in,T]^T a = dY^T, b = X^T  (K = tokens)
struct GemmRecipe {
  GemmPrecision precision = GemmPrecision::fp32;
  QuantOptions a, b;  // meaningful only when precision == quantized; seeds are filled per step
  ops::Summation summation = ops::Summation::block_exact;  // how the quantized gemm sums (NVFP4, MXFP4, FP8)
};

// The `gemm_summation` key: how NVFP4, MXFP4 and FP8 GEMMs sum their products (ops::Summation). automatic
// takes fp32_products where the backend has a kernel for it (on the CPU: AMX-BF16, whose tiles multiply
// BF16 pairs without a per-block integer epilogue) and block_exact elsewhere.
enum class GemmSummation : uint8_t { automatic, block_exact, fp32_products };
std::string_view to_string(GemmSummation s);

struct LinearRecipe {
  GemmRecipe fprop, dgrad, wgrad;
  const GemmRecipe& operator[](GemmRole r) const;
  GemmRecipe& operator[](GemmRole r);
  // True when dgrad reuses fprop's quantized weight bit for bit (16x16 tiles: the transposed
  // copy is the exact transpose of the same codes and scales).
  bool weight_shared_by_fprop_and_dgrad() const;
};

// The knobs of the NVFP4 recipe. Defaults follow the paper (arXiv 2509.25149): RHT on the wgrad
// operands, SR on gradients, 16x16 weight tiles, no 4/6. The BF16 blocks default to the paper's
// share scaled to the model (the 12B run kept the first 2 and last 8 of 62 blocks in BF16).
struct Nvfp4Knobs {
  bool rht = true;
  bool stochastic_rounding = true;
  bool weight_2d = true;
  bool four_over_six = false;
  // With four_over_six (TE's nvfp4_4over6_err_mode / nvfp4_e4m3_max, and TE's defaults): the error
  // measure of the 4-or-6 choice and the E4M3 ceiling of the global scale (448: 2688 / amax, 256:
  // 1536 / amax). A value other than the default without four_over_six=true is refused (Recipe's
  // constructor), as gemm_summation is under a recipe it does not apply to; the defaults, which a
  // resolved config may write back, are accepted.
  FourOverSixError four_over_six_error = FourOverSixError::mae;
  int four_over_six_e4m3_max = 448;
  // TE's NVFP4BlockScaling(row_scaled_activation=True) (TE PRs #2931, #3206): the activation X gets
  // one FP32 global scale per row, for fprop per token and for wgrad's X^T per input feature.
  // Refused with rht (TE's row-scaled quantizer takes none) and four_over_six (spec section 4).
  bool row_scaled_activations = false;
  int bf16_first_layers = -1;  // -1: round(2/62 * layers)
  int bf16_last_layers = -1;   // -1: max(1, round(8/62 * layers))
};

// The `attention` key: the precision of attention's products (QK^T, PV). automatic: BF16 operands
// with FP32 accumulation for every recipe but `none` (Transformer Engine keeps attention in BF16
// under its FP8/NVFP4 recipes), FP32 for `none`. Softmax is FP32 in all cases.
enum class AttentionPrecision : uint8_t { automatic, fp32, bf16 };
std::string_view to_string(AttentionPrecision a);

// The `precision_switch_scope` key: which GEMMs precision_switch_at moves to BF16. all: fprop,
// dgrad and wgrad (the paper's switch, section 4.4 of arXiv 2509.25149); forward: fprop only, the
// backward keeps the recipe (the paper's forward-only variant, which recovers most of the loss gap
// while gradients stay in NVFP4).
enum class SwitchScope : uint8_t { all, forward };
std::string_view to_string(SwitchScope s);

struct RecipeConfig {
  Quantization quantization = Quantization::none;
  Nvfp4Knobs nvfp4;
  // Fraction of training after which every GEMM runs in BF16 (1 = never), paper section 4.
  double precision_switch_at = 1.0;
  SwitchScope precision_switch_scope = SwitchScope::all;
  GemmSummation gemm_summation = GemmSummation::automatic;
  AttentionPrecision attention = AttentionPrecision::automatic;
  // Set when the user wrote an nvfp4.* key (or gemm_summation), so a recipe other than nvfp4 can refuse it.
  bool nvfp4_knobs_given = false;
  bool gemm_summation_given = false;
  // Per-module quantization (recipe/precision_map.h), tried before the nvfp4.bf16_first_layers /
  // bf16_last_layers rules and `quantization`, which decide what no rule matches.
  std::vector<PrecisionRule> precision_map;
};

// The kind of value a configuration key takes (what `nibble train --keys` prints as its type).
enum class KeyValueKind : uint8_t { integer, real, boolean, text };

// One recipe key. recipe_keys() is the only place a recipe key is written: apply_recipe_option and
// parse_recipe read it, and the run config (run/config.cpp) takes its rows as config keys, which
// config.yaml, its resume diff and `nibble train --keys` print. A new recipe knob is one row there.
struct RecipeKey {
  std::string_view name;  // "nvfp4.rht"
  KeyValueKind kind;
  std::string_view help;  // one line: `nibble train --keys` and the comment in config.yaml
  // Sets the key from its text (`key` is `name`); UsageError naming the key for a bad value.
  void (*parse)(RecipeConfig& config, std::string_view key, std::string_view value);
  // The value as a resolved config writes it, re-readable by parse.
  std::string (*print)(const RecipeConfig& config);
  // Whether a resolved config writes the key: the nvfp4 knobs only under nvfp4 (another
  // quantization would refuse them when the saved file is loaded again).
  bool (*printed)(const RecipeConfig& config);
};
// Every recipe key, in the order a config prints them.
std::span<const RecipeKey> recipe_keys();

// One key=value override of a key in recipe_keys().
// Returns false when `key` is not a recipe key (so a config layer can try others); throws
// UsageError for a recipe key with a bad value, or an unknown nvfp4.* key (listing the knobs).
bool apply_recipe_option(RecipeConfig& config, std::string_view key, std::string_view value);
// "quantization=nvfp4 nvfp4.rht=false": whitespace- or comma-separated key=value pairs.
RecipeConfig parse_recipe(std::string_view text);
std::string describe(const RecipeConfig& config);
class Recipe;
// What the recipe resolved to on its backend: how NVFP4/FP8 GEMMs sum, attention's precision.
std::string describe_kernels(const Recipe& recipe);

// Shape of one linear layer as the recipe must see it to validate block sizes.
struct LinearShape {
  std::string name;
  int64_t in_features = 0, out_features = 0;
};

// What one module (a block's linear, or the LM head) resolved to, and which rule said so.
struct ModulePrecision {
  std::string name;             // block3.qkv, lm_head
  Quantization quantization;    // before precision_switch_at
  std::string decided_by;       // "precision_map rule 2 (block*.qkv)", "nvfp4.bf16_first_layers", "quantization"
  int rule = -1;                // the deciding rule's index in precision_map, -1 when none matched
  int64_t in_features = 0, out_features = 0;  // 0 for lm_head (the recipe needs no shape of it)
};

bool is_quantized(Quantization q);  // fp8, mxfp8, mxfp4, nvfp4

class Recipe {
 public:
  // layers: number of transformer blocks; linears: the shapes of one block's linears (their names
  // are the modules block{l}.{name}; the LM head is the module lm_head); tokens_per_micro_batch: T
  // of the wgrad GEMMs (its reduction dimension). ops: the backend the GEMMs run on (which
  // summations it has kernels for). Throws UsageError with the reason for any invalid combination.
  Recipe(const RecipeConfig& config, int layers, const std::vector<LinearShape>& linears,
         int64_t tokens_per_micro_batch, const ops::TensorOps& ops);

  const RecipeConfig& config() const { return config_; }
  int bf16_first_layers() const { return bf16_first_; }
  int bf16_last_layers() const { return bf16_last_; }
  const ops::TensorOps& ops() const { return *ops_; }
  // gemm_summation resolved for the backend and the quantization q (automatic -> fp32_products or block_exact).
  ops::Summation summation(Quantization q) const;
  // `attention` resolved: true when attention's products take BF16 operands.
  bool attention_bf16() const { return attention_bf16_; }
  // Every module, blocks' linears in order (block0.qkv, ..., block0.down, block1.qkv, ...) then lm_head.
  const std::vector<ModulePrecision>& modules() const { return modules_; }
  // True when some module runs in quantization q (some GEMM of it, before precision_switch_at).
  bool uses(Quantization q) const;
  // The operand options of linear `linear` of block `layer` at training progress `progress` in
  // [0, 1] (step / total steps). Seeds are zero here; the Linear derives them per step.
  LinearRecipe for_linear(int layer, int linear, double progress) const;
  // The LM head's GEMMs take BF16 operands (a precision_map rule said lm_head=bf16); else FP32.
  bool lm_head_bf16() const { return modules_.back().quantization == Quantization::bf16; }

  // The recipe of quantization `q` for a layer that is not kept in BF16.
  static LinearRecipe operands(Quantization q, const Nvfp4Knobs& knobs);

 private:
  void resolve_modules(const std::vector<LinearShape>& linears);
  void check_rules_decide();

  RecipeConfig config_;
  const ops::TensorOps* ops_;
  int layers_ = 0;
  int linears_per_block_ = 0;
  int bf16_first_ = 0, bf16_last_ = 0;
  bool attention_bf16_ = false;
  std::vector<ModulePrecision> modules_;
};

// Stochastic-rounding seed of one quantization: a hash of (run seed, step, layer, role, operand),
// so training is deterministic and no two quantizations share a random stream.
uint64_t sr_seed(uint64_t run_seed, int64_t step, int layer, int linear, GemmRole role, int operand);
// The same seed in two parts, so that a captured step (a CUDA graph, replayed every micro-step) can
// keep the per-micro-step part in device memory and the per-quantization part as a fixed kernel
// argument: sr_seed = sr_seed_of(sr_step_hash(run_seed, step), sr_salt(layer, linear, role, operand)).
uint64_t sr_step_hash(uint64_t run_seed, int64_t step);
uint64_t sr_salt(int layer, int linear, GemmRole role, int operand);
// sr_seed_of(step_hash, salt): common/hash.h (the GPU's quantize kernels call it too).

}  // namespace nibble
