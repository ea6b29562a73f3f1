#include "recipe/recipe.h"


#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>

#include "common/hash.h"
#include "common/shortest_decimal.h"

namespace nibble {

namespace {
// The operand format whose GEMM kernels decide what gemm_summation=auto resolves to.
Format gemm_format(Quantization q) {
  return q == Quantization::fp8 ? Format::fp8_e4m3 : q == Quantization::mxfp4 ? Format::mxfp4 : Format::nvfp4;
}

// The quantizations whose GEMMs gemm_summation chooses the summation of.
bool has_gemm_summation(Quantization q) {
  return q == Quantization::nvfp4 || q == Quantization::mxfp4 || q == Quantization::fp8;
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
  if (ec == std::errc::result_out_of_range && end == v.data() + v.size())
    throw UsageError(std::string(key) + "=" + std::string(v) + " is out of range: more layers than a model can have");
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

std::string_view to_string(SwitchScope s) { return s == SwitchScope::forward ? "forward" : "all"; }

std::string_view to_string(AttentionPrecision a) {
  switch (a) {
    case AttentionPrecision::automatic: return "auto";
    case AttentionPrecision::fp32: return "fp32";
    case AttentionPrecision::bf16: return "bf16";
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

namespace {

GemmSummation parse_gemm_summation(std::string_view value) {
  for (GemmSummation s : {GemmSummation::automatic, GemmSummation::block_exact, GemmSummation::fp32_products})
    if (value == to_string(s)) return s;
  throw UsageError("gemm_summation=" + std::string(value) +
                   " is unknown: use auto, block_exact (each 16-block product exact, one FP32 rounding per "
                   "block) or fp32_products (BF16-decoded operands, FP32 accumulation; AMX-BF16 CPUs)");
}

SwitchScope parse_switch_scope(std::string_view value) {
  for (SwitchScope s : {SwitchScope::all, SwitchScope::forward})
    if (value == to_string(s)) return s;
  throw UsageError("precision_switch_scope=" + std::string(value) +
                   " is unknown: use all (every GEMM switches to BF16) or forward (only the forward GEMMs switch; "
                   "the backward keeps the recipe)");
}

AttentionPrecision parse_attention(std::string_view value) {
  for (AttentionPrecision a : {AttentionPrecision::automatic, AttentionPrecision::fp32, AttentionPrecision::bf16})
    if (value == to_string(a)) return a;
  throw UsageError("attention=" + std::string(value) +
                   " is unknown: use auto (bf16 for every quantization but none), fp32 or bf16");
}

std::string boolean_text(bool b) { return b ? "true" : "false"; }

bool always_printed(const RecipeConfig&) { return true; }
// Only where it means something (or was set to where it does not, which the recipe then refuses).
bool switch_scope_printed(const RecipeConfig& c) {
  return c.precision_switch_at < 1.0 || c.precision_switch_scope != SwitchScope::all;
}
bool map_uses_nvfp4(const RecipeConfig& c) {
  return std::any_of(c.precision_map.begin(), c.precision_map.end(),
                     [](const PrecisionRule& r) { return r.quantization == Quantization::nvfp4; });
}
bool nvfp4_knob_printed(const RecipeConfig& c) {
  return c.quantization == Quantization::nvfp4 || c.nvfp4_knobs_given || map_uses_nvfp4(c);
}
// The two Four Over Six knobs: only with four_over_six on (or set to other than the defaults, which
// the recipe then refuses).
bool four_over_six_knob_printed(const RecipeConfig& c) {
  return nvfp4_knob_printed(c) && (c.nvfp4.four_over_six || c.nvfp4.four_over_six_error != FourOverSixError::mae ||
                                   c.nvfp4.four_over_six_e4m3_max != 448);
}

// Rows for the nvfp4 knobs that are a plain bool or int member of Nvfp4Knobs.
template <bool Nvfp4Knobs::*knob>
constexpr RecipeKey bool_knob(std::string_view name, std::string_view help) {
  return {name, KeyValueKind::boolean, help,
          [](RecipeConfig& c, std::string_view k, std::string_view v) { c.nvfp4.*knob = parse_bool(k, v); },
          [](const RecipeConfig& c) { return boolean_text(c.nvfp4.*knob); }, nvfp4_knob_printed};
}
template <int Nvfp4Knobs::*knob>
constexpr RecipeKey int_knob(std::string_view name, std::string_view help) {
  return {name, KeyValueKind::integer, help,
          [](RecipeConfig& c, std::string_view k, std::string_view v) { c.nvfp4.*knob = parse_int(k, v); },
          [](const RecipeConfig& c) { return std::to_string(c.nvfp4.*knob); }, nvfp4_knob_printed};
}

using Config = RecipeConfig;
using Text = std::string_view;

constexpr RecipeKey kRecipeKeys[] = {
    {"quantization", KeyValueKind::text, "none, bf16, fp8, mxfp8, mxfp4 or nvfp4",
     [](Config& c, Text, Text v) { c.quantization = parse_quantization(v); },
     [](const Config& c) { return std::string(to_string(c.quantization)); }, always_printed},
    {"precision_switch_at", KeyValueKind::real, "fraction of training after which GEMMs run in BF16",
     [](Config& c, Text k, Text v) { c.precision_switch_at = parse_double(k, v); },
     [](const Config& c) { return shortest_decimal(c.precision_switch_at); }, always_printed},
    {"precision_switch_scope", KeyValueKind::text,
     "GEMMs precision_switch_at moves to BF16: all, or forward (fprop only; dgrad and wgrad keep the recipe)",
     [](Config& c, Text, Text v) { c.precision_switch_scope = parse_switch_scope(v); },
     [](const Config& c) { return std::string(to_string(c.precision_switch_scope)); }, switch_scope_printed},
    {"gemm_summation", KeyValueKind::text,
     "NVFP4/MXFP4/FP8 GEMM sums: auto, block_exact (each 16-block product exact) or fp32_products (AMX-BF16)",
     [](Config& c, Text, Text v) {
       c.gemm_summation = parse_gemm_summation(v);
       // `auto` is the default and what a resolved config writes back: not a request to refuse.
       c.gemm_summation_given = c.gemm_summation != GemmSummation::automatic;
     },
     [](const Config& c) { return std::string(to_string(c.gemm_summation)); }, always_printed},
    {"attention", KeyValueKind::text, "attention products: auto (bf16 unless quantization=none), fp32, bf16",
     [](Config& c, Text, Text v) { c.attention = parse_attention(v); },
     [](const Config& c) { return std::string(to_string(c.attention)); }, always_printed},
    {"precision_map", KeyValueKind::text,
     "per-module quantization, first match wins: \"block*.qkv=bf16; block[0-1].*=bf16; lm_head=bf16\" (YAML: a list of "
     "PATTERN: QUANTIZATION)",
     [](Config& c, Text, Text v) { c.precision_map = parse_precision_map(v); },
     [](const Config& c) { return precision_map_text(c.precision_map); },
     [](const Config& c) { return !c.precision_map.empty(); }},
    bool_knob<&Nvfp4Knobs::rht>("nvfp4.rht", "random Hadamard transform on wgrad operands"),
    bool_knob<&Nvfp4Knobs::stochastic_rounding>("nvfp4.stochastic_rounding", "stochastic rounding of gradients"),
    bool_knob<&Nvfp4Knobs::weight_2d>("nvfp4.weight_2d", "16x16 weight scale tiles"),
    bool_knob<&Nvfp4Knobs::four_over_six>(
        "nvfp4.four_over_six", "Four Over Six: per block (weights: per 16x16 tile) scale to 4 or 6, whichever errs less"),
    {"nvfp4.four_over_six_error", KeyValueKind::text,
     "with four_over_six: mae (sum of |error|, TE's default) or mse (sum of squares)",
     [](Config& c, Text k, Text v) { c.nvfp4.four_over_six_error = parse_four_over_six_error(v, k); },
     [](const Config& c) { return std::string(to_string(c.nvfp4.four_over_six_error)); }, four_over_six_knob_printed},
    {"nvfp4.four_over_six_e4m3_max", KeyValueKind::integer,
     "with four_over_six: E4M3 ceiling of the global scale, 448 (TE's default, 2688/amax) or 256 (the paper's, "
     "1536/amax)",
     [](Config& c, Text k, Text v) { c.nvfp4.four_over_six_e4m3_max = parse_four_over_six_e4m3_max(v, k); },
     [](const Config& c) { return std::to_string(c.nvfp4.four_over_six_e4m3_max); }, four_over_six_knob_printed},
    {"nvfp4.row_scaled_activations", KeyValueKind::boolean,
     "TE's row_scaled_activation: X (fprop) and X^T (wgrad) get one global scale per row; needs nvfp4.rht=false",
     [](Config& c, Text k, Text v) { c.nvfp4.row_scaled_activations = parse_bool(k, v); },
     [](const Config& c) { return boolean_text(c.nvfp4.row_scaled_activations); },
     // Written only when on, so configs saved before the key existed resume without a difference.
     [](const Config& c) { return nvfp4_knob_printed(c) && c.nvfp4.row_scaled_activations; }},
    int_knob<&Nvfp4Knobs::bf16_first_layers>("nvfp4.bf16_first_layers", "first blocks kept in BF16 (-1: paper's share)"),
    int_knob<&Nvfp4Knobs::bf16_last_layers>("nvfp4.bf16_last_layers", "last blocks kept in BF16 (-1: paper's share)"),
};

constexpr std::string_view kKnobPrefix = "nvfp4.";

// The recipe keys with (or without) the nvfp4. prefix, comma-separated, for refusal messages.
std::string key_names(bool knobs) {
  std::string out;
  for (const RecipeKey& k : kRecipeKeys)
    if (k.name.starts_with(kKnobPrefix) == knobs) out += (out.empty() ? "" : ", ") + std::string(k.name);
  return out;
}

}  // namespace

std::span<const RecipeKey> recipe_keys() { return kRecipeKeys; }

bool apply_recipe_option(RecipeConfig& c, std::string_view key, std::string_view value) {
  for (const RecipeKey& k : kRecipeKeys) {
    if (k.name != key) continue;
    k.parse(c, key, value);
    if (key.starts_with(kKnobPrefix)) c.nvfp4_knobs_given = true;
    return true;
  }
  if (key.starts_with(kKnobPrefix))
    throw UsageError("unknown recipe key '" + std::string(key) + "': the nvfp4 knobs are " + key_names(true));
  return false;
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
      throw UsageError("unknown recipe key '" + std::string(pair.substr(0, eq)) + "': use " + key_names(false) +
                       " or nvfp4.*");
    i = j;
  }
  return c;
}

std::string describe(const RecipeConfig& c) {
  std::string s = "quantization=" + std::string(to_string(c.quantization));
  if (!c.precision_map.empty()) s += " precision_map=\"" + precision_map_text(c.precision_map) + "\"";
  if (c.quantization == Quantization::nvfp4 || map_uses_nvfp4(c)) {
    auto b = [](bool v) { return v ? "true" : "false"; };
    auto layers = [](int n) { return n < 0 ? std::string("auto") : std::to_string(n); };
    s += std::string(" nvfp4.rht=") + b(c.nvfp4.rht) + " nvfp4.stochastic_rounding=" + b(c.nvfp4.stochastic_rounding) +
         " nvfp4.weight_2d=" + b(c.nvfp4.weight_2d) + " nvfp4.four_over_six=" + b(c.nvfp4.four_over_six) +
         (c.nvfp4.four_over_six ? " nvfp4.four_over_six_error=" + std::string(to_string(c.nvfp4.four_over_six_error)) +
                                      " nvfp4.four_over_six_e4m3_max=" + std::to_string(c.nvfp4.four_over_six_e4m3_max)
 : std::string()) +
         (c.nvfp4.row_scaled_activations ? " nvfp4.row_scaled_activations=true" : "") +
         " nvfp4.bf16_first_layers=" + layers(c.nvfp4.bf16_first_layers) +
         " nvfp4.bf16_last_layers=" + layers(c.nvfp4.bf16_last_layers) +
         " gemm_summation=" + std::string(to_string(c.gemm_summation));
  }
  if (c.precision_switch_at < 1.0)
    s += " precision_switch_at=" + shortest_decimal(c.precision_switch_at) +
         " precision_switch_scope=" + std::string(to_string(c.precision_switch_scope));
  if (c.attention != AttentionPrecision::automatic) s += " attention=" + std::string(to_string(c.attention));
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
      // TE's row_scaled_activation: the forward activation's quantizer is row-scaled in both its
      // usages, X for fprop (a global scale per token) and X^T for wgrad (per input feature).
      // Weights and gradients keep one per tensor.
      x.row_scaled = xt.row_scaled = k.row_scaled_activations;
      r.fprop = quantized(x, w);
      r.dgrad = quantized(dy, w);  // (dy was copied before x.row_scaled was set)
      r.wgrad = quantized(dyt, xt);
      break;
    }
  }
  return r;
}

namespace {

void check_four_over_six_knobs(const Nvfp4Knobs& k) {
  if (!k.four_over_six && (k.four_over_six_error != FourOverSixError::mae || k.four_over_six_e4m3_max != 448))
    throw UsageError("nvfp4.four_over_six_error=" + std::string(to_string(k.four_over_six_error)) +
                     " / nvfp4.four_over_six_e4m3_max=" + std::to_string(k.four_over_six_e4m3_max) +
                     " apply only with nvfp4.four_over_six=true: set it or drop them");
}

// The combinations Transformer Engine refuses with row_scaled_activation (NVFP4Quantizer: a
// row-scaled quantizer takes no RHT; its transposed, wgrad copy has no Four Over Six).
void check_row_scaled_activations(const Nvfp4Knobs& k) {
  if (!k.row_scaled_activations) return;
  if (k.rht)
    throw UsageError("nvfp4.row_scaled_activations=true does not combine with nvfp4.rht=true: X^T, the wgrad operand "
                     "the RHT transforms, is row-scaled too, and Transformer Engine's row-scaled quantizer refuses the "
                     "RHT; set nvfp4.rht=false");
  if (k.four_over_six)
    throw UsageError("nvfp4.row_scaled_activations=true does not combine with nvfp4.four_over_six=true: Transformer "
                     "Engine's row-scaled transposed quantization (X^T for wgrad) has no Four Over Six; drop one");
}

// The BF16 blocks of an nvfp4 recipe over `layers` blocks: {first, last}.
std::pair<int, int> nvfp4_bf16_layers(const Nvfp4Knobs& k, int layers) {
  int first = k.bf16_first_layers >= 0 ? k.bf16_first_layers : static_cast<int>(std::lround(2.0 / 62.0 * layers));
  int last = k.bf16_last_layers >= 0 ? k.bf16_last_layers
                                     : std::max(1, static_cast<int>(std::lround(8.0 / 62.0 * layers)));
  if (k.bf16_first_layers < -1 || k.bf16_last_layers < -1)
    throw UsageError("nvfp4.bf16_first_layers and nvfp4.bf16_last_layers must be >= 0, or -1 for the paper's share "
                     "(got " + std::to_string(k.bf16_first_layers) + ", " + std::to_string(k.bf16_last_layers) + ")");
  if (first + last >= layers) {
    if (k.bf16_first_layers >= 0 || k.bf16_last_layers >= 0)
      throw UsageError("nvfp4.bf16_first_layers=" + std::to_string(first) + " plus nvfp4.bf16_last_layers=" +
                       std::to_string(last) + " covers all " + std::to_string(layers) +
                       " layers, leaving none in NVFP4: lower them or use quantization=bf16");
    first = 0;
    last = layers > 1 ? 1 : 0;  // the default never leaves a small model without NVFP4 layers
  }
  return {first, last};
}

// Every GEMM of a quantized recipe needs its reduction dimension to be a whole number of blocks:
// in (fprop), out (dgrad), tokens (wgrad).
void check_block_sizes(Quantization q, const std::vector<LinearShape>& linears, int64_t tokens_per_micro_batch) {
  if (q == Quantization::none || q == Quantization::bf16) return;
  const int64_t block = q == Quantization::nvfp4 ? 16 : (q == Quantization::mxfp4 || q == Quantization::mxfp8) ? 32 : 1;
  const std::string qs(to_string(q));
  if (tokens_per_micro_batch % block != 0)
    throw UsageError("quantization=" + qs + " quantizes the weight-gradient operands along the tokens in blocks of " +
                     std::to_string(block) + ", but a micro-batch has " + std::to_string(tokens_per_micro_batch) +
                     " tokens (batch x seq): make it a multiple of " + std::to_string(block));
  for (const auto& l : linears) {
    for (int64_t dim : {l.in_features, l.out_features})
      if (dim % block != 0)
        throw UsageError("quantization=" + qs + " needs every linear dimension to be a multiple of its block size " +
                         std::to_string(block) + ", but " + l.name + " is " + std::to_string(l.out_features) + " x " +
                         std::to_string(l.in_features) + ": change model.width or model.mlp_hidden");
  }
}

}  // namespace

bool is_quantized(Quantization q) { return q != Quantization::none && q != Quantization::bf16; }

namespace {

std::string modules_named(const std::vector<ModulePrecision>& modules, int layers) {
  std::string linears;
  for (size_t i = 0; layers > 0 && i + 1 < modules.size() && modules[i].name.starts_with("block0."); ++i)
    linears += (linears.empty() ? "" : ",") + modules[i].name.substr(7);
  return "block0-" + std::to_string(layers - 1) + ".{" + linears + "} and lm_head";
}

// The recipe of the default `quantization` for what no rule matched.
std::pair<Quantization, std::string> unmatched_precision(const RecipeConfig& c, int layer, int layers, int first,
                                                         int last) {
  if (layer < 0) return {Quantization::none, "default (the LM head runs in FP32)"};
  if (c.quantization == Quantization::nvfp4 && layer < first) return {Quantization::bf16, "nvfp4.bf16_first_layers"};
  if (c.quantization == Quantization::nvfp4 && layer >= layers - last) return {Quantization::bf16, "nvfp4.bf16_last_layers"};
  return {c.quantization, "quantization"};
}

}  // namespace

void Recipe::resolve_modules(const std::vector<LinearShape>& linears) {
  const auto& rules = config_.precision_map;
  auto add = [&](const std::string& name, int layer, const LinearShape& shape) {
    int rule = -1;
    for (size_t i = 0; i < rules.size() && rule < 0; ++i)
      if (module_pattern_matches(rules[i].pattern, name)) rule = static_cast<int>(i);
    auto [q, by] = unmatched_precision(config_, layer, layers_, bf16_first_, bf16_last_);
    if (rule >= 0) {
      q = rules[static_cast<size_t>(rule)].quantization;
      by = "precision_map rule " + std::to_string(rule + 1) + " (" + rules[static_cast<size_t>(rule)].pattern + ")";
    }
    if (layer < 0 && is_quantized(q))
      throw UsageError("precision_map rule '" + rules[static_cast<size_t>(rule)].pattern + "=" +
                       std::string(to_string(q)) + "' matches lm_head, which runs in fp32 or bf16 only (Transformer "
                       "Engine and the NVFP4 paper keep the LM head in high precision): narrow the pattern (e.g. "
                       "block*) or put lm_head=bf16 before it");
    modules_.push_back({name, q, by, rule, shape.in_features, shape.out_features});
  };
  for (int l = 0; l < layers_; ++l)
    for (const LinearShape& shape : linears) add("block" + std::to_string(l) + "." + shape.name, l, shape);
  add("lm_head", -1, LinearShape{"lm_head", 0, 0});
}

// Every rule must decide some module: one that matches nothing is a typo, one whose every match an
// earlier rule took never applies.
void Recipe::check_rules_decide() {
  const auto& rules = config_.precision_map;
  for (size_t i = 0; i < rules.size(); ++i) {
    if (std::any_of(modules_.begin(), modules_.end(), [i](const ModulePrecision& m) { return m.rule == static_cast<int>(i); }))
      continue;
    int earlier = -1;
    for (size_t m = 0; m < modules_.size() && earlier < 0; ++m)
      if (module_pattern_matches(rules[i].pattern, modules_[m].name)) earlier = modules_[m].rule;
    if (earlier < 0)
      throw UsageError("precision_map rule " + std::to_string(i + 1) + " '" + rules[i].pattern +
                       "' matches no module: the modules are " + modules_named(modules_, layers_) +
                       " (patterns: * any text, ? one character, [A-B] a number from A to B)");
    throw UsageError("precision_map rule " + std::to_string(i + 1) + " '" + rules[i].pattern +
                     "' never applies: every module it matches is taken by rule " + std::to_string(earlier + 1) +
                     " '" + rules[static_cast<size_t>(earlier)].pattern +
                     "' before it (the first matching rule wins): move it up or drop it");
  }
}

bool Recipe::uses(Quantization q) const {
  return std::any_of(modules_.begin(), modules_.end(), [q](const ModulePrecision& m) { return m.quantization == q; });
}

ops::Summation Recipe::summation(Quantization q) const {
  const bool fp32_products = config_.gemm_summation == GemmSummation::fp32_products || !ops_->block_exact_available() ||
                             (config_.gemm_summation == GemmSummation::automatic && ops_->fp32_products_available(gemm_format(q)));
  return fp32_products ? ops::Summation::fp32_products : ops::Summation::block_exact;
}

Recipe::Recipe(const RecipeConfig& config, int layers, const std::vector<LinearShape>& linears,
               int64_t tokens_per_micro_batch, const ops::TensorOps& ops)
    : config_(config), ops_(&ops), layers_(layers), linears_per_block_(static_cast<int>(linears.size())) {
  if (layers <= 0) throw UsageError("the model has " + std::to_string(layers) + " layers: it needs at least 1");
  const auto q = config.quantization;
  if (q == Quantization::nvfp4) std::tie(bf16_first_, bf16_last_) = nvfp4_bf16_layers(config.nvfp4, layers);
  resolve_modules(linears);
  check_rules_decide();
  const std::string recipe_text = "quantization=" + std::string(to_string(q)) +
                                  (config.precision_map.empty() ? "" : " and the precision_map");
  if (config.nvfp4.row_scaled_activations && !uses(Quantization::nvfp4))
    throw UsageError("nvfp4.row_scaled_activations=true applies to quantization=nvfp4 (one FP32 scale per row of an "
                     "NVFP4 activation), and no linear runs in NVFP4 under " + recipe_text +
                     ": set quantization=nvfp4 or drop the key");
  if (config.nvfp4_knobs_given && !uses(Quantization::nvfp4))
    throw UsageError("nvfp4.* knobs were given but no linear runs in NVFP4 under " + recipe_text +
                     ": set quantization=nvfp4 (or a precision_map rule =nvfp4) or drop the nvfp4.* keys");
  if (uses(Quantization::nvfp4)) {
    check_four_over_six_knobs(config.nvfp4);
    check_row_scaled_activations(config.nvfp4);
  }
  if (!(config.precision_switch_at >= 0.0 && config.precision_switch_at <= 1.0))
    throw UsageError("precision_switch_at=" + std::to_string(config.precision_switch_at) +
                     " is outside [0, 1]: it is the fraction of training after which all GEMMs run in BF16 "
                     "(1 = never switch)");
  const bool any_quantized = std::any_of(modules_.begin(), modules_.end(), [](const ModulePrecision& m) { return is_quantized(m.quantization); });
  if (config.precision_switch_at < 1.0 && !any_quantized)
    throw UsageError("precision_switch_at applies to quantized recipes, and no linear is quantized under " + recipe_text +
                     ": drop it or choose fp8/mxfp8/mxfp4/nvfp4");
  if (config.precision_switch_scope != SwitchScope::all && config.precision_switch_at >= 1.0)
    throw UsageError("precision_switch_scope=" + std::string(to_string(config.precision_switch_scope)) +
                     " says which GEMMs precision_switch_at moves to BF16, but precision_switch_at=1 never switches: "
                     "set precision_switch_at (e.g. 0.8) or drop precision_switch_scope");
  attention_bf16_ = config.attention == AttentionPrecision::bf16 ||
                    (config.attention == AttentionPrecision::automatic && q != Quantization::none);
  const bool any_summed = std::any_of(modules_.begin(), modules_.end(), [](const ModulePrecision& m) { return has_gemm_summation(m.quantization); });
  if (config.gemm_summation_given && !any_summed)
    throw UsageError("gemm_summation chooses how NVFP4, MXFP4 and FP8 GEMMs sum, but no linear runs in one of those under " +
                     recipe_text + ": set one of those or drop gemm_summation");
  if (config.gemm_summation == GemmSummation::block_exact && !ops.block_exact_available())
    throw UsageError("gemm_summation=block_exact (exact 16-element block products) is a CPU summation; this backend (" +
                     ops.describe() + ") sums in FP32 on its tensor cores: use gemm_summation=auto or fp32_products");
  for (const ModulePrecision& m : modules_)
    if (m.name != "lm_head")
      check_block_sizes(m.quantization, {{m.name, m.in_features, m.out_features}}, tokens_per_micro_batch);
}

LinearRecipe Recipe::for_linear(int layer, int linear, double progress) const {
  NIBBLE_CHECK(layer >= 0 && layer < layers_ && linear >= 0 && linear < linears_per_block_,
               "Recipe::for_linear(%d, %d) of a %d-layer model with %d linears a block", layer, linear, layers_,
               linears_per_block_);
  Quantization q = modules_[static_cast<size_t>(layer * linears_per_block_ + linear)].quantization;
  const bool switched = is_quantized(q) && progress >= config_.precision_switch_at && config_.precision_switch_at < 1.0;
  const ops::Summation summed = summation(q);
  if (switched && config_.precision_switch_scope == SwitchScope::all) q = Quantization::bf16;
  LinearRecipe r = operands(q, config_.nvfp4);
  if (switched && config_.precision_switch_scope == SwitchScope::forward)
    r.fprop = operands(Quantization::bf16, config_.nvfp4).fprop;
  for (GemmRole role : kGemmRoles) r[role].summation = summed;
  return r;
}

std::string describe_kernels(const Recipe& recipe) {
  std::string s;
  for (Quantization q : {Quantization::fp8, Quantization::mxfp4, Quantization::nvfp4})
    if (recipe.uses(q)) s += recipe.ops().describe_summation(gemm_format(q), recipe.summation(q)) + "; ";
  s += recipe.attention_bf16() ? "attention products in BF16" : "attention products in FP32";
  return s;
}

uint64_t sr_step_hash(uint64_t run_seed, int64_t step) { return mix64(mix64(run_seed) ^ static_cast<uint64_t>(step)); }

uint64_t sr_salt(int layer, int linear, GemmRole role, int operand) {
  return static_cast<uint64_t>(layer) << 16 | static_cast<uint64_t>(linear) << 8 | static_cast<uint64_t>(role) << 2 |
         static_cast<uint64_t>(operand);
}

uint64_t sr_seed(uint64_t run_seed, int64_t step, int layer, int linear, GemmRole role, int operand) {
  return sr_seed_of(sr_step_hash(run_seed, step), sr_salt(layer, linear, role, operand));
}

}  // namespace nibble
