// The training loop's checkpoints and its watch over the loss: which checkpoint is the "last good"
// one (the newest written before a loss spike that is still going on), which a divergence message
// names and checkpoint rotation keeps.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "run/checkpoint.h"
#include "run/console.h"
#include "run/loss_spike.h"
#include "train/trainer.h"

namespace nibble::train {

class RunCheckpoints {
 public:
  // `resumed_from`: the checkpoint the run continues from, the last good one until another is written.
  RunCheckpoints(const std::filesystem::path& run_dir, const std::filesystem::path& saved_config, bool root,
                 const Trainer& trainer, CheckpointOptions options, std::optional<std::filesystem::path> resumed_from);

  // The checkpoint of state.step at the checkpoint interval: written by rank 0 (after setting the
  // state's elapsed time) and printed; every rank records it. During a spike (`in_spike`) the last
  // good checkpoint stays the one before it and is kept through rotation.
  void save_interval(TrainingState& state, double elapsed_s, bool in_spike, const Console& console);
  // The checkpoint of the step a stop signal ended on, unless the interval wrote it already.
  void save_before_stop(TrainingState& state, double elapsed_s, bool in_spike);

  const std::optional<std::filesystem::path>& last_good() const { return last_good_; }
  std::string last_good_text() const;
  // How to go on after a divergence: resume from the last good checkpoint with a lower learning rate.
  std::string resume_advice() const;

 private:
  std::optional<std::filesystem::path> write(const TrainingState& state, bool in_spike);  // on rank 0

  std::filesystem::path run_dir_, saved_config_;
  bool root_;
  const Trainer& trainer_;
  CheckpointOptions options_;
  std::optional<std::filesystem::path> last_good_;
  int64_t saved_step_ = -1;
};

// Feeds each step's loss to a LossSpikeDetector and tells the user when a spike begins and ends.
// Every rank sees the same step losses bit for bit (Trainer::step sums each loss slot, written by
// one rank, with zeros from the others, which is exact), so every rank calls the same spikes and
// names the same last good checkpoint without communicating.
class SpikeWatch {
 public:
  void observe(int64_t step, double loss, const RunCheckpoints& checkpoints, const Console& console);
  bool in_spike() const { return detector_.in_spike(); }
  int64_t spike_step() const { return spike_step_; }  // first step of the spike in progress

 private:
  LossSpikeDetector detector_;
  int64_t spike_step_ = -1;
};

}  // namespace nibble::train
