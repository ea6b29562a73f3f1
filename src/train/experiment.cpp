#include "train/experiment.h"

#include <chrono>
#include <cmath>
#include <cstdio>

namespace nibble::train {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

double training_flops_per_token(const model::ModelConfig& m, int64_t seq) {
  const double d = static_cast<double>(m.width), hd = static_cast<double>(m.head_dim());
  const double qkv = d * (static_cast<double>(m.heads + 2 * m.kv_head_count()) * hd);
  const double per_block = qkv + static_cast<double>(m.heads) * hd * d + 3.0 * d * static_cast<double>(m.hidden());
  const double matmul_params = static_cast<double>(m.layers) * per_block + static_cast<double>(m.vocab) * d;
  return 6.0 * matmul_params + 12.0 * static_cast<double>(m.layers) * d * static_cast<double>(seq);
}

SpeedResult measure_training_speed(const TrainConfig& config, const std::vector<int32_t>& corpus, int64_t warmup,
                                   int64_t steps) {
  Trainer trainer(config, corpus);
  for (int64_t i = 0; i < warmup; ++i) trainer.step();
  trainer.model().reset_times();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) trainer.step();
  const double total = seconds_since(t0);
  SpeedResult r;
  const double n = static_cast<double>(steps);
  const int64_t seq = config.seq > 0 ? config.seq : config.model.context;
  r.step_s = total / n;
  r.tokens_per_s = static_cast<double>(config.batch * seq * config.grad_accum) / r.step_s;
  const LinearTimes lt = trainer.model().linear_times();
  r.gemm_s = (lt.gemm_s + trainer.model().head_gemm_seconds()) / n;
  r.quantize_s = lt.quantize_s / n;
  r.rest_s = r.step_s - r.gemm_s - r.quantize_s;
  r.achieved_flops = training_flops_per_token(config.model, seq) * r.tokens_per_s;
  return r;
}

QualityResult train_and_evaluate(const TrainConfig& config, const std::vector<int32_t>& corpus, int64_t eval_interval,
                                 const std::function<void(const std::string&)>& log) {
  Trainer trainer(config, corpus);
  QualityResult r;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t total = config.schedule.total_steps;
  std::vector<double> recent;
  for (int64_t s = 0; s < total; ++s) {
    StepResult st = trainer.step();
    if (!std::isfinite(st.loss))
      throw UsageError("training diverged at step " + std::to_string(st.step) + " under " + describe(config.recipe) +
                       ": lower the learning rate or keep more layers in BF16");
    recent.push_back(st.loss);
    if (recent.size() > 20) recent.erase(recent.begin());
    if ((eval_interval > 0 && st.step % eval_interval == 0) || st.step == total) {
      const double val = trainer.evaluate();
      r.val_curve.emplace_back(st.step, val);
      char line[200];
      std::snprintf(line, sizeof line, "  [%s] step %5lld  train %.4f  val %.4f  lr %.2e  |g| %.3f  %.0fs",
                    std::string(to_string(config.recipe.quantization)).c_str(), static_cast<long long>(st.step),
                    st.loss, val, static_cast<double>(st.lr), st.grad_norm, seconds_since(t0));
      if (log) log(line);
    }
  }
  r.val_loss = r.val_curve.back().second;
  double sum = 0;
  for (double l : recent) sum += l;
  r.train_loss = sum / static_cast<double>(recent.size());
  r.seconds = seconds_since(t0);
  return r;
}

}  // namespace nibble::train
