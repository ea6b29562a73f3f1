// The training benchmark (`nibble bench train`, and nibble_bench_train where there is no nibble
// command): the model it times, its options (one table both front ends read), the configurations and
// recipes it runs, and the command line of its PyTorch twin (bench/torch_train.py). Standard C++ only,
// so that the NIBBLE_CUDA_ONLY build of an offline GPU machine (scripts/gpu-check.sh) builds it.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "train/trainer.h"

namespace nibble::bench {

// A model's depth and width, its context and the sequences per step.
struct ModelShape {
  int64_t layers, width, heads, context, batch;
};
// Speed: nanoGPT's shakespeare_char GPU model (6 x 384, 6 heads, context 256) at a CPU batch.
inline constexpr ModelShape kSpeedShape{6, 384, 6, 256, 8};
// Quality: nanoGPT's shakespeare_char CPU configuration (README): 4 layers, 4 heads, width 128,
// context 64, batch 12, 2000 iterations, lr 1e-3 cosine to 1e-4 after 100 warmup steps.
inline constexpr ModelShape kQualityShape{4, 128, 4, 64, 12};
inline constexpr int64_t kQualitySteps = 2000;
// Character-level tinyshakespeare's vocabulary (nibble_bench_train's random tokens use it too).
inline constexpr int64_t kCharVocab = 65;

struct TrainBenchOptions {
  std::string recipes = "none,bf16,fp8,mxfp4,nvfp4";
  std::vector<std::string> knobs;  // extra key=value applied to every recipe that accepts them
  bool quality = false;
  std::string corpus = "data/tinyshakespeare.txt";
  int64_t layers = 0, width = 0, heads = 0, context = 0, batch = 0, steps = 0;  // 0: the shape's
  double lr = 1e-3;
  int64_t eval_interval = 250, eval_batches = 100, warmup = 2, timed_steps = 5;
  uint64_t seed = 1337;
  std::string device = "cpu";  // speed: cpu, or cuda (device=cuda training; the CPU peaks and ideal step are CPU-only)
  // --vs-torch: PyTorch on the same model right after nibble's recipes (bench/torch_train.py).
  bool vs_torch = false;
  std::string torch_python = "python3";
  std::string torch_script = default_torch_script();
  std::string torch_modes = "fp32,bf16,bf16-compile";
  // --contended: each recipe timed again with a busy process per thread on the same cores, as beside
  // another run or a test suite; prints the slowdown (a fair share of the cores is 2x).
  bool contended = false;
  std::string json;  // nibble_bench_train --json FILE: the rates, for torch_train.py --vs-nibble FILE
  // --predict: the step's time on the GPU --gpu names, from a model of its kernels (bench/gpu_step_model.h).
  bool predict = false;
  std::string gpu = "h200";
  int64_t vocab = 0;  // --predict: 0 is the character corpus's

  // bench/torch_train.py in the source tree this was built from.
  static std::string default_torch_script();
};

// nibble_bench_train's defaults, the GPU check's (scripts/gpu-check.sh): three recipes, 3 + 10 steps.
TrainBenchOptions standalone_defaults();

// One option of the benchmark: its flag, help, where its value goes and which front ends take it.
// Counts are checked against `min` ("a positive count" and the like is `meaning`).
struct OptionSpec {
  using Target = std::variant<std::string TrainBenchOptions::*, std::vector<std::string> TrainBenchOptions::*,
                              int64_t TrainBenchOptions::*, double TrainBenchOptions::*, uint64_t TrainBenchOptions::*,
                              bool TrainBenchOptions::*>;
  std::string flag;
  std::string help;
  Target target;
  std::string value_name;               // nibble_bench_train's usage line: N, FILE, cpu|cuda, ...
  bool show_default = false;            // nibble bench train --help prints the default
  int64_t min = 0;                      // counts and seeds
  std::string meaning;                  // counts and seeds: what a valid value is ("a positive count")
  std::vector<std::string> choices;     // non-empty: the only values accepted
  bool in_nibble = true, in_standalone = false;  // nibble bench train, nibble_bench_train
};
const std::vector<OptionSpec>& train_bench_options();

// nibble_bench_train's usage line and command-line parser (the table's in_standalone options, from
// standalone_defaults()): UsageError naming the flag and the usage otherwise. Returns false for
// --help (the usage is then printed).
std::string standalone_usage();
bool parse_standalone_args(int argc, char** argv, TrainBenchOptions& o);

// The configuration timed for speed / trained for quality: the shape's defaults where an option is 0.
train::TrainConfig speed_config(const TrainBenchOptions& o, int64_t vocab);
train::TrainConfig quality_config(const TrainBenchOptions& o, int64_t vocab);

// Every recipe of --recipes with the --set knobs that apply to it, resolved and checked before any
// time is spent measuring.
std::vector<std::pair<std::string, RecipeConfig>> resolve_recipes(const TrainBenchOptions& o);

// The command line of bench/torch_train.py on config's model, batch and `threads` threads, writing
// its results to `json`.
std::vector<std::string> torch_command(const TrainBenchOptions& o, const train::TrainConfig& config, int threads,
                                       const std::string& json);

}  // namespace nibble::bench
