#include "run/run_checkpoints.h"

#include <fmt/format.h>

namespace nibble::train {

namespace fs = std::filesystem;

RunCheckpoints::RunCheckpoints(const fs::path& run_dir, const fs::path& saved_config, bool root, const Trainer& trainer,
                               CheckpointOptions options, std::optional<fs::path> resumed_from)
    : run_dir_(run_dir),
      saved_config_(saved_config),
      root_(root),
      trainer_(trainer),
      options_(std::move(options)),
      last_good_(std::move(resumed_from)) {
  // Rotation reads each older checkpoint at most once in this run; the one resumed from was loaded.
  if (!options_.verdicts) options_.verdicts = std::make_shared<CheckpointVerdicts>();
  if (last_good_) options_.verdicts->known_good(*last_good_);
}

// Called on every rank: a sharded optimizer's state is gathered on rank 0 (collective), which
// alone writes.
std::optional<fs::path> RunCheckpoints::write(const TrainingState& state, bool in_spike) {
  const AdamW& optimizer = trainer_.optimizer();
  if (!root_ && !optimizer.sharded()) return std::nullopt;
  const AdamWState whole = optimizer.gather_state();
  // distributed.shard=full: the weights too, on rank 0 while it writes them.
  WeightShards* weights = trainer_.weight_shards();
  if (weights) weights->gather_to_root();
  if (!root_) return std::nullopt;
  CheckpointOptions options = options_;
  if (in_spike) options.also_keep = last_good_;
  std::optional<fs::path> written = save_checkpoint_state(run_dir_, trainer_.model(), &whole, state, options);
  if (weights) weights->drop_unowned();
  return written;
}

void RunCheckpoints::save_interval(TrainingState& state, double elapsed_s, bool in_spike, const Console& console) {
  // Rank 0 writes; every rank knows the path, so a stop on any rank names the same last good one.
  state.elapsed_s = elapsed_s;
  if (const auto path = write(state, in_spike))
    console.print(fmt::format("{}checkpoint {}\n", console.clear_line(), path->string()));
  if (!in_spike) last_good_ = checkpoint_path(run_dir_, state.step);
  saved_step_ = state.step;
}

void RunCheckpoints::save_before_stop(TrainingState& state, double elapsed_s, bool in_spike) {
  if (saved_step_ == state.step) return;
  state.elapsed_s = elapsed_s;
  write(state, in_spike);
}

std::string RunCheckpoints::last_good_text() const {
  return last_good_ ? last_good_->string() : std::string("none (no checkpoint written yet)");
}

std::string RunCheckpoints::resume_advice() const {
  const std::string fixes = "a lower schedule.lr (or a larger schedule.warmup_steps); quantization=bf16 tells "
                            "whether the recipe is the cause";
  if (!last_good_) return "start again with " + fixes;
  return fmt::format("resume from it with `nibble train {} resume=true --checkpoint {}` and {}", saved_config_.string(),
                     last_good_->filename().string(), fixes);
}

void SpikeWatch::observe(int64_t step, double loss, const RunCheckpoints& checkpoints, const Console& console) {
  switch (detector_.observe(loss)) {
    case LossSpikeDetector::Event::spike_begins:
      spike_step_ = step;
      console.print(fmt::format("{}warning: loss spike at step {}: {:.4f} against a recent mean of {:.4f}; the last "
                                "checkpoint before it is {}\n",
                                console.clear_line(), step, loss, detector_.mean(), checkpoints.last_good_text()));
      break;
    case LossSpikeDetector::Event::spike_ends:
      console.print(fmt::format("{}note: the loss is back to {:.4f} at step {} (recent mean {:.4f}), after the spike "
                                "from step {}\n",
                                console.clear_line(), loss, step, detector_.mean(), spike_step_));
      break;
    case LossSpikeDetector::Event::none:
    case LossSpikeDetector::Event::spike_continues: break;
  }
}

}  // namespace nibble::train
