#include "run/report.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <limits>
#include <string>

#include "common/error.h"
#include "common/wait_policy.h"
#include "ops/backend.h"
#include "run/metrics.h"
#include "train/experiment.h"

namespace nibble::train {

std::string bytes_text(double b) {
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
  return fmt::format("{:.1f} KiB", b / 1024.0);
}

namespace {

// Storage of one element of a saved wgrad input, codes plus block scales.
double bytes_per_element(const GemmRecipe& g) {
  switch (g.precision) {
    case GemmPrecision::fp32: return 4;
    case GemmPrecision::bf16: return 2;
    case GemmPrecision::quantized: return stored_bytes_per_element(g.b.format);
  }
  return 4;
}

std::string operand_text(const QuantOptions& q, bool weight) {
  std::string s(to_string(q.format));
  if (q.format == Format::nvfp4 && weight) s += q.tile_16x16 ? "(16x16)" : "(1x16)";
  if (q.rounding == Rounding::stochastic) s += "/SR";
  if (q.rht) s += "/RHT";
  if (q.four_over_six)
    s += "/4over6(" + std::string(to_string(q.four_over_six_error)) + "," + std::to_string(q.four_over_six_e4m3_max) + ")";
  return s;
}

std::string gemm_text(const GemmRecipe& g, GemmRole role) {
  std::string s(to_string(role));
  if (g.precision != GemmPrecision::quantized) return s + " " + std::string(to_string(g.precision));
  // fprop multiplies X by W, dgrad dY by W^T, wgrad dY^T by X^T (recipe/recipe.h).
  return s + " " + operand_text(g.a, false) + " x " + operand_text(g.b, role != GemmRole::wgrad);
}

std::string peak_note(double peak, const ops::Backend& backend) {
  if (backend.device() == ops::Device::cpu)
    return fmt::format("{:.1f} GFLOP/s = {} threads x FP32 FMA peak measured on this CPU", peak / 1e9,
                       omp_get_max_threads());
  return fmt::format("{:.1f} GFLOP/s = FP32 GEMM rate measured on {}", peak / 1e9, backend.describe());
}

}  // namespace

MemoryEstimate estimate_memory(const model::ModelConfig& m, const Recipe* recipe, int64_t batch, int64_t seq) {
  MemoryEstimate e;
  int64_t params = 0;
  {
    const int64_t d = m.width, hd = m.head_dim(), f = m.hidden();
    params = m.vocab * d + m.layers * (2 * d + (m.heads + 2 * m.kv_head_count()) * hd * d + d * m.heads * hd + 2 * f * d + d * f) + d +
             (m.tied_embeddings ? 0 : m.vocab * d);
  }
  e.weights = 4 * params;
  e.gradients = 4 * params;
  e.optimizer = 8 * params;  // AdamW's two FP32 moments
  const int64_t N = batch * seq, d = m.width, hd = m.head_dim(), f = m.hidden();
  const int64_t qkv = (m.heads + 2 * m.kv_head_count()) * hd;
  // Per block, kept by the model: residual input, x_mid, two rstd rows, post-RoPE qkv, softmax
  // probabilities, gate_up.
  const int64_t block_floats = N * d + N * d + 2 * N + N * qkv + batch * m.heads * seq * seq + N * 2 * f;
  // The inputs each linear keeps for its wgrad GEMM: qkv and gate_up see [N, d], attn_out
  // [N, heads*hd], down [N, f].
  const int64_t linear_inputs = N * d + N * m.heads * hd + N * d + N * f;
  const int64_t final_floats = N * d + N + N * d + N * m.vocab + N;
  double recipe_bytes = 4.0 * static_cast<double>(m.layers * block_floats + final_floats);
  const int64_t inputs_of[4] = {N * d, N * m.heads * hd, N * d, N * f};  // qkv, attn_out, gate_up, down
  for (int64_t l = 0; recipe != nullptr && l < m.layers; ++l)
    for (int linear = 0; linear < 4; ++linear) {
      const GemmRecipe& w = recipe->for_linear(static_cast<int>(l), linear, 0.0).wgrad;
      recipe_bytes += bytes_per_element(w) * static_cast<double>(inputs_of[linear]);
    }
  e.activations_fp32 = 4 * (m.layers * (block_floats + linear_inputs) + final_floats);
  e.activations_recipe = static_cast<int64_t>(recipe_bytes);
  return e;
}

namespace {

// MemTotal of /proc/meminfo in bytes; 0 when unknown.
int64_t machine_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  for (std::string key; in >> key;) {
    int64_t kib = 0;
    if (key == "MemTotal:" && in >> kib) return kib * 1024;
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return 0;
}

}  // namespace

void refuse_beyond_memory(const MemoryEstimate& e, const RunConfig& c) {
  const int64_t machine = machine_memory_bytes();
  if (c.train.device != ops::Device::cpu || machine <= 0 || e.total() <= machine) return;
  const int64_t seq = c.train.seq > 0 ? c.train.seq : c.train.model.context;
  throw UsageError(fmt::format(
      "this run needs about {} of memory (weights {}, gradients {}, AdamW {}, activations of one micro-batch of "
      "batch={} x seq={}: {}), more than this machine's {} (MemTotal): it would run out of memory. Lower batch "
      "(raising grad_accum keeps the tokens per step), seq or model.context, or the model's size (model.width, "
      "model.layers)",
      bytes_text(static_cast<double>(e.total())), bytes_text(static_cast<double>(e.weights)),
      bytes_text(static_cast<double>(e.gradients)), bytes_text(static_cast<double>(e.optimizer)), c.train.batch, seq,
      bytes_text(static_cast<double>(e.activations_recipe)), bytes_text(static_cast<double>(machine))));
}

namespace {

// As the recipe keys spell it, `none` as what it means: fp32.
std::string quantization_text(Quantization q) { return q == Quantization::none ? "fp32" : std::string(to_string(q)); }

// "blocks 1-10" / "block 0": a run of blocks [first, last].
std::string block_span(int first, int last) {
  return first == last ? fmt::format("block {}", first) : fmt::format("blocks {}-{}", first, last);
}

// The rule that decided a module, shortened for the table: "", "rule 2", "bf16_first_layers".
std::string decided_text(const ModulePrecision& m) {
  if (m.rule >= 0) return fmt::format(" (rule {})", m.rule + 1);
  if (m.decided_by.starts_with("nvfp4.")) return " (" + m.decided_by.substr(6) + ")";
  return "";
}

// One line per run of blocks whose linears resolved alike, then lm_head.
void describe_modules(const Recipe& recipe, int layers, std::vector<std::string>& lines) {
  const auto& modules = recipe.modules();
  const size_t per_block = (modules.size() - 1) / static_cast<size_t>(layers);
  std::string previous;
  int first = 0;
  auto flush = [&](int last) {
    if (!previous.empty()) lines.push_back(fmt::format("{:<13}{}", block_span(first, last) + ":", previous));
  };
  for (int l = 0; l < layers; ++l) {
    std::string text;
    for (size_t i = 0; i < per_block; ++i) {
      const ModulePrecision& m = modules[static_cast<size_t>(l) * per_block + i];
      text += fmt::format("{}{} {}{}", text.empty() ? "" : ", ", m.name.substr(m.name.find('.') + 1),
                          to_string(m.quantization), decided_text(m));
    }
    if (text != previous) {
      flush(l - 1);
      previous = text;
      first = l;
    }
  }
  flush(layers - 1);
  const ModulePrecision& head = modules.back();
  lines.push_back(fmt::format("{:<13}{}{}", "lm_head:", head.quantization == Quantization::bf16 ? "bf16" : "fp32",
                              decided_text(head)));
}

// The share of the linears' and the LM head's GEMM FLOPs (forward and backward) in each quantization.
std::string flop_shares(const Recipe& recipe, const model::ModelConfig& m) {
  std::map<std::string, double> flops;
  double total = 0;
  for (const ModulePrecision& mod : recipe.modules()) {
    const double f = mod.name == "lm_head" ? static_cast<double>(m.width) * static_cast<double>(m.vocab)
                                           : static_cast<double>(mod.in_features) * static_cast<double>(mod.out_features);
    flops[quantization_text(mod.quantization)] += f;
    total += f;
  }
  std::vector<std::pair<double, std::string>> sorted;
  for (const auto& [name, f] : flops) sorted.push_back({f, name});
  std::sort(sorted.rbegin(), sorted.rend());
  std::string s;
  for (const auto& [f, name] : sorted) s += fmt::format("{}{} {:.1f}%", s.empty() ? "" : ", ", name, 100.0 * f / total);
  return "GEMM FLOPs (linears and LM head): " + s + "; attention's products are " +
         (recipe.attention_bf16() ? "BF16" : "FP32");
}

}  // namespace

std::vector<std::string> describe_recipe_per_module(const Recipe& recipe, const model::ModelConfig& m) {
  const int layers = static_cast<int>(m.layers);
  std::vector<std::string> lines;
  lines.push_back(recipe.config().precision_map.empty()
                      ? std::string("modules (nvfp4.bf16_first_layers / bf16_last_layers, then quantization):")
                      : std::string("modules (first match wins: precision_map rules, then nvfp4.bf16_first_layers / "
                                    "bf16_last_layers, then quantization):"));
  describe_modules(recipe, layers, lines);
  for (size_t i = 1; i < lines.size(); ++i) lines[i] = "  " + lines[i];
  lines.push_back(flop_shares(recipe, m));
  // The GEMMs of each quantization in use, once.
  const auto& modules = recipe.modules();
  const size_t per_block = (modules.size() - 1) / static_cast<size_t>(layers);
  std::vector<Quantization> seen;
  for (size_t k = 0; k + 1 < modules.size(); ++k) {
    const Quantization q = modules[k].quantization;
    if (std::find(seen.begin(), seen.end(), q) != seen.end()) continue;
    seen.push_back(q);
    const LinearRecipe r = recipe.for_linear(static_cast<int>(k / per_block), static_cast<int>(k % per_block), 0.0);
    std::string text;
    for (GemmRole role : kGemmRoles) text += (text.empty() ? "" : " | ") + gemm_text(r[role], role);
    lines.push_back(fmt::format("{}: {}", quantization_text(q), text));
  }
  if (recipe.config().precision_switch_at < 1.0)
    lines.push_back(fmt::format("after {:.0f}% of the steps {} (precision_switch_at, precision_switch_scope={})",
                                100 * recipe.config().precision_switch_at,
                                recipe.config().precision_switch_scope == SwitchScope::forward
                                    ? "the quantized linears' forward GEMMs (fprop) run in BF16; dgrad and wgrad keep "
                                      "their recipe"
                                    : "every quantized linear's GEMMs run in BF16",
                                to_string(recipe.config().precision_switch_scope)));
  lines.push_back(recipe.attention_bf16()
                      ? "embedding, norms, softmax and loss: FP32; attention's QK^T and PV: BF16 operands, FP32 sums"
                      : "embedding, norms, attention core and loss: FP32");
  return lines;
}

std::string startup_report(const RunConfig& c, const model::Transformer& model, const Recipe& recipe,
                           std::string_view tokenizer, int64_t train_tokens, int64_t val_tokens, double peak_flops) {
  const auto& m = model.config();
  const int64_t seq = c.train.seq > 0 ? c.train.seq : m.context;
  const int64_t tokens_per_step = c.train.batch * seq * c.train.grad_accum;
  const double flops_token = training_flops_per_token(m, seq);
  const int64_t params = model.params().parameter_count();
  const int64_t embedding = m.vocab * m.width;
  const MemoryEstimate mem = estimate_memory(m, &recipe, c.train.batch, seq);
  std::string s;
  s += fmt::format("model      {} blocks x width {} ({} heads, {} kv heads, head dim {}), SwiGLU hidden {}, context {}, "
                   "vocab {} ({}), {} embeddings\n",
                   m.layers, m.width, m.heads, m.kv_head_count(), m.head_dim(), m.hidden(), m.context, m.vocab,
                   tokenizer, m.tied_embeddings ? "tied" : "untied");
  s += fmt::format("parameters {} ({:.2f}M; {:.2f}M without the embedding)\n", params, params / 1e6,
                   (params - embedding) / 1e6);
  s += fmt::format("data       {} train tokens, {} validation tokens; {} tokens/step = batch {} x seq {} x grad_accum "
                   "{}; {} steps = {} tokens ({:.2f} epochs)\n",
                   train_tokens, val_tokens, tokens_per_step, c.train.batch, seq, c.train.grad_accum,
                   c.train.schedule.total_steps, format_si(static_cast<double>(tokens_per_step * c.train.schedule.total_steps)),
                   static_cast<double>(tokens_per_step * c.train.schedule.total_steps) / static_cast<double>(train_tokens));
  // The three validation losses a user meets average different windows: say which is which.
  s += fmt::format("validation every {} steps: val loss = the mean over eval.batches={} batches of {} windows drawn at "
                   "fixed places in the validation tokens{} (`nibble compare` shows these); `nibble eval RUN` "
                   "averages every window of the validation files instead, so its loss differs a little\n",
                   c.eval_interval, c.train.eval_batches, c.train.batch,
                   c.sources.empty() ? "" : ", per source, then weight-averaged over the sources");
  s += fmt::format("compute    {:.3g} training FLOPs/token (6N + 12 L d T), {:.3g} FLOPs/step, {:.3g} FLOPs in total\n",
                   flops_token, flops_token * tokens_per_step,
                   flops_token * tokens_per_step * static_cast<double>(c.train.schedule.total_steps));
  s += fmt::format("MFU peak   {}\n", peak_note(peak_flops, model.backend()));
  s += fmt::format("memory     weights {}, gradients {}, AdamW {}; activations per micro-batch {} in FP32, {} with the "
                   "recipe's quantized saved activations; total {} (FP32 activations) / {} (quantized)\n",
                   bytes_text(mem.weights), bytes_text(mem.gradients), bytes_text(mem.optimizer),
                   bytes_text(mem.activations_fp32), bytes_text(mem.activations_recipe),
                   bytes_text(mem.weights + mem.gradients + mem.optimizer + mem.activations_fp32),
                   bytes_text(mem.weights + mem.gradients + mem.optimizer + mem.activations_recipe));
  s += fmt::format("recipe     {}\n", describe(recipe.config()));
  for (const auto& line : describe_recipe_per_module(recipe, m)) s += "           " + line + "\n";
  s += fmt::format("kernels    {}\n", describe_kernels(recipe));
  s += fmt::format("threads    {}; OpenMP waits: {}\n", omp_get_max_threads(), describe_wait_policy());
  s += fmt::format("device     {}\n", model.backend().describe());
  return s;
}

}  // namespace nibble::train
