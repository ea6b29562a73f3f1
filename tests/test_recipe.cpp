// The recipe as data (spec section 5), its parsing and validation, and the quantized Linear: each
// of its three GEMMs equals the composition of the spec's reference quantizers (nibble::ref) and
// the reference GEMM, within the FP32 accumulation bound, for every recipe.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <random>
#include <vector>

#include "format/codecs.h"
#include "format/quantize.h"
#include "kernels/cpu/gemm/gemm.h"
#include "kernels/cpu/quantize/quantize.h"
#include "recipe/linear.h"
#include "recipe/recipe.h"
#include "support/random.h"

using namespace nibble;

namespace {

using nibble_test::normal_floats;

const std::vector<LinearShape> kShapes = {{"qkv", 128, 384}, {"down", 352, 128}};

}  // namespace

TEST(Recipe, Nvfp4OperandsAreSpecSection5) {
  LinearRecipe r = Recipe::operands(Quantization::nvfp4, Nvfp4Knobs{});
  for (GemmRole role : kGemmRoles) {
    EXPECT_EQ(r[role].precision, GemmPrecision::quantized);
    EXPECT_EQ(r[role].a.format, Format::nvfp4);
    EXPECT_EQ(r[role].b.format, Format::nvfp4);
    EXPECT_FALSE(r[role].a.four_over_six);
  }
  // Fprop: X 1x16 RN, W 16x16 RN.
  EXPECT_FALSE(r.fprop.a.tile_16x16);
  EXPECT_EQ(r.fprop.a.rounding, Rounding::nearest);
  EXPECT_FALSE(r.fprop.a.rht);
  EXPECT_TRUE(r.fprop.b.tile_16x16);
  EXPECT_EQ(r.fprop.b.rounding, Rounding::nearest);
  // Dgrad: dY 1x16 SR, the same W.
  EXPECT_FALSE(r.dgrad.a.tile_16x16);
  EXPECT_EQ(r.dgrad.a.rounding, Rounding::stochastic);
  EXPECT_FALSE(r.dgrad.a.rht);
  EXPECT_TRUE(r.dgrad.b.tile_16x16);
  EXPECT_TRUE(r.weight_shared_by_fprop_and_dgrad());
  // Wgrad: dY^T RHT + SR, X^T RHT + RN, both 1x16 along the tokens.
  EXPECT_TRUE(r.wgrad.a.rht);
  EXPECT_EQ(r.wgrad.a.rounding, Rounding::stochastic);
  EXPECT_FALSE(r.wgrad.a.tile_16x16);
  EXPECT_TRUE(r.wgrad.b.rht);
  EXPECT_EQ(r.wgrad.b.rounding, Rounding::nearest);
  EXPECT_FALSE(r.wgrad.b.tile_16x16);
}

TEST(Recipe, Nvfp4KnobsSwitchTheirOperands) {
  Nvfp4Knobs k;
  k.rht = false;
  k.stochastic_rounding = false;
  k.weight_2d = false;
  k.four_over_six = true;
  LinearRecipe r = Recipe::operands(Quantization::nvfp4, k);
  EXPECT_FALSE(r.wgrad.a.rht || r.wgrad.b.rht);
  EXPECT_EQ(r.dgrad.a.rounding, Rounding::nearest);
  EXPECT_EQ(r.wgrad.a.rounding, Rounding::nearest);
  EXPECT_FALSE(r.fprop.b.tile_16x16 || r.dgrad.b.tile_16x16);
  EXPECT_FALSE(r.weight_shared_by_fprop_and_dgrad());
  for (GemmRole role : kGemmRoles) EXPECT_TRUE(r[role].a.four_over_six && r[role].b.four_over_six);
}

TEST(Recipe, FourOverSixKnobsReachEveryOperand) {
  // TE's defaults: MAE, E4M3 ceiling 448.
  RecipeConfig d = parse_recipe("quantization=nvfp4 nvfp4.four_over_six=true");
  EXPECT_EQ(d.nvfp4.four_over_six_error, FourOverSixError::mae);
  EXPECT_EQ(d.nvfp4.four_over_six_e4m3_max, 448);
  RecipeConfig c =
      parse_recipe("quantization=nvfp4 nvfp4.four_over_six=true nvfp4.four_over_six_error=mse nvfp4.four_over_six_e4m3_max=256");
  EXPECT_EQ(c.nvfp4.four_over_six_error, FourOverSixError::mse);
  EXPECT_EQ(c.nvfp4.four_over_six_e4m3_max, 256);
  const LinearRecipe r = Recipe::operands(Quantization::nvfp4, c.nvfp4);
  for (GemmRole role : kGemmRoles)
    for (const QuantOptions* o : {&r[role].a, &r[role].b}) {
      EXPECT_TRUE(o->four_over_six);
      EXPECT_EQ(o->four_over_six_error, FourOverSixError::mse);
      EXPECT_EQ(o->four_over_six_e4m3_max, 256);
    }
  EXPECT_TRUE(r.weight_shared_by_fprop_and_dgrad());  // 16x16 tiles keep one choice per tile
  EXPECT_NE(describe(c).find("nvfp4.four_over_six_error=mse nvfp4.four_over_six_e4m3_max=256"), std::string::npos)
      << describe(c);
  EXPECT_NO_THROW(Recipe(c, 4, kShapes, 768, ops::cpu()));
  // Bad values name the key, the value and the valid ones.
  auto message = [](const std::string& text) {
    try {
      parse_recipe(text);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string bad_error = message("quantization=nvfp4 nvfp4.four_over_six=true nvfp4.four_over_six_error=max");
  EXPECT_NE(bad_error.find("nvfp4.four_over_six_error 'max'"), std::string::npos) << bad_error;
  EXPECT_NE(bad_error.find("mae"), std::string::npos) << bad_error;
  EXPECT_NE(bad_error.find("mse"), std::string::npos) << bad_error;
  const std::string bad_max = message("quantization=nvfp4 nvfp4.four_over_six=true nvfp4.four_over_six_e4m3_max=512");
  EXPECT_NE(bad_max.find("nvfp4.four_over_six_e4m3_max '512'"), std::string::npos) << bad_max;
  EXPECT_NE(bad_max.find("448"), std::string::npos) << bad_max;
  EXPECT_NE(bad_max.find("256"), std::string::npos) << bad_max;
  EXPECT_NE(message("nvfp4.four_over_six_eror=mse").find("nvfp4.four_over_six_error"), std::string::npos);
  // Without four_over_six: another value than the default is refused, the defaults are accepted.
  for (const char* text : {"quantization=nvfp4 nvfp4.four_over_six_error=mse", "quantization=nvfp4 nvfp4.four_over_six_e4m3_max=256"}) {
    try {
      Recipe rejected(parse_recipe(text), 4, kShapes, 768, ops::cpu());
      ADD_FAILURE() << text << " was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("apply only with nvfp4.four_over_six=true"), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(Recipe(parse_recipe("quantization=nvfp4 nvfp4.four_over_six_error=mae nvfp4.four_over_six_e4m3_max=448"), 4,
                         kShapes, 768, ops::cpu()));
  // And like every nvfp4 knob, refused under another quantization.
  EXPECT_THROW(Recipe(parse_recipe("quantization=bf16 nvfp4.four_over_six_error=mae"), 4, kShapes, 768, ops::cpu()), UsageError);
}

TEST(Recipe, OtherRecipesUseTheirFormats) {
  LinearRecipe fp8 = Recipe::operands(Quantization::fp8, {});
  EXPECT_EQ(fp8.fprop.a.format, Format::fp8_e4m3);
  EXPECT_EQ(fp8.fprop.b.format, Format::fp8_e4m3);
  EXPECT_EQ(fp8.dgrad.a.format, Format::fp8_e5m2);
  EXPECT_EQ(fp8.wgrad.a.format, Format::fp8_e5m2);
  EXPECT_EQ(fp8.wgrad.b.format, Format::fp8_e4m3);
  EXPECT_EQ(Recipe::operands(Quantization::mxfp8, {}).wgrad.b.format, Format::mxfp8);
  LinearRecipe mx4 = Recipe::operands(Quantization::mxfp4, {});
  EXPECT_EQ(mx4.fprop.a.format, Format::mxfp4);
  EXPECT_EQ(mx4.dgrad.a.rounding, Rounding::stochastic);
  EXPECT_EQ(Recipe::operands(Quantization::bf16, {}).wgrad.precision, GemmPrecision::bf16);
  EXPECT_EQ(Recipe::operands(Quantization::none, {}).dgrad.precision, GemmPrecision::fp32);
}

TEST(Recipe, ParsesKeyValuePairs) {
  RecipeConfig c = parse_recipe("quantization=nvfp4 nvfp4.rht=false,nvfp4.bf16_last_layers=2 precision_switch_at=0.8");
  EXPECT_EQ(c.quantization, Quantization::nvfp4);
  EXPECT_FALSE(c.nvfp4.rht);
  EXPECT_TRUE(c.nvfp4.stochastic_rounding);
  EXPECT_EQ(c.nvfp4.bf16_last_layers, 2);
  EXPECT_DOUBLE_EQ(c.precision_switch_at, 0.8);
  EXPECT_EQ(c.gemm_summation, GemmSummation::automatic);
  EXPECT_EQ(parse_recipe("quantization=nvfp4 gemm_summation=block_exact").gemm_summation, GemmSummation::block_exact);
  EXPECT_EQ(parse_recipe("quantization=nvfp4 gemm_summation=fp32_products").gemm_summation, GemmSummation::fp32_products);
  EXPECT_THROW(parse_recipe("quantization=nvfp4 gemm_summation=fast"), UsageError);
  EXPECT_EQ(parse_recipe("quantization=bf16").quantization, Quantization::bf16);
  EXPECT_THROW(parse_recipe("quantization=int4"), UsageError);
  EXPECT_THROW(parse_recipe("quantization=nvfp4 nvfp4.rht=maybe"), UsageError);
  EXPECT_THROW(parse_recipe("nvfp4.sr=true"), UsageError);
  EXPECT_THROW(parse_recipe("learning_rate=3"), UsageError);
  EXPECT_THROW(parse_recipe("quantization"), UsageError);
  RecipeConfig other;
  EXPECT_FALSE(apply_recipe_option(other, "lr", "1e-3"));  // left for other config layers
}

// The recipe keys are one table: parsing, the refusal lists and printing all read it.
TEST(Recipe, KeyTableParsesPrintsAndListsEveryKey) {
  RecipeConfig c;
  c.quantization = Quantization::nvfp4;
  for (const RecipeKey& k : recipe_keys()) {
    RecipeConfig back;
    EXPECT_TRUE(apply_recipe_option(back, k.name, k.print(c))) << k.name;  // the printed form parses back
    EXPECT_EQ(k.print(back), k.print(c)) << k.name;
    EXPECT_FALSE(k.help.empty()) << k.name;
  }
  auto error_of = [](const std::string& text) {
    try {
      parse_recipe(text);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(error_of("nvfp4.sr=true").find("the nvfp4 knobs are nvfp4.rht, nvfp4.stochastic_rounding, nvfp4.weight_2d, "
                                           "nvfp4.four_over_six, nvfp4.four_over_six_error, "
                                           "nvfp4.four_over_six_e4m3_max, nvfp4.row_scaled_activations, "
                                           "nvfp4.bf16_first_layers, nvfp4.bf16_last_layers"),
            std::string::npos);
  EXPECT_NE(error_of("learning_rate=3").find("use quantization, precision_switch_at, precision_switch_scope, gemm_summation, attention, precision_map or nvfp4.*"),
            std::string::npos);
  EXPECT_NE(error_of("quantization=nvfp4 nvfp4.weight_2d=maybe").find("nvfp4.weight_2d=maybe is not a boolean"),
            std::string::npos);
}

TEST(Recipe, RefusesInvalidCombinationsWithTheReason) {
  auto refuses = [](const std::string& text, int layers, int64_t tokens, const std::string& reason) {
    try {
      Recipe r(parse_recipe(text), layers, kShapes, tokens, ops::cpu());
      ADD_FAILURE() << text << " was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
    }
  };
  refuses("quantization=bf16 nvfp4.rht=false", 4, 768, "set quantization=nvfp4");
  refuses("quantization=nvfp4 precision_switch_at=1.5", 4, 768, "outside [0, 1]");
  refuses("quantization=none precision_switch_at=0.5", 4, 768, "applies to quantized recipes");
  refuses("quantization=mxfp8 gemm_summation=block_exact", 4, 768, "or drop gemm_summation");
  refuses("quantization=nvfp4 precision_switch_scope=forward", 4, 768, "precision_switch_at=1 never switches");
  refuses("quantization=nvfp4 nvfp4.bf16_first_layers=2 nvfp4.bf16_last_layers=2", 4, 768, "leaving none in NVFP4");
  refuses("quantization=nvfp4", 4, 760, "multiple of 16");
  refuses("quantization=mxfp4", 4, 784, "multiple of 32");
  refuses("quantization=nvfp4 nvfp4.bf16_first_layers=-3", 4, 768, ">= 0");
  refuses("quantization=nvfp4 nvfp4.bf16_first_layers=-3", 4, 768, "nvfp4.bf16_first_layers and nvfp4.bf16_last_layers");
  refuses("quantization=nvfp4", 4, 760, "(batch x seq)");
  Recipe ok(parse_recipe("quantization=mxfp8"), 4, kShapes, 768, ops::cpu());
  std::vector<LinearShape> odd = {{"qkv", 100, 300}};
  EXPECT_THROW(Recipe(parse_recipe("quantization=nvfp4"), 4, odd, 768, ops::cpu()), UsageError);
  EXPECT_NO_THROW(Recipe(parse_recipe("quantization=bf16"), 4, odd, 7, ops::cpu()));
}

TEST(Recipe, RowScaledActivationsReachXAndXtOnlyAndRefuseWhatTeRefuses) {
  // TE's row_scaled_activation: the forward activation quantizer (X for fprop, X^T for wgrad).
  const RecipeConfig c = parse_recipe("quantization=nvfp4 nvfp4.rht=false nvfp4.row_scaled_activations=true");
  EXPECT_TRUE(c.nvfp4.row_scaled_activations);
  const LinearRecipe r = Recipe::operands(Quantization::nvfp4, c.nvfp4);
  EXPECT_TRUE(r.fprop.a.row_scaled);
  EXPECT_TRUE(r.wgrad.b.row_scaled);
  EXPECT_FALSE(r.fprop.b.row_scaled || r.dgrad.a.row_scaled || r.dgrad.b.row_scaled || r.wgrad.a.row_scaled);
  EXPECT_EQ(r.dgrad.a.rounding, Rounding::stochastic);  // gradients keep SR; weights keep 16x16 tiles
  EXPECT_TRUE(r.fprop.b.tile_16x16);
  EXPECT_NO_THROW(Recipe(c, 4, kShapes, 768, ops::cpu()));
  EXPECT_NE(describe(c).find("nvfp4.row_scaled_activations=true"), std::string::npos) << describe(c);
  EXPECT_EQ(describe(parse_recipe("quantization=nvfp4")).find("row_scaled"), std::string::npos);
  for (GemmRole role : kGemmRoles) {
    const LinearRecipe plain = Recipe::operands(Quantization::nvfp4, Nvfp4Knobs{});
    EXPECT_FALSE(plain[role].a.row_scaled || plain[role].b.row_scaled);
  }
  auto refusal = [](const std::string& text) {
    try {
      Recipe r(parse_recipe(text), 4, kShapes, 768, ops::cpu());
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  const std::string rht = refusal("quantization=nvfp4 nvfp4.row_scaled_activations=true");
  EXPECT_NE(rht.find("nvfp4.row_scaled_activations=true does not combine with nvfp4.rht=true"), std::string::npos) << rht;
  const std::string fos = refusal("quantization=nvfp4 nvfp4.rht=false nvfp4.four_over_six=true nvfp4.row_scaled_activations=true");
  EXPECT_NE(fos.find("nvfp4.row_scaled_activations=true does not combine with nvfp4.four_over_six=true"), std::string::npos)
      << fos;
  for (const char* q : {"none", "bf16", "fp8", "mxfp8", "mxfp4"}) {
    const std::string other = refusal(std::string("quantization=") + q + " nvfp4.row_scaled_activations=true");
    EXPECT_NE(other.find("nvfp4.row_scaled_activations=true applies to quantization=nvfp4"), std::string::npos) << other;
  }
  // Off is the default and is accepted wherever nvfp4 knobs are.
  EXPECT_NO_THROW(Recipe(parse_recipe("quantization=nvfp4 nvfp4.row_scaled_activations=false"), 4, kShapes, 768, ops::cpu()));
}

TEST(Recipe, KeepsFirstAndLastLayersInBf16AndSwitchesLate) {
  // Defaults scale the paper's 2 + 8 of 62 BF16 blocks: 0 + 1 of 4, 2 + 8 of 62.
  Recipe small(parse_recipe("quantization=nvfp4"), 4, kShapes, 768, ops::cpu());
  EXPECT_EQ(small.bf16_first_layers(), 0);
  EXPECT_EQ(small.bf16_last_layers(), 1);
  Recipe big(parse_recipe("quantization=nvfp4"), 62, kShapes, 768, ops::cpu());
  EXPECT_EQ(big.bf16_first_layers(), 2);
  EXPECT_EQ(big.bf16_last_layers(), 8);

  Recipe r(parse_recipe("quantization=nvfp4 nvfp4.bf16_first_layers=1 nvfp4.bf16_last_layers=1 precision_switch_at=0.75"),
           4, kShapes, 768, ops::cpu());
  EXPECT_EQ(r.for_linear(0, 0, 0.0).fprop.precision, GemmPrecision::bf16);
  EXPECT_EQ(r.for_linear(1, 0, 0.0).fprop.precision, GemmPrecision::quantized);
  EXPECT_EQ(r.for_linear(2, 0, 0.5).wgrad.precision, GemmPrecision::quantized);
  EXPECT_EQ(r.for_linear(3, 0, 0.0).dgrad.precision, GemmPrecision::bf16);
  for (GemmRole role : kGemmRoles) EXPECT_EQ(r.for_linear(1, 0, 0.75)[role].precision, GemmPrecision::bf16);
}

TEST(Recipe, AForwardOnlySwitchMovesOnlyFpropToBf16) {
  Recipe r(parse_recipe("quantization=nvfp4 nvfp4.bf16_first_layers=0 nvfp4.bf16_last_layers=1 precision_switch_at=0.8 "
                        "precision_switch_scope=forward"),
           4, kShapes, 768, ops::cpu());
  for (GemmRole role : kGemmRoles) EXPECT_EQ(r.for_linear(1, 0, 0.79)[role].precision, GemmPrecision::quantized);
  const LinearRecipe after = r.for_linear(1, 0, 0.8);
  EXPECT_EQ(after.fprop.precision, GemmPrecision::bf16);
  EXPECT_EQ(after.dgrad.precision, GemmPrecision::quantized);
  EXPECT_EQ(after.wgrad.precision, GemmPrecision::quantized);
  EXPECT_EQ(after.wgrad.a.rounding, Rounding::stochastic);  // the backward keeps the whole recipe
  EXPECT_TRUE(after.wgrad.a.rht);
  for (GemmRole role : kGemmRoles) EXPECT_EQ(r.for_linear(3, 0, 0.9)[role].precision, GemmPrecision::bf16);  // kept layer
  EXPECT_THROW(parse_recipe("precision_switch_scope=backward"), UsageError);
  EXPECT_NE(describe(r.config()).find("precision_switch_at=0.8 precision_switch_scope=forward"), std::string::npos)
      << describe(r.config());
}

TEST(Recipe, SrSeedsDifferPerStepLayerRoleAndOperand) {
  const uint64_t base = sr_seed(1, 10, 2, 1, GemmRole::dgrad, 0);
  EXPECT_EQ(base, sr_seed(1, 10, 2, 1, GemmRole::dgrad, 0));
  EXPECT_NE(base, sr_seed(2, 10, 2, 1, GemmRole::dgrad, 0));
  EXPECT_NE(base, sr_seed(1, 11, 2, 1, GemmRole::dgrad, 0));
  EXPECT_NE(base, sr_seed(1, 10, 3, 1, GemmRole::dgrad, 0));
  EXPECT_NE(base, sr_seed(1, 10, 2, 0, GemmRole::dgrad, 0));
  EXPECT_NE(base, sr_seed(1, 10, 2, 1, GemmRole::wgrad, 0));
  EXPECT_NE(base, sr_seed(1, 10, 2, 1, GemmRole::dgrad, 1));
}

// The split a captured step uses (per-micro-step hash in device memory, per-quantization salt as a
// kernel argument) gives the seeds of the formula the runs so far were trained and checkpointed with:
// mix64(mix64(mix64(run_seed) ^ step) ^ (layer << 16 | linear << 8 | role << 2 | operand)).
TEST(Recipe, SrSeedSplitIntoStepHashAndSaltGivesTheSameSeeds) {
  std::mt19937_64 rng(77);
  for (int i = 0; i < 200; ++i) {
    const uint64_t run_seed = rng();
    const int64_t step = static_cast<int64_t>(rng() % 100000);
    const int layer = static_cast<int>(rng() % 96), linear = static_cast<int>(rng() % 7);
    const GemmRole role = kGemmRoles[rng() % 3];
    const int operand = static_cast<int>(rng() % 2);
    const uint64_t salt = static_cast<uint64_t>(layer) << 16 | static_cast<uint64_t>(linear) << 8 |
                          static_cast<uint64_t>(role) << 2 | static_cast<uint64_t>(operand);
    const uint64_t formula = mix64(mix64(mix64(run_seed) ^ static_cast<uint64_t>(step)) ^ salt);
    EXPECT_EQ(sr_seed(run_seed, step, layer, linear, role, operand), formula);
    EXPECT_EQ(sr_salt(layer, linear, role, operand), salt);
    EXPECT_EQ(sr_seed_of(sr_step_hash(run_seed, step), salt), formula);
  }
}

// ---- The Linear against the reference composition. ----

namespace {

struct LinearCase {
  int64_t tokens = 64, in = 64, out = 96;
  std::vector<float> x, w, dy;
  LinearStep step;
};

LinearCase make_case(Quantization q) {
  LinearCase c;
  c.x = normal_floats(c.tokens * c.in, 1, 1.0f);
  c.w = normal_floats(c.out * c.in, 2, 0.05f);
  c.dy = normal_floats(c.tokens * c.out, 3, 1e-3f);
  c.x[5] = 9.0f;  // an outlier, so the RHT and the scales have something to do
  c.step.recipe = Recipe::operands(q, Nvfp4Knobs{});
  c.step.run_seed = 77;
  c.step.micro_step = 5;
  c.step.layer = 1;
  c.step.linear = 2;
  c.step.weight_version = 0;
  return c;
}

QuantOptions seeded(QuantOptions o, const LinearStep& s, GemmRole role, int operand) {
  if (o.rounding == Rounding::stochastic) o.seed = sr_seed(s.run_seed, s.micro_step, s.layer, s.linear, role, operand);
  return o;
}

// C[M,N] = A[M,K] B[N,K]^T in double with the FP32 accumulation bound |err| <= (K+2) u sum_k |a_k b_k|
// (u = 2^-24; the +2 covers the final scaling), given the operands as the GEMM sees them.
void expect_matches(const std::vector<float>& got, const std::vector<double>& a, const std::vector<double>& b, int64_t M,
                    int64_t N, int64_t K, const std::vector<double>& offset, const char* what) {
  const double u = std::ldexp(1.0, -24);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        s += a[i * K + k] * b[j * K + k];
        mag += std::fabs(a[i * K + k] * b[j * K + k]);
      }
      const double expect = s + (offset.empty() ? 0.0 : offset[i * N + j]);
      ASSERT_NEAR(got[i * N + j], expect, (K + 2) * u * mag + 2 * u * std::fabs(expect) + 1e-30)
          << what << " [" << i << ", " << j << "]";
    }
}

std::vector<double> dequantized(const QuantizedTensor& q) {
  std::vector<float> f(static_cast<size_t>(q.rows * q.cols));
  ref::dequantize_codes(q, f);  // the values the GEMM multiplies (after RHT when q.rht)
  return {f.begin(), f.end()};
}

std::vector<double> as_operand(const std::vector<float>& v, int64_t rows, int64_t cols, bool transpose, bool bf16) {
  std::vector<double> out(v.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float x = v[r * cols + c];
      if (bf16) x = round_to_bf16(x);
      out[transpose ? c * rows + r : r * cols + c] = x;
    }
  return out;
}

}  // namespace

class LinearComposition : public ::testing::TestWithParam<Quantization> {};

void check_linear_composition(const LinearCase& c) {
  const LinearStep& s = c.step;
  const int64_t T = c.tokens, I = c.in, O = c.out;
  Linear lin("test", I, O, ops::cpu());
  // dw holds 0.25 before: wgrad overwrites it (model/params.h: zero_grads leaves it).
  std::vector<float> y(T * O), dx(T * I), dw(O * I, 0.25f);
  lin.forward(s, c.x.data(), T, c.w.data(), y.data());
  lin.backward(c.dy.data(), c.w.data(), dx.data(), dw.data());

  const LinearRecipe& r = s.recipe;
  if (r.fprop.precision != GemmPrecision::quantized) {
    const bool bf16 = r.fprop.precision == GemmPrecision::bf16;
    expect_matches(y, as_operand(c.x, T, I, false, bf16), as_operand(c.w, O, I, false, bf16), T, O, I, {}, "fprop");
    expect_matches(dx, as_operand(c.dy, T, O, false, bf16), as_operand(c.w, O, I, true, bf16), T, I, O, {}, "dgrad");
    expect_matches(dw, as_operand(c.dy, T, O, true, bf16), as_operand(c.x, T, I, true, bf16), O, I, T, {}, "wgrad");
    return;
  }
  auto xq = ref::quantize(c.x, T, I, seeded(r.fprop.a, s, GemmRole::fprop, 0));
  auto wq = ref::quantize(c.w, O, I, seeded(r.fprop.b, s, GemmRole::fprop, 1));
  expect_matches(y, dequantized(xq), dequantized(wq), T, O, I, {}, "fprop");
  auto dyq = ref::quantize(c.dy, T, O, seeded(r.dgrad.a, s, GemmRole::dgrad, 0));
  auto wtq = ref::quantize_transposed(c.w, O, I, seeded(r.dgrad.b, s, GemmRole::dgrad, 1));
  expect_matches(dx, dequantized(dyq), dequantized(wtq), T, I, O, {}, "dgrad");
  auto dytq = ref::quantize_transposed(c.dy, T, O, seeded(r.wgrad.a, s, GemmRole::wgrad, 0));
  auto xtq = ref::quantize_transposed(c.x, T, I, seeded(r.wgrad.b, s, GemmRole::wgrad, 1));
  expect_matches(dw, dequantized(dytq), dequantized(xtq), O, I, T, {}, "wgrad");
  // The fast quantizers inside the Linear made the reference's bytes.
  EXPECT_EQ(lin.fprop_weight()->codes, wq.codes);
  EXPECT_EQ(lin.fprop_weight()->scales, wq.scales);
  EXPECT_EQ(lin.dgrad_weight()->codes, wtq.codes);
}

TEST_P(LinearComposition, EveryGemmEqualsReferenceQuantizersAndGemm) { check_linear_composition(make_case(GetParam())); }

TEST(LinearComposition, Nvfp4WithFp32ProductsSummation) {
  // The same law when the GEMMs sum element products in FP32 (AMX-BF16 where present).
  LinearCase c = make_case(Quantization::nvfp4);
  for (GemmRole role : kGemmRoles) c.step.recipe[role].summation = cpu::Summation::fp32_products;
  check_linear_composition(c);
}

TEST(LinearComposition, Nvfp4RowScaledActivations) {
  // TE's row_scaled_activation: X's tokens and X^T's features of very different magnitudes, each
  // with its own global scale; all three GEMMs still equal the reference composition.
  LinearCase c = make_case(Quantization::nvfp4);
  for (int64_t t = 0; t < c.tokens; ++t)
    for (int64_t i = 0; i < c.in; ++i) c.x[t * c.in + i] *= std::exp2(static_cast<float>(t % 9 * 4 - 16 + i % 5));
  Nvfp4Knobs k;
  k.rht = false;
  k.row_scaled_activations = true;
  c.step.recipe = Recipe::operands(Quantization::nvfp4, k);
  check_linear_composition(c);
  for (GemmRole role : kGemmRoles) c.step.recipe[role].summation = cpu::Summation::fp32_products;
  check_linear_composition(c);
}

TEST(Recipe, AttentionPrecisionFollowsTheRecipe) {
  const auto bf16 = [](const std::string& text) { return Recipe(parse_recipe(text), 4, kShapes, 768, ops::cpu()).attention_bf16(); };
  EXPECT_FALSE(bf16("quantization=none"));
  EXPECT_TRUE(bf16("quantization=nvfp4"));
  EXPECT_TRUE(bf16("quantization=bf16"));
  EXPECT_FALSE(bf16("quantization=nvfp4 attention=fp32"));
  EXPECT_TRUE(bf16("quantization=none attention=bf16"));
  EXPECT_THROW(parse_recipe("attention=fp16"), UsageError);
}

TEST(Recipe, GemmSummationResolvesForThisCpu) {
  const auto summation = [](const std::string& text) { return Recipe(parse_recipe(text), 4, kShapes, 768, ops::cpu()).for_linear(1, 0, 0.0).fprop.summation; };
  EXPECT_EQ(summation("quantization=nvfp4 gemm_summation=block_exact"), cpu::Summation::block_exact);
  EXPECT_EQ(summation("quantization=nvfp4 gemm_summation=fp32_products"), cpu::Summation::fp32_products);
  EXPECT_EQ(summation("quantization=nvfp4"), cpu::fp32_products_available(Format::nvfp4) ? cpu::Summation::fp32_products
                                                                                         : cpu::Summation::block_exact);
  // FP8 also takes fp32_products where only AVX512-BF16 (vdpbf16ps) is there.
  EXPECT_EQ(summation("quantization=fp8"), cpu::fp32_products_available(Format::fp8_e4m3) ? cpu::Summation::fp32_products
                                                                                          : cpu::Summation::block_exact);
}

INSTANTIATE_TEST_SUITE_P(AllRecipes, LinearComposition,
                         ::testing::Values(Quantization::none, Quantization::bf16, Quantization::fp8, Quantization::mxfp8,
                                           Quantization::mxfp4, Quantization::nvfp4),
                         [](const auto& info) { return std::string(to_string(info.param)); });

TEST(Linear, Nvfp4DgradSeesBitwiseTheWeightFpropUsed) {
  LinearCase c = make_case(Quantization::nvfp4);
  Linear lin("test", c.in, c.out, ops::cpu());
  std::vector<float> y(c.tokens * c.out), dx(c.tokens * c.in), dw(c.out * c.in, 0.0f);
  lin.forward(c.step, c.x.data(), c.tokens, c.w.data(), y.data());
  lin.backward(c.dy.data(), c.w.data(), dx.data(), dw.data());
  QuantizedTensor expect = ref::transpose_tiles(*lin.fprop_weight());
  EXPECT_EQ(lin.dgrad_weight()->codes, expect.codes);
  EXPECT_EQ(lin.dgrad_weight()->scales, expect.scales);
  EXPECT_EQ(lin.dgrad_weight()->amax, expect.amax);
  EXPECT_EQ(lin.dgrad_weight()->decode_scale, expect.decode_scale);
}

TEST(Linear, Nvfp4SavesQuantizedActivationsAndReportsTelemetry) {
  LinearCase c = make_case(Quantization::nvfp4);
  c.step.collect_stats = true;
  Linear lin("test", c.in, c.out, ops::cpu());
  std::vector<float> y(c.tokens * c.out), dx(c.tokens * c.in), dw(c.out * c.in, 0.0f);
  lin.forward(c.step, c.x.data(), c.tokens, c.w.data(), y.data());
  // 4 bits per value plus one E4M3 scale per 16: 9/64 of the FP32 bytes.
  EXPECT_EQ(lin.saved_activation_bytes(), c.tokens * c.in / 2 + c.tokens * c.in / 16);
  lin.backward(c.dy.data(), c.w.data(), dx.data(), dw.data());
  EXPECT_EQ(lin.saved_activation_bytes(), 0);
  std::vector<std::string> names;
  for (const auto& s : lin.stats()) {
    names.push_back(s.operand);
    EXPECT_GT(s.stats.rel_rms_error, 0.0);
    EXPECT_LT(s.stats.rel_rms_error, 0.25) << s.operand;  // NVFP4's error is ~10%, not garbage
  }
  EXPECT_EQ(names, (std::vector<std::string>{"fprop.X", "fprop.W", "wgrad.X^T", "dgrad.dY", "dgrad.W^T", "wgrad.dY^T"}));

  LinearCase f = make_case(Quantization::none);
  Linear full("fp32", f.in, f.out, ops::cpu());
  full.forward(f.step, f.x.data(), f.tokens, f.w.data(), y.data());
  EXPECT_EQ(full.saved_activation_bytes(), f.tokens * f.in * 4);
}

TEST(Linear, ResultsDoNotDependOnTheThreadCount) {
  for (Quantization q : {Quantization::nvfp4, Quantization::none, Quantization::mxfp4}) {
    std::vector<float> out[2];
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      LinearCase c = make_case(q);
      Linear lin("test", c.in, c.out, ops::cpu());
      std::vector<float> y(c.tokens * c.out), dx(c.tokens * c.in), dw(c.out * c.in, 0.0f);
      lin.forward(c.step, c.x.data(), c.tokens, c.w.data(), y.data());
      lin.backward(c.dy.data(), c.w.data(), dx.data(), dw.data());
      auto& o = out[threads - 1];
      o = y;
      o.insert(o.end(), dx.begin(), dx.end());
      o.insert(o.end(), dw.begin(), dw.end());
    }
    omp_set_num_threads(2);
    EXPECT_EQ(out[0], out[1]) << to_string(q);
  }
}

TEST(Linear, ProducerGatheredAmaxIsAskedForOnlyWhereItServesAndChangesNoBit) {
  // NVFP4 training: fprop X and wgrad X^T (and in backward dgrad dY and wgrad dY^T) come from one
  // quantize_both that can take the operand's amaxes from its producer (with the RHT amax, wgrad's
  // copies having the RHT). Given them, the linear's outputs and gradients are the bits it makes
  // without; 1, 2 and 3 threads.
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    std::vector<float> out[2];
    for (int with : {0, 1}) {
      LinearCase c = make_case(Quantization::nvfp4);
      Linear lin("test", c.in, c.out, ops::cpu());
      std::optional<SourceAmax> amax = lin.source_amax_request(c.step, c.tokens);
      ASSERT_TRUE(amax.has_value());
      EXPECT_TRUE(amax->rht);
      EXPECT_FALSE(lin.gradient_amax_request().has_value());  // no forward yet
      if (with) cpu::gather_source_amax(c.x.data(), c.in, 0, c.tokens, *amax);
      std::vector<float> y(c.tokens * c.out), dx(c.tokens * c.in), dw(c.out * c.in, 0.0f);
      lin.forward(c.step, c.x.data(), c.tokens, c.w.data(), y.data(), with ? &*amax : nullptr);
      // dgrad's dY (SR) and wgrad's dY^T (RHT + SR): the gradient's request.
      std::optional<SourceAmax> dy_amax = lin.gradient_amax_request();
      ASSERT_TRUE(dy_amax.has_value());
      EXPECT_TRUE(dy_amax->rht);
      if (with) cpu::gather_source_amax(c.dy.data(), c.out, 0, c.tokens, *dy_amax);
      lin.backward(c.dy.data(), c.w.data(), dx.data(), dw.data(), with ? &*dy_amax : nullptr);
      out[with] = y;
      out[with].insert(out[with].end(), dx.begin(), dx.end());
      out[with].insert(out[with].end(), dw.begin(), dw.end());
    }
    EXPECT_EQ(out[0], out[1]) << threads << " threads";
  }
  omp_set_num_threads(2);
  // Not asked for: evaluation (nothing saved for wgrad), other formats, row-scaled activations,
  // a token count the RHT's 16-token blocks do not divide.
  LinearCase c = make_case(Quantization::nvfp4);
  Linear lin("test", c.in, c.out, ops::cpu());
  EXPECT_FALSE(lin.source_amax_request(c.step, 40).has_value());
  for (Quantization q : {Quantization::bf16, Quantization::mxfp4}) {  // no gradient request either
    LinearCase o = make_case(q);
    Linear other("test", o.in, o.out, ops::cpu());
    std::vector<float> y(o.tokens * o.out);
    other.forward(o.step, o.x.data(), o.tokens, o.w.data(), y.data());
    EXPECT_FALSE(other.gradient_amax_request().has_value()) << to_string(q);
  }
  c.step.save_for_backward = false;
  EXPECT_FALSE(lin.source_amax_request(c.step, c.tokens).has_value());
  for (Quantization q : {Quantization::none, Quantization::bf16, Quantization::mxfp4, Quantization::fp8})
    EXPECT_FALSE(lin.source_amax_request(make_case(q).step, c.tokens).has_value()) << to_string(q);
  Nvfp4Knobs row_scaled;
  row_scaled.rht = false, row_scaled.row_scaled_activations = true;
  LinearCase r = make_case(Quantization::nvfp4);
  r.step.recipe = Recipe::operands(Quantization::nvfp4, row_scaled);
  EXPECT_FALSE(lin.source_amax_request(r.step, r.tokens).has_value());
  Nvfp4Knobs no_rht;
  no_rht.rht = false;
  r.step.recipe = Recipe::operands(Quantization::nvfp4, no_rht);
  ASSERT_TRUE(lin.source_amax_request(r.step, 40).has_value());  // without the RHT any token count
  EXPECT_FALSE(lin.source_amax_request(r.step, 40)->rht);
}

// ---- precision_map ------------------------------------------------------------------------------

namespace {
const std::vector<LinearShape> kBlock = {{"qkv", 128, 384}, {"attn_out", 128, 128}, {"gate_up", 128, 704}, {"down", 352, 128}};

std::string refusal(const std::string& text, int layers = 4, int64_t tokens = 768) {
  try {
    Recipe r(parse_recipe(text), layers, kBlock, tokens, ops::cpu());
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(accepted)";
}

Quantization module_quantization(const Recipe& r, const std::string& name) {
  for (const ModulePrecision& m : r.modules())
    if (m.name == name) return m.quantization;
  ADD_FAILURE() << "no module " << name;
  return Quantization::none;
}
}  // namespace

TEST(PrecisionMap, PatternsMatchWholeNamesWithNumberRanges) {
  EXPECT_TRUE(module_pattern_matches("block*.qkv", "block0.qkv"));
  EXPECT_TRUE(module_pattern_matches("block*.qkv", "block11.qkv"));
  EXPECT_FALSE(module_pattern_matches("block*.qkv", "block0.qkv2"));
  EXPECT_FALSE(module_pattern_matches("block*.qkv", "block0.down"));
  EXPECT_TRUE(module_pattern_matches("*", "lm_head"));
  EXPECT_TRUE(module_pattern_matches("*.down", "block3.down"));
  EXPECT_TRUE(module_pattern_matches("block?.down", "block3.down"));
  EXPECT_FALSE(module_pattern_matches("block?.down", "block13.down"));
  // [A-B] is a number, not a character class: block[0-1] is blocks 0 and 1, never block10.
  EXPECT_TRUE(module_pattern_matches("block[0-1].*", "block1.gate_up"));
  EXPECT_FALSE(module_pattern_matches("block[0-1].*", "block10.gate_up"));
  EXPECT_FALSE(module_pattern_matches("block[0-1].*", "block2.gate_up"));
  EXPECT_TRUE(module_pattern_matches("block[8-11].*", "block10.qkv"));
  EXPECT_FALSE(module_pattern_matches("block[8-11].*", "block7.qkv"));
  EXPECT_TRUE(module_pattern_matches("block[3].*", "block3.qkv"));
  EXPECT_FALSE(module_pattern_matches("block[3].*", "block.qkv"));
  EXPECT_TRUE(module_pattern_matches("lm_head", "lm_head"));
  EXPECT_FALSE(module_pattern_matches("lm_hea", "lm_head"));
}

TEST(PrecisionMap, TextFormParsesPrintsBackAndRefusesMalformedRules) {
  const auto rules = parse_precision_map("block*.qkv=bf16; block[0-1].*=nvfp4 lm_head=bf16");
  ASSERT_EQ(rules.size(), 3u);
  EXPECT_EQ(rules[1], (PrecisionRule{"block[0-1].*", Quantization::nvfp4}));
  EXPECT_EQ(precision_map_text(rules), "block*.qkv=bf16; block[0-1].*=nvfp4; lm_head=bf16");
  EXPECT_EQ(parse_precision_map(precision_map_text(rules)), rules);
  auto error_of = [](const std::string& text) {
    try {
      parse_precision_map(text);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_TRUE(error_of("block*.qkv").find("is not PATTERN=QUANTIZATION") != std::string::npos) << error_of("block*.qkv");
  EXPECT_TRUE(error_of("block*.qkv=fp4").find("quantization=fp4 is unknown") != std::string::npos);
  EXPECT_TRUE(error_of("block[0-1.qkv=bf16").find("opens a [ it does not close") != std::string::npos);
  EXPECT_TRUE(error_of("block[3-1].*=bf16").find("write [1-3]") != std::string::npos) << error_of("block[3-1].*=bf16");
  EXPECT_TRUE(error_of("block[a-b].*=bf16").find("is not a number range") != std::string::npos);
  EXPECT_TRUE(error_of("block1].*=bf16").find("closes a ] it did not open") != std::string::npos);
  EXPECT_TRUE(error_of("=bf16").find("empty pattern") != std::string::npos);
  EXPECT_TRUE(error_of("*.qkv=bf16; *.qkv=nvfp4").find("gives the pattern '*.qkv' twice") != std::string::npos);
}

// First match wins: the rules, then the nvfp4.bf16_first/last_layers rules, then `quantization`.
TEST(PrecisionMap, ResolvesEachModuleByTheFirstMatchingRule) {
  const Recipe r(parse_recipe("quantization=nvfp4 nvfp4.bf16_first_layers=1 nvfp4.bf16_last_layers=1 "
                              "precision_map=block*.qkv=bf16;block0.down=nvfp4;lm_head=bf16"),
                 4, kBlock, 768, ops::cpu());
  ASSERT_EQ(r.modules().size(), 4u * 4u + 1u);
  EXPECT_EQ(module_quantization(r, "block0.qkv"), Quantization::bf16);     // rule 1
  EXPECT_EQ(module_quantization(r, "block0.down"), Quantization::nvfp4);   // rule 2, before the first-layers rule
  EXPECT_EQ(module_quantization(r, "block0.attn_out"), Quantization::bf16);  // nvfp4.bf16_first_layers
  EXPECT_EQ(module_quantization(r, "block1.attn_out"), Quantization::nvfp4);  // quantization
  EXPECT_EQ(module_quantization(r, "block2.qkv"), Quantization::bf16);
  EXPECT_EQ(module_quantization(r, "block3.gate_up"), Quantization::bf16);  // nvfp4.bf16_last_layers
  EXPECT_TRUE(r.lm_head_bf16());
  EXPECT_EQ(r.modules()[0].decided_by, "precision_map rule 1 (block*.qkv)");
  EXPECT_EQ(r.modules()[1].decided_by, "nvfp4.bf16_first_layers");
  EXPECT_EQ(r.modules()[5].decided_by, "quantization");
  // What each GEMM runs: linear 3 (down) of block 0 quantized, linear 0 (qkv) of block 1 in BF16.
  for (GemmRole role : kGemmRoles) {
    EXPECT_EQ(r.for_linear(0, 3, 0.0)[role].precision, GemmPrecision::quantized);
    EXPECT_EQ(r.for_linear(1, 0, 0.0)[role].precision, GemmPrecision::bf16);
    EXPECT_EQ(r.for_linear(1, 1, 0.0)[role].precision, GemmPrecision::quantized);
  }
  const Recipe plain(parse_recipe("quantization=nvfp4"), 4, kBlock, 768, ops::cpu());
  EXPECT_FALSE(plain.lm_head_bf16());
}

// The first/last-layer keys are shorthands for rules: the same recipe, GEMM for GEMM.
TEST(PrecisionMap, FirstAndLastLayerKeysAreShorthandsForRules) {
  const Recipe keys(parse_recipe("quantization=nvfp4 nvfp4.bf16_first_layers=1 nvfp4.bf16_last_layers=2"), 4, kBlock,
                    768, ops::cpu());
  const Recipe rules(parse_recipe("quantization=nvfp4 nvfp4.bf16_first_layers=0 nvfp4.bf16_last_layers=0 "
                                  "precision_map=block0.*=bf16;block[2-3].*=bf16"),
                     4, kBlock, 768, ops::cpu());
  const Recipe inverse(parse_recipe("quantization=bf16 precision_map=block1.*=nvfp4"), 4, kBlock, 768, ops::cpu());
  for (int l = 0; l < 4; ++l)
    for (int i = 0; i < 4; ++i)
      for (GemmRole role : kGemmRoles)
        for (const Recipe* other : {&rules, &inverse}) {
          const GemmRecipe a = keys.for_linear(l, i, 0.0)[role], b = other->for_linear(l, i, 0.0)[role];
          EXPECT_EQ(a.precision, b.precision) << l << " " << i;
          EXPECT_EQ(a.a.format, b.a.format);
          EXPECT_EQ(a.b.format, b.b.format);
          EXPECT_EQ(a.a.rounding, b.a.rounding);
          EXPECT_EQ(a.a.rht, b.a.rht);
          EXPECT_EQ(a.b.tile_16x16, b.b.tile_16x16);
          EXPECT_EQ(a.summation, b.summation);
        }
}

// precision_switch_at moves the quantized linears of a map to BF16 and leaves the others as they are.
TEST(PrecisionMap, PrecisionSwitchAppliesToTheQuantizedModules) {
  const Recipe r(parse_recipe("quantization=none precision_map=block1.*=nvfp4 precision_switch_at=0.5 "
                              "precision_switch_scope=forward"),
                 4, kBlock, 768, ops::cpu());
  EXPECT_EQ(r.for_linear(1, 2, 0.4).fprop.precision, GemmPrecision::quantized);
  EXPECT_EQ(r.for_linear(1, 2, 0.5).fprop.precision, GemmPrecision::bf16);
  EXPECT_EQ(r.for_linear(1, 2, 0.5).wgrad.precision, GemmPrecision::quantized);
  EXPECT_EQ(r.for_linear(0, 2, 0.5).fprop.precision, GemmPrecision::fp32);
  EXPECT_EQ(r.for_linear(0, 2, 0.0).fprop.precision, GemmPrecision::fp32);
}

TEST(PrecisionMap, RefusesRulesThatDecideNothingAndKnobsForRecipesNotInUse) {
  EXPECT_NE(refusal("quantization=nvfp4 precision_map=block*.attention=bf16").find(
                "rule 1 'block*.attention' matches no module: the modules are block0-3.{qkv,attn_out,gate_up,down} and lm_head"),
            std::string::npos)
      << refusal("quantization=nvfp4 precision_map=block*.attention=bf16");
  EXPECT_NE(refusal("quantization=nvfp4 precision_map=block[4-7].*=bf16").find("matches no module"), std::string::npos);
  EXPECT_NE(refusal("quantization=nvfp4 precision_map=block*=bf16;block0.qkv=nvfp4")
                .find("rule 2 'block0.qkv' never applies: every module it matches is taken by rule 1 'block*'"),
            std::string::npos);
  EXPECT_NE(refusal("quantization=bf16 precision_map=*=nvfp4").find("matches lm_head, which runs in fp32 or bf16 only"),
            std::string::npos);
  EXPECT_NE(refusal("quantization=bf16 precision_map=block*.down=mxfp8 nvfp4.rht=false")
                .find("no linear runs in NVFP4 under quantization=bf16 and the precision_map"),
            std::string::npos);
  EXPECT_EQ(refusal("quantization=bf16 precision_map=block*.down=nvfp4 nvfp4.rht=false"), "(accepted)");
  EXPECT_NE(refusal("quantization=bf16 precision_map=lm_head=bf16 precision_switch_at=0.5").find("no linear is quantized"),
            std::string::npos);
  EXPECT_NE(refusal("quantization=bf16 precision_map=block*.down=mxfp8 gemm_summation=block_exact")
                .find("or drop gemm_summation"),
            std::string::npos);
  // Block sizes are checked for the quantization each linear runs in.
  EXPECT_NE(refusal("quantization=nvfp4 precision_map=block*.qkv=mxfp4", 4, 784).find("multiple of 32"), std::string::npos);
  EXPECT_EQ(refusal("quantization=nvfp4 precision_map=block*.qkv=mxfp4", 4, 768), "(accepted)");
}
