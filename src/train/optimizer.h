// AdamW with decoupled weight decay (Loshchilov & Hutter), global-norm gradient clipping, and the
// learning-rate schedules. FP32 state in arrays parallel to the parameter arena.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/params.h"
#include "ops/backend.h"

namespace nibble::train {

struct AdamWConfig {
  float beta1 = 0.9f, beta2 = 0.99f, eps = 1e-8f;
  float weight_decay = 0.1f;  // applied only to parameters with ParamInfo::weight_decay
  float clip_norm = 1.0f;     // <= 0: no clipping
};

class AdamW {
 public:
  // The state lives in the memory of `backend`, the backend of the arena it updates.
  AdamW(const model::ParamArena& params, const AdamWConfig& config, ops::Backend& backend);
  // One update with learning rate lr from the gradients in the arena (clipped first). Returns
  // the global gradient norm before clipping. Deterministic for any thread count.
  double step(model::ParamArena& params, float lr);
  int64_t steps() const { return t_; }
  // Checkpoint access (train/checkpoint.h): host copies of the moment estimates, parallel to the
  // arena, and the step count that drives bias correction, so a resumed run continues bit for bit.
  std::vector<float> first_moments() const;
  std::vector<float> second_moments() const;
  // UsageError when the sizes are not the arena's.
  void set_moments(std::span<const float> first, std::span<const float> second);
  void set_steps(int64_t steps) { t_ = steps; }

 private:
  AdamWConfig config_;
  ops::Backend& backend_;
  ops::Array<float> m_, v_;
  ops::Array<uint8_t> decay_;  // per element: 1 where weight decay applies
  int64_t t_ = 0;
};

// The L2 norm of all gradients, summed in double in fixed-size chunks whose partial sums are
// added in order, so the result does not depend on the thread count.
double global_grad_norm(std::span<const float> grads, ops::Backend& backend);

enum class Schedule : uint8_t { cosine, wsd, constant };
Schedule parse_schedule(std::string_view s);  // UsageError listing the names

struct ScheduleConfig {
  Schedule kind = Schedule::cosine;
  float lr = 1e-3f;
  float min_lr = 1e-4f;
  int64_t warmup_steps = 100;
  int64_t total_steps = 2000;
  float wsd_decay_fraction = 0.2f;  // WSD: the last fraction of steps decays linearly to min_lr
  void validate() const;
};

// Learning rate at optimizer step `step` (0-based): linear warmup from lr/warmup to lr, then
// cosine to min_lr at total_steps (cosine), or constant until the decay phase and then linear to
// min_lr (warmup-stable-decay), or constant.
float learning_rate(const ScheduleConfig& s, int64_t step);

}  // namespace nibble::train
