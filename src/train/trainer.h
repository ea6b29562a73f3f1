// The training loop: sample a batch, forward and backward through the model with the recipe,
// accumulate gradients over micro-batches, clip, step AdamW on the schedule, evaluate. Driven by a
// plain config struct so a YAML/CLI layer can fill it later.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/transformer.h"
#include "recipe/recipe.h"
#include "data/data.h"
#include "data/mixture.h"
#include "train/distributed.h"
#include "train/optimizer.h"
#include "train/weight_shards.h"

namespace nibble::train {

// ZeRO-2: gradient buckets whose reduce-scatter may still be unfinished when the backward pass
// completes the next one (beyond it, the trainer waits for the oldest): what the memory plan
// counts, with the bucket being written, on top of a rank's slice.
inline constexpr size_t kGradientBucketsInFlight = 1;

struct TrainConfig {
  model::ModelConfig model;
  RecipeConfig recipe;
  AdamWConfig optimizer;
  ScheduleConfig schedule;  // schedule.total_steps is the number of optimizer steps
  int64_t batch = 12;       // sequences per micro-batch
  int64_t seq = 0;          // 0: the model's context
  int64_t grad_accum = 1;   // micro-batches per optimizer step
  int64_t eval_batches = 50;
  int64_t telemetry_interval = 0;  // 0: off; else collect quant_stats every N steps
  uint64_t seed = 1337;
  ops::Device device = ops::Device::cpu;  // where the model, its gradients and AdamW's state live
  ShardMode shard = ShardMode::none;      // distributed.shard: what each rank keeps of AdamW's state (and weights)
  // distributed.fp4_param_gather: with shard=full, gather NVFP4-tiled linear weights quantized (train/weight_shards.h)
  bool fp4_param_gather = true;
  void validate() const;
};

// One source of a data mixture (data.sources): its tokens and its weight (any positive scale).
struct TrainSource {
  std::string name;
  double weight = 1;
  TokenStream train, val;
};

// A validation pass: `loss` is the weight-averaged mean of the per-source losses (sum of
// normalised weight x loss; the one loss itself for one source), each source evaluated on the same
// eval_batches batches of its own validation tokens every time.
struct Validation {
  double loss = 0;
  std::vector<double> per_source;  // in the order of the sources
};

struct StepResult {
  int64_t step = 0;   // optimizer steps done after this one
  double loss = 0;    // mean training loss over the step's micro-batches
  double grad_norm = 0;
  float lr = 0;
};

class Trainer {
 public:
  // corpus: the whole token stream; split 90/10 into train and validation.
  // comm: the ranks of a data-parallel job (train/distributed.h), which share every step's global
  // batch and sum their gradients; null trains on this process alone. UsageError when the global
  // batch cannot be divided between the ranks.
  // config.device picks the backend (ops::cpu() or ops::cuda(); UsageError naming the fix when there
  // is no usable GPU, and for device=cuda with several ranks, which this version does not support).
  Trainer(const TrainConfig& config, const std::vector<int32_t>& corpus, Communicator* comm = nullptr);
  // Training and validation tokens given apart (memory-mapped shards, data/pretokenized.h): the
  // same batches as the corpus constructor when `train` and `val` are its 90/10 split.
  Trainer(const TrainConfig& config, TokenStream train, TokenStream val, Communicator* comm = nullptr);
  // A mixture: each row of a step from one source, in the weights' proportions (data/mixture.h).
  // One source trains exactly as the constructor above. UsageError naming the source whose tokens
  // are too few for a window.
  Trainer(const TrainConfig& config, std::vector<TrainSource> sources, Communicator* comm = nullptr);

  StepResult step();
  // Mean loss over the same eval_batches validation batches every time (fixed seed), with the
  // recipe's forward at the current point of training.
  double evaluate() { return evaluate_sources().loss; }
  // The same, per source and overall.
  Validation evaluate_sources();
  int64_t steps_done() const { return optimizer_.steps(); }
  const TrainConfig& config() const { return config_; }
  model::Transformer& model() { return *model_; }
  const model::Transformer& model() const { return *model_; }
  const Recipe& recipe() const { return *recipe_; }
  // Checkpoints save and restore the optimizer state (moments and step count); the data position
  // and stochastic-rounding streams follow from the step count.
  AdamW& optimizer() { return optimizer_; }
  const AdamW& optimizer() const { return optimizer_; }
  // Telemetry of the last step that collected it (empty when telemetry is off).
  const std::vector<model::LinearTelemetry>& telemetry() const { return telemetry_; }
  // Seconds this process spent copying training windows out of the token stream (the loader's share
  // of a step, reported at the end of a run).
  double data_seconds() const { return data_seconds_; }
  const DataParallelPlan& data_parallel() const { return plan_; }
  Communicator& communicator() { return *comm_; }
  // distributed.shard=full: this rank's slice of the weights and the gathers of the rest (null in
  // the other modes). Checkpoints gather the whole on rank 0 through it.
  WeightShards* weight_shards() const { return weight_shards_.get(); }
  // distributed.shard=full: weight bytes this rank received in the all-gathers of the training steps
  // it ran (evaluation's excluded), per step; 0 in other modes or before a step.
  double gathered_bytes_per_step() const {
    return steps_run_ > 0 ? static_cast<double>(step_gathered_bytes_) / static_cast<double>(steps_run_) : 0.0;
  }
  // Of those, the linears' quantized weights (distributed.fp4_param_gather).
  double gathered_quantized_bytes_per_step() const {
    return steps_run_ > 0 ? static_cast<double>(step_gathered_quantized_bytes_) / static_cast<double>(steps_run_) : 0.0;
  }

 private:
  Trainer(const TrainConfig& config, std::pair<TokenStream, TokenStream> split, Communicator* comm);
  double progress() const;
  double evaluate_source(size_t source, model::ModelStep& ms);
  // ZeRO-2/3 at a step's start: this rank's slice of the gradient zeroed in place, the rest released.
  void zero_all_but_release_unowned(std::span<float> grads);
  void backward_reducing_buckets();

  TrainConfig config_;
  int64_t seq_;
  // Data parallelism: the ranks (this process alone without a communicator).
  SingleProcessCommunicator single_process_;
  Communicator* comm_;
  std::unique_ptr<model::Transformer> model_;
  // Made right after the model, before AdamW's state: see WeightShards' constructor.
  std::unique_ptr<WeightShards> weight_shards_;
  std::unique_ptr<Recipe> recipe_;
  AdamW optimizer_;
  MixtureSampler train_sampler_;
  std::vector<BatchSampler> val_samplers_;
  std::vector<double> val_weights_;  // normalised
  std::vector<int32_t> inputs_, targets_;
  std::vector<model::LinearTelemetry> telemetry_;
  double data_seconds_ = 0;
  int64_t steps_run_ = 0, step_gathered_bytes_ = 0, step_gathered_quantized_bytes_ = 0;
  // This rank's share of each step, and the fixed-order sum of its slices' gradients.
  DataParallelPlan plan_;
  GradientSum gradient_sum_;
};

}  // namespace nibble::train
