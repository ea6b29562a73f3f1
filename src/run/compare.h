// `nibble compare RUN...`: runs side by side — a table of their losses, speed and time, with the
// gap of each to the first run, and a PNG of loss against training tokens (cairo), so that e.g.
// an NVFP4 run and its BF16 baseline can be judged at a glance.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "run/metrics.h"

namespace nibble::train {

struct RunSummary {
  std::string name;          // the run directory's name
  std::filesystem::path dir;
  std::string quantization;  // from its config.yaml
  MetricsHistory history;
  int64_t steps = 0, tokens = 0;
  double final_train_loss = 0, final_val_loss = 0, best_val_loss = 0;
  double tokens_per_s = 0;   // median over the logged windows
  double wall_s = 0;
  bool has_val = false;
};

// UsageError when the directory has no metrics.jsonl or no training record yet.
RunSummary summarize_run(const std::filesystem::path& run_dir);
// Fixed-width text table; "gap" is each final validation loss relative to the first run's.
std::string comparison_table(const std::vector<RunSummary>& runs);
// Validation loss (thick, with points) and training loss (thin) against tokens, one colour per run;
// written atomically.
void plot_loss_curves(const std::vector<RunSummary>& runs, const std::filesystem::path& png_path);

}  // namespace nibble::train
