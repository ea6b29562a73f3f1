#include "train/optimizer.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace nibble::train {

double global_grad_norm(std::span<const float> g, ops::Backend& backend) {
  return std::sqrt(backend.sum_of_squares(g.data(), static_cast<int64_t>(g.size())));
}

AdamW::AdamW(const model::ParamArena& params, const AdamWConfig& config, ops::Backend& backend)
    : config_(config), backend_(backend), m_(backend), v_(backend), decay_(backend) {
  if (!(config.beta1 >= 0 && config.beta1 < 1 && config.beta2 >= 0 && config.beta2 < 1))
    throw UsageError("optimizer.beta1=" + std::to_string(config.beta1) + " and optimizer.beta2=" +
                     std::to_string(config.beta2) + " must lie in [0, 1)");
  if (!(config.eps > 0)) throw UsageError("optimizer.eps=" + std::to_string(config.eps) + " must be positive");
  if (!(config.weight_decay >= 0))
    throw UsageError("optimizer.weight_decay=" + std::to_string(config.weight_decay) + " must be >= 0");
  const size_t n = params.values().size();
  m_.resize_zeroed(n);
  v_.resize_zeroed(n);
  std::vector<uint8_t> decay(n, 0);
  for (const auto& p : params.params())
    if (p.weight_decay) std::fill(decay.begin() + p.offset, decay.begin() + p.offset + p.size(), 1);
  decay_.assign_from_host(decay.data(), n);
}

std::vector<float> AdamW::first_moments() const { return m_.to_host(); }

std::vector<float> AdamW::second_moments() const { return v_.to_host(); }

void AdamW::set_moments(std::span<const float> first, std::span<const float> second) {
  if (first.size() != m_.size() || second.size() != v_.size())
    throw UsageError("AdamW moments: " + std::to_string(first.size()) + " and " + std::to_string(second.size()) +
                     " values given for " + std::to_string(m_.size()) + " parameters");
  m_.assign_from_host(first.data(), first.size());
  v_.assign_from_host(second.data(), second.size());
}

double AdamW::step(model::ParamArena& params, float lr) {
  auto grads = params.grads();
  auto values = params.values();
  const double norm = global_grad_norm(grads, backend_);
  const float clip = config_.clip_norm > 0 && norm > config_.clip_norm ? static_cast<float>(config_.clip_norm / norm) : 1.0f;
  ++t_;
  const float b1 = config_.beta1, b2 = config_.beta2;
  const float bias1 = 1.0f - static_cast<float>(std::pow(b1, static_cast<double>(t_)));
  const float bias2 = 1.0f - static_cast<float>(std::pow(b2, static_cast<double>(t_)));
  const float decay = lr * config_.weight_decay, eps = config_.eps;
  backend_.adamw_update({clip, b1, b2, bias1, bias2, decay, lr, eps}, grads.data(), m_.data(), v_.data(),
                        values.data(), decay_.data(), static_cast<int64_t>(values.size()));
  return norm;
}

Schedule parse_schedule(std::string_view s) {
  if (s == "cosine") return Schedule::cosine;
  if (s == "wsd") return Schedule::wsd;
  if (s == "constant") return Schedule::constant;
  throw UsageError("schedule '" + std::string(s) + "' is unknown: use cosine, wsd or constant");
}

void ScheduleConfig::validate() const {
  // Messages name the run config's keys (schedule.*, steps).
  if (!(lr > 0)) throw UsageError("schedule.lr=" + std::to_string(lr) + " must be positive");
  if (!(min_lr >= 0 && min_lr <= lr))
    throw UsageError("schedule.min_lr=" + std::to_string(min_lr) + " must lie in [0, schedule.lr=" +
                     std::to_string(lr) + "]");
  if (total_steps <= 0) throw UsageError("steps=" + std::to_string(total_steps) + " must be positive");
  if (warmup_steps < 0 || warmup_steps > total_steps)
    throw UsageError("schedule.warmup_steps=" + std::to_string(warmup_steps) + " must lie in [0, steps=" +
                     std::to_string(total_steps) + "]");
  if (!(wsd_decay_fraction >= 0 && wsd_decay_fraction <= 1))
    throw UsageError("schedule.wsd_decay_fraction=" + std::to_string(wsd_decay_fraction) + " must lie in [0, 1]");
}

float learning_rate(const ScheduleConfig& s, int64_t step) {
  if (step < s.warmup_steps) return s.lr * static_cast<float>(step + 1) / static_cast<float>(s.warmup_steps);
  switch (s.kind) {
    case Schedule::constant: return s.lr;
    case Schedule::cosine: {
      const int64_t span = std::max<int64_t>(1, s.total_steps - s.warmup_steps);
      const double progress = std::min(1.0, static_cast<double>(step - s.warmup_steps) / static_cast<double>(span));
      return s.min_lr + static_cast<float>(0.5 * (1.0 + std::cos(M_PI * progress))) * (s.lr - s.min_lr);
    }
    case Schedule::wsd: {
      const int64_t decay_steps = static_cast<int64_t>(std::llround(s.wsd_decay_fraction * static_cast<double>(s.total_steps)));
      const int64_t decay_start = s.total_steps - decay_steps;
      if (step < decay_start || decay_steps == 0) return s.lr;
      const double progress = std::min(1.0, static_cast<double>(step - decay_start) / static_cast<double>(decay_steps));
      return s.lr + static_cast<float>(progress) * (s.min_lr - s.lr);
    }
  }
  return s.lr;
}

}  // namespace nibble::train
