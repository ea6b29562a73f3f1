#include "train/trainer.h"

namespace nibble::train {

namespace {
// Validation batches use their own stream so that every run and recipe evaluates the same windows.
constexpr uint64_t kValidationSeed = 0x5EED0F0A1DA7Aull;

std::unique_ptr<model::Transformer> make_model(const TrainConfig& c) {
  c.validate();
  auto m = std::make_unique<model::Transformer>(c.model);
  m->init_weights(c.seed);
  return m;
}
}  // namespace

void TrainConfig::validate() const {
  model.validate();
  schedule.validate();
  const int64_t s = seq > 0 ? seq : model.context;
  if (s > model.context)
    throw UsageError("seq=" + std::to_string(seq) + " exceeds the model context " + std::to_string(model.context));
  if (batch <= 0) throw UsageError("batch=" + std::to_string(batch) + " must be positive");
  if (grad_accum <= 0) throw UsageError("grad_accum=" + std::to_string(grad_accum) + " must be positive");
  if (eval_batches <= 0) throw UsageError("eval_batches=" + std::to_string(eval_batches) + " must be positive");
  if (telemetry_interval < 0) throw UsageError("telemetry_interval must be >= 0");
}

Trainer::Trainer(const TrainConfig& config, const std::vector<int32_t>& corpus)
    : config_(config),
      seq_(config.seq > 0 ? config.seq : config.model.context),
      split_(split_tokens(corpus)),
      model_(make_model(config)),
      recipe_(std::make_unique<Recipe>(config.recipe, static_cast<int>(config.model.layers),
                                       model_->block_linear_shapes(), config.batch * seq_)),
      optimizer_(model_->params(), config.optimizer),
      train_sampler_(&split_.train, seq_, config.seed),
      val_sampler_(&split_.val, seq_, kValidationSeed) {}

double Trainer::progress() const {
  return static_cast<double>(optimizer_.steps()) / static_cast<double>(config_.schedule.total_steps);
}

StepResult Trainer::step() {
  const int64_t step = optimizer_.steps();
  const bool stats = config_.telemetry_interval > 0 && step % config_.telemetry_interval == 0;
  model_->params().zero_grads();
  double loss = 0;
  for (int64_t micro = 0; micro < config_.grad_accum; ++micro) {
    const int64_t micro_step = step * config_.grad_accum + micro;
    train_sampler_.sample(micro_step, config_.batch, inputs_, targets_);
    model::ModelStep ms;
    ms.recipe = recipe_.get();
    ms.progress = progress();
    ms.run_seed = config_.seed;
    ms.micro_step = micro_step;
    ms.weight_version = step;
    ms.collect_stats = stats && micro == 0;
    loss += model_->forward(inputs_, targets_, config_.batch, seq_, ms);
    model_->backward(1.0f / static_cast<float>(config_.grad_accum));
    if (ms.collect_stats) telemetry_ = model_->telemetry();
  }
  StepResult r;
  r.lr = learning_rate(config_.schedule, step);
  r.grad_norm = optimizer_.step(model_->params(), r.lr);
  r.loss = loss / static_cast<double>(config_.grad_accum);
  r.step = optimizer_.steps();
  return r;
}

double Trainer::evaluate() {
  double total = 0;
  model::ModelStep ms;
  ms.recipe = recipe_.get();
  ms.progress = progress();
  ms.run_seed = config_.seed ^ kValidationSeed;
  ms.weight_version = optimizer_.steps();
  ms.training = false;
  for (int64_t b = 0; b < config_.eval_batches; ++b) {
    val_sampler_.sample(b, config_.batch, inputs_, targets_);
    ms.micro_step = -1 - b;
    total += model_->forward(inputs_, targets_, config_.batch, seq_, ms);
  }
  return total / static_cast<double>(config_.eval_batches);
}

}  // namespace nibble::train
