#include "bench/train_bench.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <sstream>
#include <string_view>
#include <utility>

#ifndef NIBBLE_TORCH_BENCH_SCRIPT
#define NIBBLE_TORCH_BENCH_SCRIPT "bench/torch_train.py"
#endif

namespace nibble::bench {

namespace {

std::string text(int64_t v) { return std::to_string(v); }

// "(default 6 speed / 4 quality)": the two shapes' value of one dimension.
std::string shape_default(int64_t ModelShape::*dim) {
  return "(default " + text(kSpeedShape.*dim) + " speed / " + text(kQualityShape.*dim) + " quality)";
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
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

// The table's entries: a text or list option, a count (or seed) checked against `min`, a flag.
OptionSpec text_option(std::string flag, std::string help, OptionSpec::Target target, std::string value_name,
                       bool show_default) {
  OptionSpec s;
  s.flag = std::move(flag);
  s.help = std::move(help);
  s.target = target;
  s.value_name = std::move(value_name);
  s.show_default = show_default;
  return s;
}

OptionSpec count_option(std::string flag, std::string help, OptionSpec::Target target, bool show_default, int64_t min,
                        std::string meaning) {
  OptionSpec s = text_option(std::move(flag), std::move(help), target, "N", show_default);
  s.min = min;
  s.meaning = std::move(meaning);
  return s;
}

std::vector<OptionSpec> make_options() {
  using O = TrainBenchOptions;
  const std::string positive = "a positive count";
  OptionSpec device = text_option("--device", "speed: cpu, or cuda (training on the GPU, device=cuda)", &O::device,
                                  "cpu|cuda", true);
  device.choices = {"cpu", "cuda"};
  std::vector<OptionSpec> v = {
      text_option("--recipes", "comma-separated: none, bf16, fp8, mxfp8, mxfp4, nvfp4", &O::recipes,
                  "none,bf16,fp8,mxfp4,nvfp4", true),
      text_option("--set", "recipe knob key=value for the recipes it applies to (e.g. nvfp4.rht=false)", &O::knobs,
                  "KEY=VALUE", false),
      text_option("--quality", "train nanoGPT's CPU config on tinyshakespeare per recipe; print val losses", &O::quality,
                  "", false),
      text_option("--corpus", "character-level training text", &O::corpus, "FILE", true),
      // Sizes are checked as given: 0 would silently mean the default, a negative count nonsense rates.
      count_option("--layers", "transformer blocks " + shape_default(&ModelShape::layers), &O::layers, false, 1, positive),
      count_option("--width", "model width " + shape_default(&ModelShape::width), &O::width, false, 1, positive),
      count_option("--heads", "attention heads " + shape_default(&ModelShape::heads), &O::heads, false, 1, positive),
      count_option("--context", "sequence length " + shape_default(&ModelShape::context), &O::context, false, 1, positive),
      count_option("--batch", "sequences per step " + shape_default(&ModelShape::batch), &O::batch, false, 1, positive),
      count_option("--steps", "quality: training steps (default " + text(kQualitySteps) + ")", &O::steps, false, 1,
                   positive),
      text_option("--lr", "quality: peak learning rate", &O::lr, "LR", true),
      count_option("--eval-interval", "quality: steps between evaluations", &O::eval_interval, true, 1, positive),
      count_option("--eval-batches", "quality: validation batches per evaluation", &O::eval_batches, true, 1, positive),
      count_option("--warmup", "speed: untimed steps", &O::warmup, true, 0, "a count >= 0"),
      count_option("--timed-steps", "speed: timed steps", &O::timed_steps, true, 1, positive),
      count_option("--seed", "run seed", &O::seed, true, 0, "a seed >= 0"),
      device,
      text_option("--vs-torch", "speed: then run PyTorch on the same model (bench/torch_train.py) and print the ratios",
                  &O::vs_torch, "", false),
      text_option("--torch-python", "--vs-torch: the Python that has PyTorch", &O::torch_python, "PYTHON", true),
      text_option("--torch-script", "--vs-torch: the PyTorch benchmark script", &O::torch_script, "FILE", true),
      text_option("--torch-modes", "--vs-torch: fp32, bf16 (autocast), fp32-compile, bf16-compile", &O::torch_modes,
                  "MODES", true),
      text_option("--contended",
                  "speed: time each recipe again with a busy process per thread on the same cores; print the slowdown",
                  &O::contended, "", false),
      text_option("--json", "also write the rates to FILE as JSON (for bench/torch_train.py --vs-nibble FILE)", &O::json,
                  "FILE", false),
      text_option("--predict",
                  "print the step's predicted time on --gpu kernel kind by kernel kind (design, as written, PyTorch "
                  "BF16) instead of training; needs no GPU",
                  &O::predict, "", false),
      text_option("--gpu", "--predict: the GPU modelled (h200, b200)", &O::gpu, "NAME", true),
      count_option("--vocab",
                   "--predict's vocabulary size, and nibble_bench_train's (random tokens; default 65, the character "
                   "corpus's)",
                   &O::vocab, false, 1, positive),
  };
  static const std::vector<std::string> standalone = {"--device",      "--recipes", "--layers", "--width",
                                                      "--heads",       "--context", "--batch",  "--vocab",
                                                      "--timed-steps", "--warmup",  "--set",    "--json"};
  for (auto& spec : v) {
    spec.in_standalone = std::find(standalone.begin(), standalone.end(), spec.flag) != standalone.end();
    spec.in_nibble = spec.flag != "--json";
  }
  return v;
}

// nibble_bench_train's value of one option: counts from `min` to 2^30, text as given.
void assign(const OptionSpec& spec, std::string_view value, TrainBenchOptions& o) {
  if (const auto count = std::get_if<int64_t TrainBenchOptions::*>(&spec.target)) {
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc() || end != value.data() + value.size() || v < spec.min || v > (int64_t{1} << 30))
      throw UsageError(spec.flag + " '" + std::string(value) + "' is not a count from " + std::to_string(spec.min) +
                       " to 2^30: " + standalone_usage());
    o.**count = v;
  } else if (const auto str = std::get_if<std::string TrainBenchOptions::*>(&spec.target)) {
    o.**str = value;
  } else if (const auto list = std::get_if<std::vector<std::string> TrainBenchOptions::*>(&spec.target)) {
    (o.**list).emplace_back(value);  // --set, once per knob
  } else {
    throw UsageError(spec.flag + " is not an option of nibble_bench_train: " + standalone_usage());
  }
}

}  // namespace

std::string TrainBenchOptions::default_torch_script() { return NIBBLE_TORCH_BENCH_SCRIPT; }

TrainBenchOptions standalone_defaults() {
  TrainBenchOptions o;
  o.recipes = "none,bf16,nvfp4";
  o.warmup = 3;
  o.timed_steps = 10;
  return o;
}

const std::vector<OptionSpec>& train_bench_options() {
  static const std::vector<OptionSpec> options = make_options();
  return options;
}

std::string standalone_usage() {
  std::string usage = "usage: nibble_bench_train";
  for (const auto& spec : train_bench_options())
    if (spec.in_standalone)
      usage += " [" + spec.flag + " " + spec.value_name + "]";
  return usage;
}

bool parse_standalone_args(int argc, char** argv, TrainBenchOptions& o) {
  const auto& options = train_bench_options();
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      std::printf("%s\n", standalone_usage().c_str());
      return false;
    }
    if (i + 1 >= argc) throw UsageError(std::string(flag) + " needs a value: " + standalone_usage());
    const std::string_view value = argv[++i];
    const auto spec = std::find_if(options.begin(), options.end(),
                                   [&](const OptionSpec& s) { return s.in_standalone && s.flag == flag; });
    if (spec == options.end()) throw UsageError("unknown option '" + std::string(flag) + "': " + standalone_usage());
    assign(*spec, value, o);
  }
  return true;
}

namespace {

// The config of the model `shape`, each dimension the option overrides (0: not given) replaced.
train::TrainConfig shaped_config(const TrainBenchOptions& o, const ModelShape& shape, int64_t vocab) {
  train::TrainConfig c;
  c.model.vocab = vocab;
  c.model.layers = o.layers ? o.layers : shape.layers;
  c.model.heads = o.heads ? o.heads : shape.heads;
  c.model.width = o.width ? o.width : shape.width;
  c.model.context = o.context ? o.context : shape.context;
  c.batch = o.batch ? o.batch : shape.batch;
  return c;
}

}  // namespace

train::TrainConfig speed_config(const TrainBenchOptions& o, int64_t vocab) {
  train::TrainConfig c = shaped_config(o, kSpeedShape, vocab);
  c.schedule.total_steps = 1000;
  c.schedule.warmup_steps = 10;
  c.seed = o.seed;
  c.device = ops::parse_device(o.device);
  return c;
}

train::TrainConfig quality_config(const TrainBenchOptions& o, int64_t vocab) {
  // nanoGPT's CPU configuration also has beta2 0.99, weight decay 0.1, clip 1.0 and no dropout: nibble's defaults.
  train::TrainConfig c = shaped_config(o, kQualityShape, vocab);
  c.schedule.total_steps = o.steps ? o.steps : kQualitySteps;
  c.schedule.lr = static_cast<float>(o.lr);
  c.schedule.min_lr = static_cast<float>(o.lr / 10);
  c.schedule.warmup_steps = std::min<int64_t>(100, c.schedule.total_steps);
  c.eval_batches = o.eval_batches;
  c.seed = o.seed;
  return c;
}

std::vector<std::pair<std::string, RecipeConfig>> resolve_recipes(const TrainBenchOptions& o) {
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

std::vector<std::string> torch_command(const TrainBenchOptions& o, const train::TrainConfig& c, int threads,
                                       const std::string& json) {
  return {o.torch_python, o.torch_script,
          "--threads", std::to_string(threads),
          "--layers", std::to_string(c.model.layers),
          "--width", std::to_string(c.model.width),
          "--heads", std::to_string(c.model.heads),
          "--kv-heads", std::to_string(c.model.kv_head_count()),
          "--context", std::to_string(c.model.context),
          "--vocab", std::to_string(c.model.vocab),
          "--batch", std::to_string(c.batch),
          "--warmup", std::to_string(std::max<int64_t>(o.warmup, 2)),
          "--steps", std::to_string(o.timed_steps),
          "--seed", std::to_string(o.seed),
          "--modes", o.torch_modes,
          "--device", o.device,
          "--json", json};
}

}  // namespace nibble::bench
