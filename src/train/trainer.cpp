#include "train/trainer.h"


#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

namespace nibble::train {

namespace {
// Validation batches use their own stream so that every run and recipe evaluates the same windows.
constexpr uint64_t kValidationSeed = 0x5EED0F0A1DA7Aull;

// Zeroes `values` (backend memory) and gives the memory inside it back (TensorOps::discard_to_zero):
// ZeRO-2's gradients outside the buckets in use. The backward pass commits each stretch before it
// writes it (model/params.h).
void release_to_zero(ops::TensorOps& ops, std::span<float> values) { ops.discard_to_zero(values.data(), values.size_bytes()); }

// Under mpirun with device=cuda each rank takes a GPU of its own (train/distributed.h).
ops::Backend& backend_of(const TrainConfig& c, Communicator* comm) {
  if (c.device == ops::Device::cuda && comm) return connect_gpu(*comm);
  return ops::backend(c.device);
}

std::unique_ptr<model::Transformer> make_model(const TrainConfig& c, Communicator* comm) {
  c.validate();
  check_shard_mode_runs_on(c.shard, c.device, comm ? comm->size() : 1);
  auto model = std::make_unique<model::Transformer>(c.model, backend_of(c, comm), c.seed);
  // ZeRO-2 and ZeRO-3: the arena's zeroed gradients would otherwise stay resident from allocation until the
  // first step, under the optimizer's state: a start-up peak above the training's.
  if (reduces_gradient_buckets(c.shard)) release_to_zero(model->backend(), model->params().grads());
  return model;
}

// The corpus's 90/10 split (data/data.h) as two streams owning their tokens.
std::pair<TokenStream, TokenStream> split_streams(const std::vector<int32_t>& corpus) {
  TokenSplit split = split_tokens(corpus);
  return {TokenStream(std::move(split.train)), TokenStream(std::move(split.val))};
}

// One source as a mixture of one: trains exactly as before mixtures existed.
std::vector<TrainSource> single_source(TokenStream train, TokenStream val) {
  std::vector<TrainSource> one(1);
  one[0].train = std::move(train);
  one[0].val = std::move(val);
  return one;
}

// A source too short for a window is named (the sampler's own message names only the split).
template <typename F>
auto for_source(const std::vector<TrainSource>& sources, size_t s, F make) {
  try {
    return make();
  } catch (const UsageError& e) {
    if (sources.size() == 1) throw;
    throw UsageError("data.sources: source '" + sources[s].name + "': " + e.what());
  }
}

MixtureSampler mixture_sampler(const std::vector<TrainSource>& sources, int64_t seq, const TrainConfig& c) {
  std::vector<TokenStream> streams;
  std::vector<double> weights;
  for (size_t s = 0; s < sources.size(); ++s) {
    for_source(sources, s, [&] { return BatchSampler(sources[s].train, seq, c.seed); });
    streams.push_back(sources[s].train);
    weights.push_back(sources[s].weight);
  }
  return MixtureSampler(std::move(streams), weights, seq, c.seed, c.batch);
}

std::vector<BatchSampler> validation_samplers(const std::vector<TrainSource>& sources, int64_t seq) {
  std::vector<BatchSampler> samplers;
  for (size_t s = 0; s < sources.size(); ++s)
    samplers.push_back(for_source(sources, s, [&] { return BatchSampler(sources[s].val, seq, kValidationSeed); }));
  return samplers;
}

std::vector<double> normalised_weights(const std::vector<TrainSource>& sources) {
  double total = 0;
  for (const TrainSource& s : sources) total += s.weight;
  std::vector<double> w;
  for (const TrainSource& s : sources) w.push_back(sources.size() == 1 ? 1.0 : s.weight / total);
  return w;
}

// ZeRO-1's slices of the arena over the ranks (train/distributed.h), or none.
std::optional<AdamWShards> optimizer_shards_of(const TrainConfig& c, const model::Transformer& model,
                                               Communicator& comm) {
  if (c.shard == ShardMode::none) return std::nullopt;
  return AdamWShards{&comm, optimizer_shards(static_cast<int64_t>(model.params().values().size()), comm.size(), c.shard),
                     /*gather_weights=*/c.shard != ShardMode::full};
}

// distributed.shard=full: this rank keeps the weights of its slice (AdamW's) and gathers the rest
// per phase; the model asks for them.
std::unique_ptr<WeightShards> weight_shards_of(const TrainConfig& c, model::Transformer& model, Communicator& comm) {
  if (c.shard != ShardMode::full) return nullptr;
  auto shards = std::make_unique<WeightShards>(
      comm, optimizer_shards(static_cast<int64_t>(model.params().values().size()), comm.size(), c.shard),
      model.params(), model.backend(), c.fp4_param_gather);
  model.set_weight_provider(shards.get());
  return shards;
}

// Rows of each micro-batch this process runs: the recipe's tokens per micro-batch follow from them.
int64_t rows_per_slice(const TrainConfig& c, const Communicator* comm) {
  return DataParallelPlan(c.batch, c.grad_accum, comm ? comm->rank() : 0, comm ? comm->size() : 1).rows_per_slice();
}
}  // namespace

void TrainConfig::validate() const {
  model.validate();
  schedule.validate();
  const int64_t s = seq > 0 ? seq : model.context;
  if (s > model.context)
    throw UsageError("seq=" + std::to_string(seq) + " exceeds model.context=" + std::to_string(model.context) +
                     ": lower seq or raise model.context");
  if (batch <= 0) throw UsageError("batch=" + std::to_string(batch) + " must be positive");
  if (grad_accum <= 0) throw UsageError("grad_accum=" + std::to_string(grad_accum) + " must be positive");
  if (eval_batches <= 0) throw UsageError("eval.batches=" + std::to_string(eval_batches) + " must be positive");
  if (telemetry_interval < 0) throw UsageError("telemetry_interval must be >= 0");
}

Trainer::Trainer(const TrainConfig& config, const std::vector<int32_t>& corpus, Communicator* comm)
    : Trainer(config, split_streams(corpus), comm) {}

Trainer::Trainer(const TrainConfig& config, std::pair<TokenStream, TokenStream> split, Communicator* comm)
    : Trainer(config, std::move(split.first), std::move(split.second), comm) {}

Trainer::Trainer(const TrainConfig& config, TokenStream train, TokenStream val, Communicator* comm)
    : Trainer(config, single_source(std::move(train), std::move(val)), comm) {}

Trainer::Trainer(const TrainConfig& config, std::vector<TrainSource> sources, Communicator* comm)
    : config_(config),
      seq_(config.seq > 0 ? config.seq : config.model.context),
      comm_(comm ? comm : &single_process_),
      model_(make_model(config, comm)),
      weight_shards_(weight_shards_of(config, *model_, *comm_)),
      recipe_(std::make_unique<Recipe>(config.recipe, static_cast<int>(config.model.layers),
                                       model_->block_linear_shapes(), rows_per_slice(config, comm) * seq_,
                                       model_->backend())),
      optimizer_(model_->params(), config.optimizer, model_->backend(), optimizer_shards_of(config, *model_, *comm_)),
      train_sampler_(mixture_sampler(sources, seq_, config)),
      val_samplers_(validation_samplers(sources, seq_)),
      val_weights_(normalised_weights(sources)),
      plan_(config.batch, config.grad_accum, comm_->rank(), comm_->size()),
      gradient_sum_(model_->backend()) {}

double Trainer::progress() const {
  return static_cast<double>(optimizer_.steps()) / static_cast<double>(config_.schedule.total_steps);
}

StepResult Trainer::step() {
  const int64_t step = optimizer_.steps();
  const bool stats = config_.telemetry_interval > 0 && step % config_.telemetry_interval == 0;
  // This rank's slices of the step's global batch (all of it on one process). Each slice's gradient
  // starts from zero and joins the others along GradientSum's fixed tree, then across ranks, so the
  // sum does not depend on how the slices are spread over processes (train/distributed.h).
  const auto& slices = plan_.slices();
  const auto grads = model_->params().grads();
  const int64_t gathered_before = weight_shards_ ? weight_shards_->gathered_bytes() : 0;
  const int64_t quantized_before = weight_shards_ ? weight_shards_->gathered_quantized_bytes() : 0;
  const bool bucketed = reduces_gradient_buckets(config_.shard);
  std::vector<double> slice_losses(static_cast<size_t>(plan_.loss_slots()), 0.0);
  for (size_t i = 0; i < slices.size(); ++i) {
    const MicroBatchSlice& slice = slices[i];
    const int64_t micro = static_cast<int64_t>(i);
    const int64_t micro_step = step * config_.grad_accum + slice.micro_batch;
    const auto sampling = std::chrono::steady_clock::now();
    train_sampler_.sample_rows(micro_step, slice.first_row, slice.rows, inputs_, targets_);
    data_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - sampling).count();
    // ZeRO-2/3 start a step holding only this rank's slice of the gradient (the rest went back with
    // its bucket): the slice is zeroed in place, the rest released again (a no-op but where a bucket
    // edge kept memory), so that the backward pass commits what it writes. After a micro-batch the
    // whole gradient is held (the micro-batches' tree sum needs it) and is zeroed in place:
    // releasing it would only fault every page back in.
    if (bucketed && i == 0)
      zero_all_but_release_unowned(grads);
    else
      model_->params().zero_grads();
    model::ModelStep ms;
    ms.recipe = recipe_.get();
    ms.progress = progress();
    ms.run_seed = config_.seed;
    ms.micro_step = micro_step;
    ms.weight_version = step;
    ms.collect_stats = stats && micro == 0;
    slice_losses[static_cast<size_t>(slice.loss_slot)] =
        model_->forward(inputs_, targets_, slice.rows, seq_, ms) * plan_.loss_weight();
    if (bucketed && i + 1 == slices.size()) {
      backward_reducing_buckets();
    } else {
      model_->backward(plan_.gradient_scale());
      if (slices.size() > 1) gradient_sum_.add(grads);
    }
    if (ms.collect_stats) telemetry_ = model_->telemetry();
  }
  if (!bucketed) {
    if (slices.size() > 1) gradient_sum_.finish(grads);
    // ZeRO-1: only this rank's slice of the sum is needed (AdamW::step all-gathers the weights).
    if (optimizer_.sharded())
      comm_->reduce_scatter_gradients(grads, optimizer_.shards()->layout);
    else
      comm_->sum_gradients(grads);
  }
  // Every slot has one writer, so the sum over ranks is exact and the loss is added in global order.
  comm_->sum(slice_losses);
  double loss = 0;
  for (double l : slice_losses) loss += l;
  StepResult r;
  r.lr = learning_rate(config_.schedule, step);
  r.grad_norm = optimizer_.step(model_->params(), r.lr);
  r.loss = loss / static_cast<double>(config_.grad_accum);
  r.step = optimizer_.steps();
  ++steps_run_;
  if (weight_shards_) {
    step_gathered_bytes_ += weight_shards_->gathered_bytes() - gathered_before;
    step_gathered_quantized_bytes_ += weight_shards_->gathered_quantized_bytes() - quantized_before;
  }
  return r;
}

void Trainer::zero_all_but_release_unowned(std::span<float> grads) {
  ops::TensorOps& ops = model_->backend();
  const ShardLayout& layout = optimizer_.shards()->layout;
  const int64_t mine_begin = layout.begin(comm_->rank()), mine_end = layout.end(comm_->rank());
  const size_t mine_bytes = static_cast<size_t>(mine_end - mine_begin) * sizeof(float);
  ops.commit(grads.data() + mine_begin, mine_bytes);  // released at start-up
  ops.fill_zero(grads.data() + mine_begin, mine_bytes);
  layout.for_each_unowned(comm_->rank(), 0, layout.total(), [&](int64_t b, int64_t e) {
    release_to_zero(ops, grads.subspan(static_cast<size_t>(b), static_cast<size_t>(e - b)));
  });
}

// ZeRO-2: the last micro-batch's backward pass, each completed stretch of the arena (a block, the
// head, the embedding) finished with the earlier micro-batches' tree sum and reduce-scattered at
// once, while the backward pass goes on. A finished bucket keeps only this rank's slice: the rest
// of its pages go back to the system, so the gradient held is the slice plus the buckets in flight.
void Trainer::backward_reducing_buckets() {
  const auto grads = model_->params().grads();
  const ShardLayout& layout = optimizer_.shards()->layout;
  const int64_t total = static_cast<int64_t>(grads.size()), mine = layout.begin(comm_->rank());
  const auto release_finished = [&](size_t keep_in_flight) {
    for (const auto& [begin, end] : comm_->poll_reduce_scatters(keep_in_flight))
      layout.for_each_unowned(comm_->rank(), begin, end, [&](int64_t b, int64_t e) {
        // Buckets finish from the arena's end, so everything above this one is finished: released
        // up to this rank's slice (or the end), the page or GPU chunk that straddles this bucket
        // and the one finished before it goes back too.
        if (e == end) e = mine >= end ? mine : total;
        release_to_zero(model_->backend(), grads.subspan(static_cast<size_t>(b), static_cast<size_t>(e - b)));
      });
  };
  const bool several = plan_.slices().size() > 1;
  int64_t end = static_cast<int64_t>(grads.size());
  model_->backward(plan_.gradient_scale(), [&](int64_t first) {
    if (several) gradient_sum_.finish_piece_with_last(grads, first, end);
    comm_->start_reduce_scatter(grads, first, end, layout);
    end = first;
    release_finished(kGradientBucketsInFlight);
  });
  if (several) gradient_sum_.start_over();
  release_finished(0);
}

Validation Trainer::evaluate_sources() {
  model::ModelStep ms;
  ms.recipe = recipe_.get();
  ms.progress = progress();
  ms.run_seed = config_.seed ^ kValidationSeed;
  ms.weight_version = optimizer_.steps();
  ms.training = false;
  Validation v;
  for (size_t s = 0; s < val_samplers_.size(); ++s) {
    v.per_source.push_back(evaluate_source(s, ms));
    v.loss += val_weights_[s] * v.per_source.back();  // 0 + 1.0 * loss: one source's loss exactly
  }
  return v;
}

// Mean loss over eval_batches batches of source `source`'s validation tokens.
double Trainer::evaluate_source(size_t source, model::ModelStep& ms) {
  double total = 0;
  // Ranks take every ranks()-th validation batch; the per-batch losses are added in batch order.
  std::vector<double> batch_losses(static_cast<size_t>(config_.eval_batches), 0.0);
  // With sharded weights every forward is collective (its gathers), so every rank runs as many: a
  // rank past the last batch runs the last one again and keeps nothing of it.
  const int64_t rounds = weight_shards_ ? (config_.eval_batches + plan_.ranks() - 1) / plan_.ranks() : 0;
  for (int64_t b = plan_.rank(), round = 0; b < config_.eval_batches || round < rounds; b += plan_.ranks(), ++round) {
    const int64_t batch = std::min(b, config_.eval_batches - 1);
    val_samplers_[source].sample(batch, config_.batch, inputs_, targets_);
    ms.micro_step = -1 - batch;
    const double l = model_->forward(inputs_, targets_, config_.batch, seq_, ms);
    if (b < config_.eval_batches) batch_losses[static_cast<size_t>(b)] = l;
  }
  comm_->sum(batch_losses);
  for (double l : batch_losses) total += l;
  return total / static_cast<double>(config_.eval_batches);
}

}  // namespace nibble::train
