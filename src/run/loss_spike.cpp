#include "run/loss_spike.h"

#include <algorithm>
#include <cmath>

namespace nibble::train {

double LossSpikeDetector::threshold() const {
  return std::max(kStddevs * std::sqrt(variance_), kRelative * std::abs(mean_));
}

LossSpikeDetector::Event LossSpikeDetector::observe(double loss) {
  if (!std::isfinite(loss)) return Event::none;
  const bool above = observations_ >= kWarmupObservations && loss > mean_ + threshold();
  if (in_spike_) {
    if (above) return Event::spike_continues;
    in_spike_ = false;
    update(loss);
    return Event::spike_ends;
  }
  if (above) {
    in_spike_ = true;
    return Event::spike_begins;
  }
  update(loss);
  return Event::none;
}

void LossSpikeDetector::update(double loss) {
  ++observations_;
  // 1 / n at first: the plain running mean and (population) variance, so the averages do not
  // start biased towards zero; then the fixed weight of an exponential moving average.
  const double weight = std::max(kSmoothing, 1.0 / static_cast<double>(observations_));
  const double deviation = loss - mean_;
  mean_ += weight * deviation;
  variance_ = (1.0 - weight) * (variance_ + weight * deviation * deviation);
}

}  // namespace nibble::train
