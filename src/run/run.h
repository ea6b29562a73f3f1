// `nibble train`: the driver that turns a RunConfig into a run directory
//   RUN/config.yaml       the resolved configuration (what was actually trained)
//   RUN/tokenizer.json    (+ tokenizer.model) copied from the data directory; for a given
//                         sentencepiece model or tiktoken file, nibble_tokenizer.json +
//                         tokenizer.model / tokenizer.tiktoken instead (data/tokenizer.h)
//   RUN/metrics.jsonl     train and eval records (run/metrics.h)
//   RUN/checkpoints/      step_NNNNNNNN directories (run/checkpoint.h)
//   RUN/tensorboard/      event files, with log.tensorboard=true
//   RUN/abandoned/        checkpoints of a continuation given up by `--checkpoint` (never deleted)
// run/open_run.h opens such a directory again for `nibble eval`, `generate` and `export`.
#pragma once
#include <cstdio>

#include "run/config.h"
#include "run/faults.h"
#include "train/distributed.h"

namespace nibble::train {

inline constexpr const char* kRunConfigFile = "config.yaml";
inline constexpr const char* kRunMetricsFile = "metrics.jsonl";
inline constexpr const char* kRunTensorBoardDir = "tensorboard";

// Exit codes of run_training besides UsageError (2).
inline constexpr int kExitNonFiniteLoss = 3;
// 128 + SIGINT / SIGTERM (130 / 143, as a shell reports a process those signals end): the run was
// stopped by the signal after writing a checkpoint of its last step.

// Trains per `config`, printing to `out`. Returns 0, or kExitNonFiniteLoss when the loss became
// NaN/inf or a step met non-finite numbers (NumericalError; after printing the step and the last
// good checkpoint), or 128 + the signal after SIGINT or SIGTERM. Throws UsageError for bad input,
// having written nothing into run.dir.
//
// As one rank of a data-parallel job (train/distributed.h) every rank trains its share of each
// global batch; rank 0 alone prints, reads and writes the run directory (config, metrics,
// checkpoints) and broadcasts the starting weights, optimizer state and data position, so resuming
// works with any rank count. Ranks check at every logged step that their weights are identical.
//
// The newest checkpoint written before a loss spike (run/loss_spike.h) that has not ended stays
// "last good" (divergence messages name it) and is kept through checkpoint rotation.
// With config.resume_checkpoint (`nibble train --checkpoint`), the run continues from that
// checkpoint of run.dir, refusing one that is not the run's or does not verify; checkpoints newer
// than it are moved to RUN/abandoned (run/checkpoint.h) and metrics.jsonl is cut at its step.
// `faults` is for tests only (run/faults.h).
int run_training(const RunConfig& config, std::FILE* out, Communicator& comm, const FaultPlan& faults = {});
// A single-process run.
int run_training(const RunConfig& config, std::FILE* out);

}  // namespace nibble::train
