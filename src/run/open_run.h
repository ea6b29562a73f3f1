// A trained run directory opened again, for `nibble eval`, `nibble generate` and `nibble export`:
// its resolved config, tokenizer and the weights of one checkpoint, and the loss over a token stream.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "data/token_files.h"
#include "data/tokenizer.h"
#include "io/directory_lock.h"
#include "model/transformer.h"
#include "ops/backend.h"
#include "run/checkpoint.h"
#include "run/config.h"

namespace nibble::train {

// A trained run opened for evaluation or sampling: its resolved config, tokenizer and the weights
// of one checkpoint (the newest unless given), in a model on `device` (whatever device trained it:
// checkpoints are host data). UsageError naming the fix for device=cuda without a usable GPU.
// The checkpoint stays under a reader's lock (io::CheckpointLock) as long as the LoadedRun lives, so
// a training run rotating its checkpoints meanwhile keeps it (export reads its config.json later);
// when the newest one is removed between listing and locking, the newest is listed again.
struct LoadedRun {
  RunConfig config;
  std::unique_ptr<Tokenizer> tokenizer;  // null for a run on llm.c or nanoGPT token files, which has none
  std::unique_ptr<model::Transformer> model;
  std::filesystem::path checkpoint;
  TrainingState state;
  std::unique_ptr<io::CheckpointLock> checkpoint_lock;
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
// The same over a token stream (memory-mapped files, checked against the vocabulary when opened).
EvalResult evaluate_token_stream(LoadedRun& run, const TokenStream& tokens, int64_t max_windows, bool use_recipe,
                                 const std::function<void(const model::Transformer&)>& after_batch = {});

}  // namespace nibble::train
