// AdamW with decoupled weight decay (Loshchilov & Hutter), global-norm gradient clipping, and the
// learning-rate schedules. FP32 state in arrays parallel to the parameter arena.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/params.h"
#include "ops/backend.h"
#include "train/distributed.h"

namespace nibble::train {

struct AdamWConfig {
  float beta1 = 0.9f, beta2 = 0.99f, eps = 1e-8f;
  float weight_decay = 0.1f;  // applied only to parameters with ParamInfo::weight_decay
  float clip_norm = 1.0f;     // <= 0: no clipping
};

// The whole optimizer state as host arrays parallel to the arena: what a checkpoint holds, whichever
// shard mode and rank count wrote it.
struct AdamWState {
  std::vector<float> first, second;  // the moment estimates
  int64_t steps = 0;                 // drives bias correction
};

// ZeRO-1 (distributed.shard=optimizer, train/distributed.h): the ranks that divide the state and
// their slices of the arena (optimizer_shards).
struct AdamWShards {
  Communicator* comm = nullptr;
  ShardLayout layout;
  // ZeRO-1 all-gathers the updated weights after each step; ZeRO-3 (distributed.shard=full) does
  // not: each rank keeps its slice and the model acquires the rest when it needs it.
  bool gather_weights = true;
};

class AdamW {
 public:
  // The state lives in the memory of `backend`, the backend of the arena it updates. With `shards`
  // this rank keeps the moments of its slice only.
  AdamW(const model::ParamArena& params, const AdamWConfig& config, ops::Backend& backend,
        std::optional<AdamWShards> shards = std::nullopt);
  // One update with learning rate lr from the gradients in the arena (clipped first). Returns
  // the global gradient norm before clipping. Deterministic for any thread count. Sharded
  // (collective): the gradients of this rank's slice must hold the sum over ranks (the rest are
  // not read); the norm adds every slice's chunk sums in the one-process order, each rank updates
  // its slice, and the weights are all-gathered (unless shards->gather_weights is false), so every
  // rank ends with the same whole arena.
  double step(model::ParamArena& params, float lr);
  int64_t steps() const { return t_; }
  bool sharded() const { return shards_.has_value(); }
  const std::optional<AdamWShards>& shards() const { return shards_; }
  // Elements of the arena whose state this rank holds: [owned_begin, owned_end).
  int64_t owned_begin() const { return begin_; }
  int64_t owned_end() const { return begin_ + static_cast<int64_t>(m_.size()); }
  // Bytes of optimizer state this process holds (moments and the weight-decay mask).
  int64_t state_bytes() const { return static_cast<int64_t>(m_.bytes() + v_.bytes() + decay_.bytes()); }

  // Checkpoint access (train/checkpoint.h) of an unsharded optimizer: host copies of the moment
  // estimates, parallel to the arena, and the step count that drives bias correction, so a resumed
  // run continues bit for bit.
  std::vector<float> first_moments() const;
  std::vector<float> second_moments() const;
  // UsageError when the sizes are not the arena's.
  void set_moments(std::span<const float> first, std::span<const float> second);
  void set_steps(int64_t steps) { t_ = steps; }
  // The whole state in any mode. Sharded, collective: the whole on rank 0, empty arrays elsewhere.
  AdamWState gather_state() const;
  // Sets it from a whole state. Sharded, collective: rank 0's `whole` is read (the others' is
  // ignored), each rank keeps its slice, and every rank takes rank 0's step count. UsageError when
  // the sizes are not the arena's (on rank 0; every rank throws it).
  void scatter_state(const AdamWState& whole);
  // Unsharded, collective: rank 0's moments and step count to every rank of `comm` (in place on the
  // CPU: no host copy of the state, which would be a start-up peak of memory above training's).
  void broadcast_state(Communicator& comm);

 private:
  double sharded_grad_norm(std::span<const float> grads);

  AdamWConfig config_;
  ops::Backend& backend_;
  std::optional<AdamWShards> shards_;
  int64_t begin_ = 0, arena_size_ = 0;  // the first element this rank holds; the whole arena's length
  ops::Array<float> m_, v_;    // the moments of [begin_, begin_ + size)
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
