// LossSpikeDetector: quiet on the noise of a falling training loss, and a jump is caught at its
// first step, with the pre-spike average kept until the loss is back.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>
#include <vector>

#include "run/loss_spike.h"

using nibble::train::LossSpikeDetector;
using Event = LossSpikeDetector::Event;

namespace {

// Standard normal and uniform draws from mt19937_64's raw output (Box-Muller): the same numbers on
// every standard library, unlike std::normal_distribution, so the seeds below mean one curve.
class Noise {
 public:
  explicit Noise(uint64_t seed) : rng_(seed) {}
  double uniform() { return (static_cast<double>(rng_() >> 11) + 0.5) * 0x1p-53; }  // in (0, 1)
  double normal() {
    const double radius = std::sqrt(-2.0 * std::log(uniform()));  // drawn first: operand order is unspecified
    return radius * std::cos(2.0 * std::numbers::pi * uniform());
  }

 private:
  std::mt19937_64 rng_;
};

// A character-level loss falling from ln(65) ~ 4.2 towards 1.4: a fast fall over the first few
// hundred steps, then a slow one. Per step it carries 4% multiplicative Gaussian noise (the tiny
// test runs' losses vary by about 3% from step to step) and, on 2% of the steps, a hard batch
// 10% above the trend: small-batch training curves look like this. Over the 5 seeds below no loss
// comes above 0.75 of the spike threshold; over 2000 seeds x 5000 steps 3 false spikes are called
// (1 in about 3 million steps).
std::vector<double> noisy_falling_curve(uint64_t seed, int steps) {
  Noise noise(seed);
  std::vector<double> curve;
  for (int t = 0; t < steps; ++t) {
    const double trend = 1.4 + 1.8 * std::exp(-t / 150.0) + 1.0 * std::exp(-t / 3000.0);
    const double hard_batch = noise.uniform() < 0.02 ? 0.10 : 0.0;
    curve.push_back(trend * (1.0 + 0.04 * noise.normal() + hard_batch));
  }
  return curve;
}

}  // namespace

TEST(LossSpikeDetector, NoisyFallingLossRaisesNoSpike) {
  for (uint64_t seed : {1u, 2u, 3u, 4u, 5u}) {
    SCOPED_TRACE(seed);
    LossSpikeDetector detector;
    const auto curve = noisy_falling_curve(seed, 5000);
    for (size_t t = 0; t < curve.size(); ++t)
      ASSERT_EQ(detector.observe(curve[t]), Event::none) << "false spike at step " << t + 1 << ": loss " << curve[t]
                                                         << ", mean " << detector.mean();
    EXPECT_EQ(detector.observations(), 5000);
  }
}

TEST(LossSpikeDetector, AJumpIsCaughtAtItsFirstStepAndEndsWhenTheLossIsBack) {
  LossSpikeDetector detector;
  const auto curve = noisy_falling_curve(7, 3000);
  for (size_t t = 0; t < 2000; ++t) ASSERT_EQ(detector.observe(curve[t]), Event::none) << t;
  const double mean_before = detector.mean();
  // 40 steps of the loss 60% above its level (an instability), then back to the curve.
  for (size_t t = 2000; t < 2040; ++t) {
    const Event e = detector.observe(curve[t] * 1.6);
    EXPECT_EQ(e, t == 2000 ? Event::spike_begins : Event::spike_continues) << "step " << t + 1;
    EXPECT_TRUE(detector.in_spike());
    EXPECT_EQ(detector.mean(), mean_before) << "the spike must not become the new normal";
  }
  EXPECT_EQ(detector.observe(curve[2040]), Event::spike_ends);
  EXPECT_FALSE(detector.in_spike());
  for (size_t t = 2041; t < 2500; ++t) ASSERT_EQ(detector.observe(curve[t]), Event::none) << t;
  // A second instability is caught as well.
  EXPECT_EQ(detector.observe(curve[2500] * 2.0), Event::spike_begins);
}

TEST(LossSpikeDetector, NothingIsCalledDuringTheWarmUpOrForAFallOrANonFiniteLoss) {
  LossSpikeDetector detector;
  for (int t = 0; t < LossSpikeDetector::kWarmupObservations - 1; ++t) detector.observe(3.0 + 0.01 * (t % 3));
  EXPECT_EQ(detector.observe(30.0), Event::none) << "a call needs kWarmupObservations losses first";
  // The relative floor: 10% above a nearly constant loss is far beyond 6 sigma, but no spike.
  LossSpikeDetector flat;
  for (int t = 0; t < 200; ++t) flat.observe(3.0 + 0.01 * (t % 3));
  EXPECT_EQ(flat.observe(flat.mean() * 1.10), Event::none);
  EXPECT_EQ(flat.observe(flat.mean() * 1.30), Event::spike_begins);

  LossSpikeDetector falling;
  for (int t = 0; t < 200; ++t) falling.observe(3.0 + 0.01 * (t % 3));
  EXPECT_EQ(falling.observe(0.3), Event::none);  // the loss falling fast is no spike
  EXPECT_EQ(falling.observe(std::nan("")), Event::none);
  EXPECT_EQ(falling.observe(INFINITY), Event::none);
  EXPECT_EQ(falling.observations(), 201);
}
