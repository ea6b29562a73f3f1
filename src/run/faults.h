// Faults a test injects into a run, to check what the run driver does when a rank crashes, a step
// fails, the loss spikes or the process dies while writing a checkpoint. A production run injects
// none (the default FaultPlan); only the tests' driver program (tests/support/nibble_with_faults.cpp)
// builds one, so no code path of the library reads the environment for them.
#pragma once
#include <cstdint>
#include <optional>

namespace nibble::train {

struct FaultPlan {
  struct RankStep {
    int rank = -1;
    int64_t step = -1;
    bool at(int r, int64_t s) const { return rank == r && step == s; }
  };
  // That rank exits with status 17 just before that step, as a crashed rank would.
  RankStep rank_exits;
  // That rank's step fails as a quantizer meeting non-finite activations would (NumericalError).
  RankStep rank_step_fails;
  // From this step on, the loss the driver sees is kSpikeAddedLoss higher (the training itself is
  // unchanged): a loss spike for the detector.
  int64_t loss_spike_from = -1;
  static constexpr double kSpikeAddedLoss = 10.0;
  // The loss the driver sees at this step is NaN.
  int64_t loss_nan_at = -1;
  // The process kills itself with SIGKILL after writing the weights of the checkpoint of this step
  // (any step when kAnyStep) and before its rename, as a crash mid-checkpoint would.
  std::optional<int64_t> kill_during_checkpoint;
  static constexpr int64_t kAnyStep = -1;
};

}  // namespace nibble::train
