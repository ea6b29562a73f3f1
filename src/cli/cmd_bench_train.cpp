// `nibble bench train`: the same model trained under each precision recipe, side by side in one
// run. Default: speed (tokens/s, step time, share of GEMMs / quantization / the rest, MFU against
// the peaks measured here). --quality: trains nanoGPT's CPU configuration on tinyshakespeare for
// each recipe and prints the validation losses.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <sstream>

#include "cli/command.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/quantize.h"
#include "train/experiment.h"

namespace nibble::cli {

namespace {

struct BenchTrainOptions {
  std::string recipes = "none,bf16,fp8,mxfp4,nvfp4";
  std::vector<std::string> knobs;  // extra key=value applied to every recipe that accepts them
  bool quality = false;
  std::string corpus = "data/tinyshakespeare.txt";
  int64_t layers = 0, width = 0, heads = 0, context = 0, batch = 0, steps = 0;
  double lr = 1e-3;
  int64_t eval_interval = 250, eval_batches = 100, warmup = 2, timed_steps = 5;
  uint64_t seed = 1337;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// Best-of-5 GFLOP/s of a 1024^3 GEMM in the precision a recipe's fprop uses.
double measured_peak_flops(Quantization q) {
  const int64_t n = 1024;
  std::vector<float> a(n * n), b(n * n), c(n * n);
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto& x : a) x = d(rng);
  for (auto& x : b) x = d(rng);
  LinearRecipe r = Recipe::operands(q, Nvfp4Knobs{});
  QuantizedTensor qa, qb;
  if (r.fprop.precision == GemmPrecision::quantized) {
    qa = cpu::quantize(a, n, n, r.fprop.a);
    qb = cpu::quantize(b, n, n, r.fprop.b);
  }
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    switch (r.fprop.precision) {
      case GemmPrecision::fp32:
        cpu::gemm_f32(cpu::Trans::no, cpu::Trans::yes, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
        break;
      case GemmPrecision::bf16:
        cpu::gemm_bf16(cpu::Trans::no, cpu::Trans::yes, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
        break;
      case GemmPrecision::quantized: cpu::gemm(qa, qb, c.data(), n); break;
    }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * n * n * n / best;
}

RecipeConfig recipe_for(const std::string& name, const std::vector<std::string>& knobs) {
  RecipeConfig rc;
  rc.quantization = parse_quantization(name);
  for (const auto& kv : knobs) {
    auto eq = kv.find('=');
    if (eq == std::string::npos) throw UsageError("--set '" + kv + "' is not key=value (example: nvfp4.rht=false)");
    std::string key = kv.substr(0, eq);
    if (key.starts_with("nvfp4.") && rc.quantization != Quantization::nvfp4) continue;
    if (key == "precision_switch_at" && (rc.quantization == Quantization::none || rc.quantization == Quantization::bf16))
      continue;
    if (!apply_recipe_option(rc, key, kv.substr(eq + 1)))
      throw UsageError("--set " + key + " is not a recipe key: use precision_switch_at or nvfp4.*");
  }
  return rc;
}

// Every recipe of the run, resolved and checked before any time is spent measuring.
std::vector<std::pair<std::string, RecipeConfig>> resolve_recipes(const BenchTrainOptions& o) {
  std::vector<std::pair<std::string, RecipeConfig>> out;
  bool has_nvfp4 = false;
  for (const auto& name : split_list(o.recipes)) {
    out.emplace_back(name, recipe_for(name, o.knobs));
    has_nvfp4 |= out.back().second.quantization == Quantization::nvfp4;
  }
  if (out.empty()) throw UsageError("--recipes is empty: name at least one of none, bf16, fp8, mxfp8, mxfp4, nvfp4");
  RecipeConfig scratch;
  scratch.quantization = Quantization::nvfp4;
  for (const auto& kv : o.knobs) {
    const std::string key = kv.substr(0, kv.find('='));
    apply_recipe_option(scratch, key, kv.substr(kv.find('=') + 1));  // reports a bad value whatever the recipes
    if (key.starts_with("nvfp4.") && !has_nvfp4)
      throw UsageError("--set " + kv + " is an nvfp4 knob but --recipes has no nvfp4: add nvfp4 or drop the knob");
  }
  return out;
}

std::vector<int32_t> load_corpus(const std::string& path, int64_t& vocab) {
  std::string text = train::read_text_file(path);
  train::CharTokenizer tok(text);
  vocab = tok.vocab_size();
  return tok.encode(text);
}

int run_quality(const BenchTrainOptions& o) {
  const auto recipes = resolve_recipes(o);
  int64_t vocab = 0;
  auto corpus = load_corpus(o.corpus, vocab);
  train::TrainConfig base;
  // nanoGPT's shakespeare_char CPU configuration (README): 4 layers, 4 heads, width 128, context
  // 64, batch 12, 2000 iterations, lr 1e-3 cosine to 1e-4 after 100 warmup steps, beta2 0.99,
  // weight decay 0.1, clip 1.0, no dropout.
  base.model.vocab = vocab;
  base.model.layers = o.layers ? o.layers : 4;
  base.model.heads = o.heads ? o.heads : 4;
  base.model.width = o.width ? o.width : 128;
  base.model.context = o.context ? o.context : 64;
  base.batch = o.batch ? o.batch : 12;
  base.schedule.total_steps = o.steps ? o.steps : 2000;
  base.schedule.lr = static_cast<float>(o.lr);
  base.schedule.min_lr = static_cast<float>(o.lr / 10);
  base.schedule.warmup_steps = std::min<int64_t>(100, base.schedule.total_steps);
  base.eval_batches = o.eval_batches;
  base.seed = o.seed;
  fmt::print("quality: {} layers x width {} x {} heads, context {}, batch {}, {} steps, lr {}, {} threads, "
             "val = mean of {} fixed batches\n",
             base.model.layers, base.model.width, base.model.heads, base.model.context, base.batch,
             base.schedule.total_steps, o.lr, omp_get_max_threads(), base.eval_batches);
  std::vector<std::pair<std::string, train::QualityResult>> results;
  for (const auto& [name, recipe] : recipes) {
    train::TrainConfig c = base;
    c.recipe = recipe;
    fmt::print("{}\n", describe(c.recipe));
    std::fflush(stdout);
    auto r = train::train_and_evaluate(c, corpus, o.eval_interval, [](const std::string& l) {
      fmt::print("{}\n", l);
      std::fflush(stdout);
    });
    results.emplace_back(name, r);
  }
  double bf16_loss = 0;
  for (auto& [n, r] : results)
    if (n == "bf16") bf16_loss = r.val_loss;
  fmt::print("\n{:<10} {:>10} {:>11} {:>12} {:>9}\n", "recipe", "val loss", "train loss", "vs bf16", "time");
  for (auto& [n, r] : results)
    fmt::print("{:<10} {:>10.4f} {:>11.4f} {:>12} {:>8.0f}s\n", n, r.val_loss, r.train_loss,
               bf16_loss > 0 ? fmt::format("{:+.2f}%", 100.0 * (r.val_loss / bf16_loss - 1.0)) : std::string("-"),
               r.seconds);
  return 0;
}

int run_speed(const BenchTrainOptions& o) {
  const auto recipes = resolve_recipes(o);
  int64_t vocab = 0;
  auto corpus = load_corpus(o.corpus, vocab);
  train::TrainConfig base;
  // nanoGPT's shakespeare_char GPU model (6 x 384, 6 heads, context 256) at a CPU batch.
  base.model.vocab = vocab;
  base.model.layers = o.layers ? o.layers : 6;
  base.model.heads = o.heads ? o.heads : 6;
  base.model.width = o.width ? o.width : 384;
  base.model.context = o.context ? o.context : 256;
  base.batch = o.batch ? o.batch : 8;
  base.schedule.total_steps = 1000;
  base.schedule.warmup_steps = 10;
  base.seed = o.seed;
  const int64_t tokens = base.batch * base.model.context;
  fmt::print("speed: {} layers x width {} x {} heads, context {}, batch {} ({} tokens/step), {} threads; "
             "{} warm-up + {} timed steps\n",
             base.model.layers, base.model.width, base.model.heads, base.model.context, base.batch, tokens,
             omp_get_max_threads(), o.warmup, o.timed_steps);
  const double fp32_peak = measured_peak_flops(Quantization::none);
  fmt::print("measured 1024^3 GEMM peak: fp32 {:.1f} GFLOP/s\n", fp32_peak / 1e9);
  fmt::print("kernels ({}): NVFP4/MXFP4 GEMMs {}; FP8 GEMMs {} (gemm_summation=auto unless --set); BF16 GEMMs (bf16 "
             "recipe, BF16-kept layers, attention products for every recipe but none) {}\n",
             cpu::to_string(cpu::active_isa()),
             cpu::fp32_products_available(Format::nvfp4) ? "sum element products in FP32 on the AMX-BF16 tiles"
                                                         : "sum exact 16-block products (no AMX-BF16 here)",
             cpu::amx_bf16_active() ? "on the AMX-BF16 tiles"
             : cpu::fp32_products_available(Format::fp8_e4m3) ? "with AVX512-BF16 vdpbf16ps"
                                                               : "decoded exactly, FMA in k order",
             cpu::amx_bf16_active()                          ? "on the AMX-BF16 tiles"
             : cpu::active_isa() >= cpu::Isa::avx512bf16 ? "with AVX512-BF16 vdpbf16ps"
                                                         : "FMA on BF16-rounded operands");
  fmt::print("\n{:<8} {:>10} {:>9} {:>7} {:>7} {:>7} {:>10} {:>11} {:>9}\n", "recipe", "tokens/s", "step ms", "gemm",
             "quant", "rest", "vs none", "MFU(fp32)", "MFU(own)");
  double none_tps = 0;
  for (const auto& [name, recipe] : recipes) {
    train::TrainConfig c = base;
    c.recipe = recipe;
    const double own_peak = measured_peak_flops(c.recipe.quantization);
    auto r = train::measure_training_speed(c, corpus, o.warmup, o.timed_steps);
    if (c.recipe.quantization == Quantization::none) none_tps = r.tokens_per_s;
    fmt::print("{:<8} {:>10.0f} {:>9.1f} {:>6.0f}% {:>6.0f}% {:>6.0f}% {:>10} {:>10.1f}% {:>8.1f}%\n", name,
               r.tokens_per_s, 1e3 * r.step_s, 100 * r.gemm_s / r.step_s, 100 * r.quantize_s / r.step_s,
               100 * r.rest_s / r.step_s, none_tps > 0 ? fmt::format("{:.2f}x", r.tokens_per_s / none_tps) : "-",
               100 * r.achieved_flops / fp32_peak, 100 * r.achieved_flops / own_peak);
    std::fflush(stdout);
  }
  fmt::print("\nMFU(fp32): training FLOPs (6N + 12 L d T per token) per second over the FP32 GEMM peak;\n"
             "MFU(own): over the peak of the GEMM precision the recipe's forward uses.\n");
  return 0;
}

const CommandRegistration registration{"bench train", [](CLI::App& app, int& exit_code) {
  CLI::App* bench = subcommand_group(app, "bench", "Measure nibble's kernels against libraries");
  CLI::App* cmd = bench->add_subcommand("train", "Training tokens/s (or --quality: val loss) of one model under each recipe");
  auto o = std::make_shared<BenchTrainOptions>();
  cmd->add_option("--recipes", o->recipes, "comma-separated: none, bf16, fp8, mxfp8, mxfp4, nvfp4")->capture_default_str();
  cmd->add_option("--set", o->knobs, "recipe knob key=value for the recipes it applies to (e.g. nvfp4.rht=false)");
  cmd->add_flag("--quality", o->quality, "train nanoGPT's CPU config on tinyshakespeare per recipe; print val losses");
  cmd->add_option("--corpus", o->corpus, "character-level training text")->capture_default_str();
  // Sizes are checked as given: 0 would silently mean the default, a negative count nonsense rates.
  cmd->add_option("--layers", o->layers, "transformer blocks (default 6 speed / 4 quality)")->check(integer_at_least(1, "a positive count"));
  cmd->add_option("--width", o->width, "model width (default 384 / 128)")->check(integer_at_least(1, "a positive count"));
  cmd->add_option("--heads", o->heads, "attention heads (default 6 / 4)")->check(integer_at_least(1, "a positive count"));
  cmd->add_option("--context", o->context, "sequence length (default 256 / 64)")->check(integer_at_least(1, "a positive count"));
  cmd->add_option("--batch", o->batch, "sequences per step (default 8 / 12)")->check(integer_at_least(1, "a positive count"));
  cmd->add_option("--steps", o->steps, "quality: training steps (default 2000)")->check(integer_at_least(1, "a positive count"));
  cmd->add_option("--lr", o->lr, "quality: peak learning rate")->capture_default_str();
  cmd->add_option("--eval-interval", o->eval_interval, "quality: steps between evaluations")->capture_default_str()->check(integer_at_least(1, "a positive count"));
  cmd->add_option("--eval-batches", o->eval_batches, "quality: validation batches per evaluation")->capture_default_str()->check(integer_at_least(1, "a positive count"));
  cmd->add_option("--warmup", o->warmup, "speed: untimed steps")->capture_default_str()->check(integer_at_least(0, "a count >= 0"));
  cmd->add_option("--timed-steps", o->timed_steps, "speed: timed steps")->capture_default_str()->check(integer_at_least(1, "a positive count"));
  cmd->add_option("--seed", o->seed, "run seed")->capture_default_str()->check(integer_at_least(0, "a seed >= 0"));
  cmd->callback([o, &exit_code] { exit_code = o->quality ? run_quality(*o) : run_speed(*o); });
}};

}  // namespace

}  // namespace nibble::cli
