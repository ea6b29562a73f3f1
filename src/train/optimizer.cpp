#include "train/optimizer.h"

#include <algorithm>
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

AdamW::AdamW(const model::ParamArena& params, const AdamWConfig& config, ops::Backend& backend,
             std::optional<AdamWShards> shards)
    : config_(config), backend_(backend), shards_(std::move(shards)), m_(backend), v_(backend), decay_(backend) {
  if (!(config.beta1 >= 0 && config.beta1 < 1 && config.beta2 >= 0 && config.beta2 < 1))
    throw UsageError("optimizer.beta1=" + std::to_string(config.beta1) + " and optimizer.beta2=" +
                     std::to_string(config.beta2) + " must lie in [0, 1)");
  if (!(config.eps > 0)) throw UsageError("optimizer.eps=" + std::to_string(config.eps) + " must be positive");
  if (!(config.weight_decay >= 0))
    throw UsageError("optimizer.weight_decay=" + std::to_string(config.weight_decay) + " must be >= 0");
  arena_size_ = static_cast<int64_t>(params.values().size());
  int64_t end = arena_size_;
  if (shards_) {
    const int rank = shards_->comm->rank();
    NIBBLE_CHECK(shards_->layout.ranks() == shards_->comm->size() && shards_->layout.total() == arena_size_,
                 "AdamW shards: one slice per rank over the whole arena");
    begin_ = shards_->layout.begin(rank);
    end = shards_->layout.end(rank);
  }
  const size_t n = static_cast<size_t>(end - begin_);
  m_.resize_zeroed(n);
  v_.resize_zeroed(n);
  // The weight-decay flags of the owned elements (parameters cut by the slice's edges included).
  std::vector<uint8_t> decay(n, 0);
  for (const auto& p : params.params()) {
    const int64_t from = std::max(p.offset, begin_), to = std::min(p.offset + p.size(), end);
    if (p.weight_decay && from < to) std::fill(decay.begin() + (from - begin_), decay.begin() + (to - begin_), 1);
  }
  decay_.assign_from_host(decay.data(), n);
}

std::vector<float> AdamW::first_moments() const {
  NIBBLE_CHECK(!shards_, "AdamW::first_moments of a sharded optimizer: use gather_state()");
  return m_.to_host();
}

std::vector<float> AdamW::second_moments() const {
  NIBBLE_CHECK(!shards_, "AdamW::second_moments of a sharded optimizer: use gather_state()");
  return v_.to_host();
}

AdamWState AdamW::gather_state() const {
  if (!shards_) return {first_moments(), second_moments(), t_};
  const ShardLayout bytes = shards_->layout.scaled(sizeof(float));
  const bool root = shards_->comm->rank() == 0;
  AdamWState whole;
  whole.steps = t_;
  // On the CPU the moments are host memory, sent in place: a host copy would add a slice's size to
  // every rank's memory at each checkpoint.
  const bool host = backend_.device() == ops::Device::cpu;
  for (auto [mine, out] : {std::pair{&m_, &whole.first}, std::pair{&v_, &whole.second}}) {
    const std::vector<float> copy = host ? std::vector<float>() : mine->to_host();
    const std::span<const float> slice = host ? std::span<const float>(mine->data(), mine->size()) : std::span(copy);
    if (root) out->resize(static_cast<size_t>(arena_size_));
    shards_->comm->gather_shards_to_root(std::as_bytes(slice), std::as_writable_bytes(std::span(*out)), bytes);
  }
  return whole;
}

void AdamW::scatter_state(const AdamWState& whole) {
  if (!shards_) {
    set_moments(whole.first, whole.second);
    set_steps(whole.steps);
    return;
  }
  Communicator& comm = *shards_->comm;
  // Rank 0 checks the sizes and tells the others, so that a mismatch is refused on every rank.
  int64_t sizes_fit = comm.rank() != 0 || (static_cast<int64_t>(whole.first.size()) == arena_size_ &&
                                           static_cast<int64_t>(whole.second.size()) == arena_size_);
  comm.broadcast_values(std::span(&sizes_fit, 1), 0);
  if (!sizes_fit)
    throw UsageError("AdamW moments: " + std::to_string(whole.first.size()) + " and " +
                     std::to_string(whole.second.size()) + " values given for " + std::to_string(arena_size_) +
                     " parameters");
  const ShardLayout bytes = shards_->layout.scaled(sizeof(float));
  const bool host = backend_.device() == ops::Device::cpu;  // received in place, as gather_state sends
  for (auto [from, mine] : {std::pair{&whole.first, &m_}, std::pair{&whole.second, &v_}}) {
    std::vector<float> copy(host ? 0 : mine->size());
    const std::span<float> slice = host ? std::span<float>(mine->data(), mine->size()) : std::span(copy);
    comm.scatter_shards_from_root(std::as_bytes(std::span(*from)), std::as_writable_bytes(slice), bytes);
    if (!host) mine->assign_from_host(copy.data(), copy.size());
  }
  int64_t steps = whole.steps;
  comm.broadcast_values(std::span(&steps, 1), 0);
  t_ = steps;
}

void AdamW::broadcast_state(Communicator& comm) {
  NIBBLE_CHECK(!shards_, "AdamW::broadcast_state of a sharded optimizer: use scatter_state()");
  for (ops::Array<float>* moments : {&m_, &v_}) {
    if (backend_.device() == ops::Device::cpu) {
      comm.broadcast_values(std::span(moments->data(), moments->size()), 0);
    } else {
      std::vector<float> host = moments->to_host();
      comm.broadcast_values(std::span(host), 0);
      moments->assign_from_host(host.data(), host.size());
    }
  }
  comm.broadcast_values(std::span(&t_, 1), 0);
}

void AdamW::set_moments(std::span<const float> first, std::span<const float> second) {
  NIBBLE_CHECK(!shards_, "AdamW::set_moments of a sharded optimizer: use scatter_state()");
  if (first.size() != m_.size() || second.size() != v_.size())
    throw UsageError("AdamW moments: " + std::to_string(first.size()) + " and " + std::to_string(second.size()) +
                     " values given for " + std::to_string(m_.size()) + " parameters");
  m_.assign_from_host(first.data(), first.size());
  v_.assign_from_host(second.data(), second.size());
}

// The one-process norm from the slices: each rank's chunk sums (its slice starts and ends on chunk
// edges, optimizer_shards) are gathered in rank order, i.e. chunk order, and added as
// sum_of_squares adds them.
double AdamW::sharded_grad_norm(std::span<const float> grads) {
  const std::vector<double> mine =
      backend_.sum_of_squares_by_chunk(grads.data() + begin_, static_cast<int64_t>(m_.size()));
  const ShardLayout& layout = shards_->layout;
  ShardLayout chunk_bytes;
  for (int64_t b : layout.bounds)
    chunk_bytes.bounds.push_back((b + ops::kSumOfSquaresChunk - 1) / ops::kSumOfSquaresChunk *
                                 static_cast<int64_t>(sizeof(double)));
  std::vector<double> all(static_cast<size_t>(chunk_bytes.total()) / sizeof(double));
  const int rank = shards_->comm->rank();
  NIBBLE_CHECK(static_cast<int64_t>(mine.size() * sizeof(double)) == chunk_bytes.size(rank),
               "a shard's chunk sums: its slice lies on chunk edges");
  std::copy(mine.begin(), mine.end(), all.begin() + chunk_bytes.begin(rank) / static_cast<int64_t>(sizeof(double)));
  shards_->comm->all_gather_shards(std::as_writable_bytes(std::span(all)), chunk_bytes);
  double total = 0;
  for (double p : all) total += p;
  return std::sqrt(total);
}

double AdamW::step(model::ParamArena& params, float lr) {
  auto grads = params.grads();
  auto values = params.values();
  const double norm = shards_ ? sharded_grad_norm(grads) : global_grad_norm(grads, backend_);
  const float clip = config_.clip_norm > 0 && norm > config_.clip_norm ? static_cast<float>(config_.clip_norm / norm) : 1.0f;
  ++t_;
  const float b1 = config_.beta1, b2 = config_.beta2;
  const float bias1 = 1.0f - static_cast<float>(std::pow(b1, static_cast<double>(t_)));
  const float bias2 = 1.0f - static_cast<float>(std::pow(b2, static_cast<double>(t_)));
  const float decay = lr * config_.weight_decay, eps = config_.eps;
  backend_.adamw_update({clip, b1, b2, bias1, bias2, decay, lr, eps}, grads.data() + begin_, m_.data(), v_.data(),
                        values.data() + begin_, decay_.data(), static_cast<int64_t>(m_.size()));
  if (shards_ && shards_->gather_weights) shards_->comm->all_gather_weights(values, shards_->layout);
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
