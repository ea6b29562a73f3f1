// What the training loop records of its steps: every log interval, the averages over the steps
// since the last logged one, appended to RUN/metrics.jsonl (and TensorBoard) and printed as one
// line; between them, on a terminal, an in-place status line; and every evaluation.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>

#include "run/console.h"
#include "run/metrics.h"
#include "train/distributed.h"

namespace nibble::train {

struct StepLogShape {
  int64_t tokens_per_step = 0;  // the whole job's
  int64_t total_steps = 0;
  double flops_per_token = 0;
  double job_peak_flops = 0;    // the FP32 peak times the ranks: MFU is over the whole job
};

class StepLog {
 public:
  // Rank 0 writes the files (`root`); `resumed_step` >= 0 keeps metrics.jsonl's records up to it.
  StepLog(const std::filesystem::path& run_dir, bool root, bool tensorboard, int64_t resumed_step,
          const StepLogShape& shape, const Communicator& comm, const Console& console);

  // A step of `seconds` is done: counted into the window of the next logged step.
  void add_step_time(double seconds);
  // The logged step `step`: its record written and printed; the window starts again.
  void log_step(int64_t step, int64_t tokens, double loss, double lr, double grad_norm, double elapsed_s);
  // A step whose loss or gradient norm is not finite: its record, for the history, not printed.
  void log_failed_step(const StepRecord& record);
  void log_eval(const EvalRecord& record);
  // Between logged steps: "step S/T | loss L | M ms/step" in place, on a terminal only.
  void show_progress(int64_t step, double loss, double seconds) const;

 private:
  StepLogShape shape_;
  const Communicator& comm_;
  const Console& console_;
  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  double window_time_ = 0, window_comm_start_ = 0;
  int64_t window_steps_ = 0;
};

}  // namespace nibble::train
