// Resuming a run: which checkpoint it continues from (the one `--checkpoint` names, or the newest
// that verifies), and what the user should know about the continuation.
#pragma once
#include <filesystem>
#include <optional>
#include <string>

#include "run/checkpoint.h"
#include "run/config.h"
#include "run/console.h"
#include "train/trainer.h"

namespace nibble::train {

struct ResumePoint {
  TrainingState state;
  AdamWState optimizer;              // the checkpoint's whole optimizer state, for AdamW::scatter_state
  std::filesystem::path checkpoint;  // the checkpoint loaded
  size_t newer_damaged = 0;          // damaged checkpoints newer than it, passed over
};

// Loads into the trainer's model (and the returned optimizer state) the checkpoint of config.run_dir that the run
// continues from: config.resume_checkpoint when given (that one or none), otherwise the newest that
// verifies, warning about each damaged one passed over. UsageError, before anything is written or
// moved, when none can be continued (none verifies, the chosen one does not, grad_accum cannot
// continue its sample position, --checkpoint would train nothing yet set newer checkpoints aside).
// The returned state carries config's seed.
ResumePoint load_resume_point(const RunConfig& config, Trainer& trainer, const std::string& tokenizer_identity,
                              const Console& console);

// Notes each setting of `config` that differs from the run's saved config (and changes the math,
// so the continuation differs from an uninterrupted run). A changed schedule (steps, schedule.*)
// that raises the learning rate at the resumed `step` above the run's own schedule there
// (extending a finished cosine run jumps from min_lr back up) is refused (UsageError, before
// anything is written) naming both rates and the choices: keep the schedule, hold the rate
// (schedule.kind=constant), continue from the newest checkpoint where the new schedule takes over
// without a jump (a WSD run's stable phase), or schedule.rewarm=true, which warns and re-warms.
void note_config_changes(const RunConfig& config, const std::filesystem::path& saved_config, int64_t step,
                         const Console& console);

}  // namespace nibble::train
