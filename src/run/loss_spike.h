// Loss spikes: a training loss that jumps far above its recent level (an instability that may
// recover or end in NaN a few hundred steps later). The run driver (train/run.h) watches every
// step's loss with a LossSpikeDetector so that, when the run diverges, the checkpoint it names as
// the last good one is the newest written before the spike began, not one written while the loss
// was already going wrong.
#pragma once
#include <cstdint>

namespace nibble::train {

// Keeps an exponential moving average of the loss and of its squared deviation from that average,
// and calls a loss a spike when it lies above the average by more than
// max(kStddevs * stddev, kRelative * average). While a spike lasts (an "episode") the average is
// frozen at its value before the spike, so the spike itself never becomes the new normal; the
// episode ends at the first loss back within the threshold of that frozen average.
//
// A false alarm costs a printed warning and a divergence message naming an older checkpoint than
// it could have; a missed spike costs nothing that was not the case without the detector. Hence
// the constants favour a low false-positive rate over sensitivity.
class LossSpikeDetector {
 public:
  // Losses seen before any spike can be called: the statistics of fewer are too noisy, and the
  // first steps of a run are its steepest fall (the average lags above the loss, which only makes
  // a call less likely, but the deviation estimate still needs a few samples).
  static constexpr int64_t kWarmupObservations = 20;
  // Weight of the newest loss in the averages: about the last 50 steps count. Long enough that
  // the per-step noise of small batches averages out, short enough that the slow fall of the
  // loss over a run does not inflate the deviation much. Until 1 / kSmoothing losses are seen the
  // averages are the plain mean and variance of all of them.
  static constexpr double kSmoothing = 0.02;
  // Six standard deviations: per-step losses are close to normal around the trend, with a heavier
  // upper tail from unusually hard batches; 6 sigma is beyond what thousands of steps of such
  // noise produce.
  static constexpr double kStddevs = 6.0;
  // And at least 25% above the average: a run whose loss is nearly constant (tiny deviation) must
  // not call a 2% bump a spike. Instabilities worth naming move the loss by far more than that.
  static constexpr double kRelative = 0.25;

  enum class Event : uint8_t {
    none,             // an ordinary loss (or one seen during the warm-up)
    spike_begins,     // the first loss of an episode
    spike_continues,  // a loss of an episode after its first
    spike_ends,       // the first loss back within the threshold: an ordinary loss again
  };

  // Feeds the loss of the next step. Non-finite losses are ignored (Event::none): the run stops on
  // them anyway, and they would poison the averages.
  Event observe(double loss);

  bool in_spike() const { return in_spike_; }
  // The recent average loss; during an episode, its value before the spike.
  double mean() const { return mean_; }
  // How far above mean() a loss has to be to count as a spike.
  double threshold() const;
  int64_t observations() const { return observations_; }

 private:
  void update(double loss);

  int64_t observations_ = 0;  // losses folded into the averages (spike losses are not)
  double mean_ = 0, variance_ = 0;
  bool in_spike_ = false;
};

}  // namespace nibble::train
