#include "run/step_log.h"

#include <fmt/format.h>

#include "run/run.h"

namespace nibble::train {

namespace fs = std::filesystem;

StepLog::StepLog(const fs::path& run_dir, bool root, bool tensorboard, int64_t resumed_step, const StepLogShape& shape,
                 const Communicator& comm, const Console& console)
    : shape_(shape), comm_(comm), console_(console), window_comm_start_(comm.gradient_sum_seconds()) {
  if (!root) return;
  metrics_ = std::make_unique<MetricsLog>(run_dir / kRunMetricsFile, resumed_step);
  if (!tensorboard) return;
  tensorboard_ = std::make_unique<TensorBoardWriter>(run_dir / kRunTensorBoardDir);
  console.print(fmt::format("tensorboard: {} (tensorboard --logdir {})\n", tensorboard_->path().string(),
                            (run_dir / kRunTensorBoardDir).string()));
}

void StepLog::add_step_time(double seconds) {
  window_time_ += seconds;
  ++window_steps_;
}

void StepLog::log_step(int64_t step, int64_t tokens, double loss, double lr, double grad_norm, double elapsed_s) {
  StepRecord rec;
  rec.step = step;
  rec.total_steps = shape_.total_steps;
  rec.tokens = tokens;
  rec.loss = loss;
  rec.lr = lr;
  rec.grad_norm = grad_norm;
  rec.step_time_s = window_time_ / static_cast<double>(window_steps_);
  rec.tokens_per_s = static_cast<double>(shape_.tokens_per_step) / rec.step_time_s;
  rec.mfu = shape_.flops_per_token * rec.tokens_per_s / shape_.job_peak_flops;
  rec.eta_s = rec.step_time_s * static_cast<double>(shape_.total_steps - step);
  rec.elapsed_s = elapsed_s;
  rec.ranks = comm_.size();
  rec.comm_fraction = (comm_.gradient_sum_seconds() - window_comm_start_) / window_time_;
  if (metrics_) metrics_->write(rec);
  if (tensorboard_) tensorboard_->write(rec);
  console_.print(console_.clear_line() + format_step_line(rec) + "\n");
  window_time_ = 0;
  window_comm_start_ = comm_.gradient_sum_seconds();
  window_steps_ = 0;
}

void StepLog::log_failed_step(const StepRecord& record) {
  if (metrics_) metrics_->write(record);
}

void StepLog::log_eval(const EvalRecord& record) {
  if (metrics_) metrics_->write(record);
  if (tensorboard_) tensorboard_->write(record);
  console_.print(console_.clear_line() + format_eval_line(record, shape_.total_steps) + "\n");
}

void StepLog::show_progress(int64_t step, double loss, double seconds) const {
  console_.live_status(fmt::format("step {}/{} | loss {:.4f} | {:.0f} ms/step", step, shape_.total_steps, loss,
                                   seconds * 1e3));
}

}  // namespace nibble::train
