// `nibble train`: the driver that turns a RunConfig into a run directory
//   RUN/config.yaml       the resolved configuration (what was actually trained)
//   RUN/tokenizer.json    (+ tokenizer.model) copied from the data directory
//   RUN/metrics.jsonl     train and eval records (train/metrics.h)
//   RUN/checkpoints/      step_NNNNNNNN directories (train/checkpoint.h)
// and the helpers that open such a directory again for `nibble eval` and `nibble generate`.
#pragma once
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "model/transformer.h"
#include "recipe/recipe.h"
#include "run/checkpoint.h"
#include "run/config.h"
#include "train/distributed.h"
#include "data/tokenizer.h"

namespace nibble::train {

// Exit codes of run_training besides UsageError (2).
inline constexpr int kExitNonFiniteLoss = 3;
// 128 + SIGINT / SIGTERM (130 / 143, as a shell reports a process those signals end): the run was
// stopped by the signal after writing a checkpoint of its last step.

// Bytes of training state for one micro-batch, estimated from the shapes (model/transformer.h's
// saved activations; scratch buffers that live only inside one layer are not counted).
struct MemoryEstimate {
  int64_t weights = 0, gradients = 0, optimizer = 0;
  int64_t activations_fp32 = 0;       // every saved tensor in FP32
  int64_t activations_recipe = 0;     // the linears' saved wgrad inputs in the recipe's formats
};
MemoryEstimate estimate_memory(const model::ModelConfig& m, const Recipe& recipe, int64_t batch, int64_t seq);

// One line per run of blocks that share a recipe, e.g.
//   "blocks 1-2: fprop nvfp4 x nvfp4(16x16) | dgrad nvfp4/SR x nvfp4(16x16) | wgrad nvfp4/SR/RHT x nvfp4/RHT"
std::vector<std::string> describe_recipe_per_layer(const Recipe& recipe, int layers);

// Everything printed before the first step.
std::string startup_report(const RunConfig& config, const model::Transformer& model, const Recipe& recipe,
                           const Tokenizer& tokenizer, int64_t train_tokens, int64_t val_tokens, double peak_flops);

// Trains per `config`, printing to `out`. Returns 0, or kExitNonFiniteLoss when the loss became
// NaN/inf (after printing the step and the last good checkpoint), or 128 + the signal after SIGINT
// or SIGTERM. Throws UsageError for bad input, having written nothing into run.dir.
int run_training(const RunConfig& config, std::FILE* out);
// The same as one rank of a data-parallel job (train/distributed.h): every rank trains its share of
// each global batch; rank 0 alone prints, reads and writes the run directory (config, metrics,
// checkpoints) and broadcasts the starting weights, optimizer state and data position, so resuming
// works with any rank count. Ranks check at every logged step that their weights are identical.
// Test hook: NIBBLE_TEST_RANK_EXIT=RANK:STEP makes that rank exit (status 17) before that step, as
// a crashed rank would.
// The newest checkpoint written before a loss spike (train/loss_spike.h) that has not ended stays
// "last good" (divergence messages name it) and is kept through checkpoint rotation. Test hooks:
// NIBBLE_TEST_LOSS_SPIKE_FROM=STEP adds 10 to every reported step loss from STEP on (the training
// itself is unchanged); NIBBLE_TEST_LOSS_NAN_AT=STEP reports a NaN loss at STEP.
// With config.resume_checkpoint (`nibble train --checkpoint`), the run continues from that
// checkpoint of run.dir, refusing one that is not the run's or does not verify; checkpoints newer
// than it are moved to RUN/abandoned (train/checkpoint.h) and metrics.jsonl is cut at its step.
int run_training(const RunConfig& config, std::FILE* out, Communicator& comm);

// A trained run opened for evaluation or sampling: its resolved config, tokenizer and the weights
// of one checkpoint (the newest unless given), in a model on `device` (whatever device trained it:
// checkpoints are host data). UsageError naming the fix for device=cuda without a usable GPU.
struct LoadedRun {
  RunConfig config;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<model::Transformer> model;
  std::filesystem::path checkpoint;
  TrainingState state;
};
LoadedRun load_run(const std::filesystem::path& run_dir, const std::optional<std::filesystem::path>& checkpoint,
                   ops::Device device = ops::Device::cpu);

struct EvalResult {
  double loss = 0;
  int64_t tokens = 0, windows = 0;
  double perplexity() const;
};
// Mean next-token loss over consecutive non-overlapping windows of the run's sequence length (at
// most max_windows; <= 0: all), through the run's recipe forward, or in FP32 when use_recipe is false.
// `after_batch`, when given, runs after each batch's forward (export's calibration reads the
// linears' input statistics there).
EvalResult evaluate_token_stream(LoadedRun& run, const std::vector<int32_t>& tokens, int64_t max_windows,
                                 bool use_recipe,
                                 const std::function<void(const model::Transformer&)>& after_batch = {});

}  // namespace nibble::train
