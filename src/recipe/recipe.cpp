#include "recipe/recipe.h"

#include <charconv>
#include <cmath>
#include <string>


namespace nibble {

namespace {
// The operand format whose GEMM kernels decide what gemm_summation=auto resolves to.
Format gemm_format(Quantization q) {
  return q == Quantization::fp8 ? Format::fp8_e4m3 : q == Quantization::mxfp4 ? Format::mxfp4 : Format::nvfp4;
}

constexpr std::string_view kQuantizationNames = "none, bf16, fp8, mxfp8, mxfp4, nvfp4";

bool parse_bool(std::string_view key, std::string_view v) {
  if (v == "true" || v == "1" || v == "on" || v == "yes") return true;
  if (v == "false" || v == "0" || v == "off" || v == "no") return false;
  throw UsageError(std::string(key) + "=" + std::string(v) + " is not a boolean: write true or false");
}

int parse_int(std::string_view key, std::string_view v) {
  int out = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || end != v.data() + v.size())
    throw UsageError(std::string(key) + "=" + std::string(v) + " is not an integer");
  return out;
}

double parse_double(std::string_view key, std::string_view v) {
  std::string s(v);
  char* end = nullptr;
  double out = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(out))
    throw UsageError(std::string(key) + "=" + s + " is not a finite number");
  return out;
}

QuantOptions options(Format f, Rounding r = Rounding::nearest) {
  QuantOptions o;
  o.format = f;
  o.rounding = r;
  return o;
}

GemmRecipe quantized(QuantOptions a, QuantOptions b) { return {GemmPrecision::quantized, a, b}; }

// Mixes 64 bits (splitmix64's finaliser): consecutive inputs give unrelated outputs.
uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

std::string_view to_string(Quantization q) {
  switch (q) {
    case Quantization::none: return "none";
    case Quantization::bf16: return "bf16";
    case Quantization::fp8: return "fp8";
    case Quantization::mxfp8: return "mxfp8";
    case Quantization::mxfp4: return "mxfp4";
    case Quantization::nvfp4: return "nvfp4";
  }
  return "?";
}

Quantization parse_quantization(std::string_view s) {
  for (Quantization q : {Quantization::none, Quantization::bf16, Quantization::fp8, Quantization::mxfp8,
                         Quantization::mxfp4, Quantization::nvfp4})
    if (s == to_string(q)) return q;
  if (s == "fp32") return Quantization::none;
  throw UsageError("quantization=" + std::string(s) + " is unknown: use one of " + std::string(kQuantizationNames));
}

std::string_view to_string(GemmRole r) {
  switch (r) {
    case GemmRole::fprop: return "fprop";
    case GemmRole::dgrad: return "dgrad";
    case GemmRole::wgrad: return "wgrad";
  }
  return "?";
}

std::string_view to_string(GemmPrecision p) {
  switch (p) {
    case GemmPrecision::fp32: return "fp32";
    case GemmPrecision::bf16: return "bf16";
    case GemmPrecision::quantized: return "quantized";
  }
  return "?";
}

std::string_view to_string(GemmSummation s) {
  switch (s) {
    case GemmSummation::automatic: return "auto";
    case GemmSummation::block_exact: return "block_exact";
    case GemmSummation::fp32_products: return "fp32_products";
  }
  return "?";
}

const GemmRecipe& LinearRecipe::operator[](GemmRole r) const {
  return r == GemmRole::fprop ? fprop : r == GemmRole::dgrad ? dgrad : wgrad;
}
GemmRecipe& LinearRecipe::operator[](GemmRole r) {
  return r == GemmRole::fprop ? fprop : r == GemmRole::dgrad ? dgrad : wgrad;
}

bool LinearRecipe::weight_shared_by_fprop_and_dgrad() const {
  return fprop.precision == GemmPrecision::quantized && dgrad.precision == GemmPrecision::quantized &&
         fprop.b.format == Format::nvfp4 && fprop.b.tile_16x16 && dgrad.b.tile_16x16 &&
         fprop.b.four_over_six == dgrad.b.four_over_six && fprop.b.four_over_six_error == dgrad.b.four_over_six_error &&
         fprop.b.four_over_six_e4m3_max == dgrad.b.four_over_six_e4m3_max && !fprop.b.rht && !dgrad.b.rht &&
         fprop.b.rounding == Rounding::nearest && dgrad.b.rounding == Rounding::nearest;
}

bool apply_recipe_option(RecipeConfig& c, std::string_view key, std::string_view value) {
  if (key == "quantization") {
    c.quantization = parse_quantization(value);
  } else if (key == "precision_switch_at") {
    c.precision_switch_at = parse_double(key, value);
  } else if (key == "gemm_summation") {
    if (value == "auto") {
      c.gemm_summation = GemmSummation::automatic;
    } else if (value == "block_exact") {
      c.gemm_summation = GemmSummation::block_exact;
    } else if (value == "fp32_products") {
      c.gemm_summation = GemmSummation::fp32_products;
    } else {
      throw UsageError("gemm_summation=" + std::string(value) +
                       " is unknown: use auto, block_exact (each 16-block product exact, one FP32 rounding per "
                       "block) or fp32_products (BF16-decoded operands, FP32 accumulation; AMX-BF16 CPUs)");
    }
    // `auto` is the default and what a resolved config writes back: not a request to refuse.
    c.gemm_summation_given = c.gemm_summation != GemmSummation::automatic;
  } else if (key == "attention") {
    if (value == "auto") {
      c.attention = AttentionPrecision::automatic;
    } else if (value == "fp32") {
      c.attention = AttentionPrecision::fp32;
    } else if (value == "bf16") {
      c.attention = AttentionPrecision::bf16;
    } else {
      throw UsageError("attention=" + std::string(value) +
                       " is unknown: use auto (bf16 for every quantization but none), fp32 or bf16");
    }
  } else if (key == "nvfp4.rht") {
    c.nvfp4.rht = parse_bool(key, value);
  } else if (key == "nvfp4.stochastic_rounding") {
    c.nvfp4.stochastic_rounding = parse_bool(key, value);
  } else if (key == "nvfp4.weight_2d") {
    c.nvfp4.weight_2d = parse_bool(key, value);
  } else if (key == "nvfp4.four_over_six") {
    c.nvfp4.four_over_six = parse_bool(key, value);
  } else if (key == "nvfp4.four_over_six_error") {
    c.nvfp4.four_over_six_error = parse_four_over_six_error(value, "nvfp4.four_over_six_error");
  } else if (key == "nvfp4.four_over_six_e4m3_max") {
    c.nvfp4.four_over_six_e4m3_max = parse_four_over_six_e4m3_max(value, "nvfp4.four_over_six_e4m3_max");
  } else if (key == "nvfp4.bf16_first_layers") {
    c.nvfp4.bf16_first_layers = parse_int(key, value);
  } else if (key == "nvfp4.bf16_last_layers") {
    c.nvfp4.bf16_last_layers = parse_int(key, value);
  } else if (key.starts_with("nvfp4.")) {
    throw UsageError("unknown recipe key '" + std::string(key) +
                     "': the nvfp4 knobs are nvfp4.rht, nvfp4.stochastic_rounding, nvfp4.weight_2d, "
                     "nvfp4.four_over_six, nvfp4.four_over_six_error, nvfp4.four_over_six_e4m3_max, "
                     "nvfp4.bf16_first_layers, nvfp4.bf16_last_layers");
  } else {
    return false;
  }
  if (key.starts_with("nvfp4.")) c.nvfp4_knobs_given = true;
  return true;
}

RecipeConfig parse_recipe(std::string_view text) {
  RecipeConfig c;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (text[i] == ' ' || text[i] == ',' || text[i] == '\t' || text[i] == '\n')) ++i;
    size_t j = i;
    while (j < text.size() && text[j] != ' ' && text[j] != ',' && text[j] != '\t' && text[j] != '\n') ++j;
    if (j == i) break;
    std::string_view pair = text.substr(i, j - i);
    size_t eq = pair.find('=');
    if (eq == std::string_view::npos)
      throw UsageError("'" + std::string(pair) + "' is not key=value (example: quantization=nvfp4)");
    if (!apply_recipe_option(c, pair.substr(0, eq), pair.substr(eq + 1)))
      throw UsageError("unknown recipe key '" + std::string(pair.substr(0, eq)) +
                       "': use quantization, precision_switch_at, gemm_summation, attention or nvfp4.*");
    i = j;
  }
  return c;
}

std::string describe(const RecipeConfig& c) {
  std::string s = "quantization=" + std::string(to_string(c.quantization));
  if (c.quantization == Quantization::nvfp4) {
    auto b = [](bool v) { return v ? "true" : "false"; };
    auto layers = [](int n) { return n < 0 ? std::string("auto") : std::to_string(n); };
    s += std::string(" nvfp4.rht=") + b(c.nvfp4.rht) + " nvfp4.stochastic_rounding=" + b(c.nvfp4.stochastic_rounding) +
         " nvfp4.weight_2d=" + b(c.nvfp4.weight_2d) + " nvfp4.four_over_six=" + b(c.nvfp4.four_over_six) +
         (c.nvfp4.four_over_six ? " nvfp4.four_over_six_error=" + std::string(to_string(c.nvfp4.four_over_six_error)) +
                                      " nvfp4.four_over_six_e4m3_max=" + std::to_string(c.nvfp4.four_over_six_e4m3_max)
                                : std::string()) +
         " nvfp4.bf16_first_layers=" + layers(c.nvfp4.bf16_first_layers) +
         " nvfp4.bf16_last_layers=" + layers(c.nvfp4.bf16_last_layers) +
         " gemm_summation=" + std::string(to_string(c.gemm_summation));
  }
  if (c.precision_switch_at < 1.0) s += " precision_switch_at=" + std::to_string(c.precision_switch_at);
  if (c.attention != AttentionPrecision::automatic)
    s += c.attention == AttentionPrecision::bf16 ? " attention=bf16" : " attention=fp32";
  return s;
}

LinearRecipe Recipe::operands(Quantization q, const Nvfp4Knobs& k) {
  LinearRecipe r;
  switch (q) {
    case Quantization::none:
      r.fprop.precision = r.dgrad.precision = r.wgrad.precision = GemmPrecision::fp32;
      break;
    case Quantization::bf16:
      r.fprop.precision = r.dgrad.precision = r.wgrad.precision = GemmPrecision::bf16;
      break;
    case Quantization::fp8: {
      // Per-tensor current scaling: E4M3 for what the forward pass sees, E5M2 for gradients.
      QuantOptions fwd = options(Format::fp8_e4m3), grad = options(Format::fp8_e5m2);
      r.fprop = quantized(fwd, fwd);
      r.dgrad = quantized(grad, fwd);
      r.wgrad = quantized(grad, fwd);
      break;
    }
    case Quantization::mxfp8: {
      // Transformer Engine's MXFP8 recipe: E4M3 elements with 1x32 E8M0 scales for all operands.
      QuantOptions o = options(Format::mxfp8);
      r.fprop = r.dgrad = r.wgrad = quantized(o, o);
      break;
    }
    case Quantization::mxfp4: {
      // The NVFP4 recipe's roles in MXFP4 (no RHT, no 2D tiles exist for it): RN forward, SR gradients.
      QuantOptions rn = options(Format::mxfp4), sr = options(Format::mxfp4, Rounding::stochastic);
      r.fprop = quantized(rn, rn);
      r.dgrad = quantized(sr, rn);
      r.wgrad = quantized(sr, rn);
      break;
    }
    case Quantization::nvfp4: {
      // Spec section 5.
      QuantOptions x = options(Format::nvfp4);
      x.four_over_six = k.four_over_six;
      if (k.four_over_six) {
        x.four_over_six_error = k.four_over_six_error;
        x.four_over_six_e4m3_max = k.four_over_six_e4m3_max;
      }
      QuantOptions w = x;
      w.tile_16x16 = k.weight_2d;
      QuantOptions dy = x;
      dy.rounding = k.stochastic_rounding ? Rounding::stochastic : Rounding::nearest;
      QuantOptions dyt = dy, xt = x;
      dyt.rht = xt.rht = k.rht;
      r.fprop = quantized(x, w);
      r.dgrad = quantized(dy, w);
      r.wgrad = quantized(dyt, xt);
      break;
    }
  }
  return r;
}

Recipe::Recipe(const RecipeConfig& config, int layers, const std::vector<LinearShape>& linears,
               int64_t tokens_per_micro_batch, const ops::TensorOps& ops)
    : config_(config), ops_(&ops), layers_(layers) {
  if (layers <= 0) throw UsageError("the model has " + std::to_string(layers) + " layers: it needs at least 1");
  const auto q = config.quantization;
  if (config.nvfp4_knobs_given && q != Quantization::nvfp4)
    throw UsageError("nvfp4.* knobs were given but quantization=" + std::string(to_string(q)) +
                     ": set quantization=nvfp4 or drop the nvfp4.* keys");
  if (!(config.precision_switch_at >= 0.0 && config.precision_switch_at <= 1.0))
    throw UsageError("precision_switch_at=" + std::to_string(config.precision_switch_at) +
                     " is outside [0, 1]: it is the fraction of training after which all GEMMs run in BF16 "
                     "(1 = never switch)");
  if (config.precision_switch_at < 1.0 && (q == Quantization::none || q == Quantization::bf16))
    throw UsageError("precision_switch_at applies to quantized recipes, not quantization=" +
                     std::string(to_string(q)) + ": drop it or choose fp8/mxfp8/mxfp4/nvfp4");
  attention_bf16_ = config.attention == AttentionPrecision::bf16 ||
                    (config.attention == AttentionPrecision::automatic && q != Quantization::none);
  if (config.gemm_summation_given && q != Quantization::nvfp4 && q != Quantization::mxfp4 && q != Quantization::fp8)
    throw UsageError("gemm_summation chooses how NVFP4, MXFP4 and FP8 GEMMs sum, but quantization=" +
                     std::string(to_string(q)) + ": set one of those or drop gemm_summation");
  if (config.gemm_summation == GemmSummation::block_exact && !ops.block_exact_available())
    throw UsageError("gemm_summation=block_exact (exact 16-element block products) is a CPU summation; this backend (" +
                     ops.describe() + ") sums in FP32 on its tensor cores: use gemm_summation=auto or fp32_products");
  if (config.gemm_summation == GemmSummation::fp32_products || !ops.block_exact_available() ||
      (config.gemm_summation == GemmSummation::automatic && ops.fp32_products_available(gemm_format(q))))
    summation_ = ops::Summation::fp32_products;
  if (q == Quantization::nvfp4) {
    const auto& k = config.nvfp4;
    bf16_first_ = k.bf16_first_layers >= 0 ? k.bf16_first_layers
                                           : static_cast<int>(std::lround(2.0 / 62.0 * layers));
    bf16_last_ = k.bf16_last_layers >= 0 ? k.bf16_last_layers
                                         : std::max(1, static_cast<int>(std::lround(8.0 / 62.0 * layers)));
    if (!k.four_over_six && (k.four_over_six_error != FourOverSixError::mae || k.four_over_six_e4m3_max != 448))
      throw UsageError("nvfp4.four_over_six_error=" + std::string(to_string(k.four_over_six_error)) +
                       " / nvfp4.four_over_six_e4m3_max=" + std::to_string(k.four_over_six_e4m3_max) +
                       " apply only with nvfp4.four_over_six=true: set it or drop them");
    if (k.bf16_first_layers < -1 || k.bf16_last_layers < -1)
      throw UsageError("nvfp4.bf16_first_layers/bf16_last_layers must be >= 0 (got " +
                       std::to_string(k.bf16_first_layers) + ", " + std::to_string(k.bf16_last_layers) + ")");
    if (bf16_first_ + bf16_last_ >= layers) {
      if (k.bf16_first_layers < 0 && k.bf16_last_layers < 0) {
        bf16_first_ = 0;
        bf16_last_ = layers > 1 ? 1 : 0;  // the default never leaves a small model without NVFP4 layers
      } else {
        throw UsageError("nvfp4.bf16_first_layers=" + std::to_string(bf16_first_) + " plus nvfp4.bf16_last_layers=" +
                         std::to_string(bf16_last_) + " covers all " + std::to_string(layers) +
                         " layers, leaving none in NVFP4: lower them or use quantization=bf16");
      }
    }
  }
  if (q == Quantization::none || q == Quantization::bf16) return;
  // Block sizes along each GEMM's reduction dimension: in (fprop), out (dgrad), tokens (wgrad).
  const int64_t block = q == Quantization::nvfp4 ? 16 : (q == Quantization::mxfp4 || q == Quantization::mxfp8) ? 32 : 1;
  const std::string qs(to_string(q));
  if (tokens_per_micro_batch % block != 0)
    throw UsageError("quantization=" + qs + " quantizes the weight-gradient operands along the tokens in blocks of " +
                     std::to_string(block) + ", but a micro-batch has " + std::to_string(tokens_per_micro_batch) +
                     " tokens (batch x context): make it a multiple of " + std::to_string(block));
  for (const auto& l : linears) {
    for (int64_t dim : {l.in_features, l.out_features})
      if (dim % block != 0)
        throw UsageError("quantization=" + qs + " needs every linear dimension to be a multiple of its block size " +
                         std::to_string(block) + ", but " + l.name + " is " + std::to_string(l.out_features) + " x " +
                         std::to_string(l.in_features) + ": change the model width/hidden size");
  }
}

LinearRecipe Recipe::for_layer(int layer, double progress) const {
  NIBBLE_CHECK(layer >= 0 && layer < layers_, "Recipe::for_layer(%d) of a %d-layer model", layer, layers_);
  Quantization q = config_.quantization;
  bool quantized = q != Quantization::none && q != Quantization::bf16;
  if (quantized && progress >= config_.precision_switch_at && config_.precision_switch_at < 1.0) q = Quantization::bf16;
  if (q == Quantization::nvfp4 && (layer < bf16_first_ || layer >= layers_ - bf16_last_)) q = Quantization::bf16;
  LinearRecipe r = operands(q, config_.nvfp4);
  for (GemmRole role : kGemmRoles) r[role].summation = summation_;
  return r;
}

std::string describe_kernels(const Recipe& recipe) {
  const Quantization q = recipe.config().quantization;
  std::string s;
  if (q == Quantization::nvfp4 || q == Quantization::mxfp4 || q == Quantization::fp8)
    s += recipe.ops().describe_summation(gemm_format(q), recipe.summation()) + "; ";
  s += recipe.attention_bf16() ? "attention products in BF16" : "attention products in FP32";
  return s;
}

uint64_t sr_seed(uint64_t run_seed, int64_t step, int layer, int linear, GemmRole role, int operand) {
  uint64_t h = mix64(run_seed);
  h = mix64(h ^ static_cast<uint64_t>(step));
  h = mix64(h ^ (static_cast<uint64_t>(layer) << 16 | static_cast<uint64_t>(linear) << 8 |
                 static_cast<uint64_t>(role) << 2 | static_cast<uint64_t>(operand)));
  return h;
}

}  // namespace nibble
