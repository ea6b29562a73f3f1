// `nibble sweep BASE.yaml key=v1,v2 ... [--variant "k=v k2=v2"]...`: an ablation in one command.
// The runs are every combination of the key=v1,v2 words, then each --variant, all on top of
// BASE.yaml; each trains into SWEEP/NAME (NAME: its overrides, e.g. quantization=nvfp4,nvfp4.rht=false)
// as `nibble train` would, as its own process, up to --parallel at a time. Resumable: a run whose
// final checkpoint exists is not run again and one with checkpoints resumes from its newest, so an
// interrupted sweep continues where it stopped. Then a table at equal tokens against a baseline run
// and the loss-vs-tokens plot of every run.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "run/compare.h"

namespace nibble::train {

struct SweepOptions {
  std::filesystem::path base_config;
  std::vector<std::string> grid;      // key=v1,v2 words: every combination is a run
  std::vector<std::string> variants;  // "k=v k2=v2": one run each, after the grid's
  std::filesystem::path dir;          // SWEEP: the runs' parent directory
  int64_t steps = 0;                  // every run's steps; 0: BASE's
  int parallel = 1;                   // runs at a time; each gets cores / parallel threads
  std::string baseline;               // the reference run's name; empty: the first run
  bool dry_run = false;               // list the runs and their state, run nothing
};

struct SweepRun {
  std::string name;                    // its overrides joined by ',': the directory name under SWEEP
  std::vector<std::string> overrides;  // key=value words on top of BASE
  int64_t steps = 0;                   // its resolved steps: the final checkpoint's step
};

// The runs, each config checked as `nibble train` checks it (keys, values, the recipe's own
// refusals) before anything runs. UsageError naming the word: a word that is not key=v1,v2, a key
// given twice, an empty value, two runs with the same settings, no run at all.
std::vector<SweepRun> plan_sweep(const SweepOptions& o);

enum class SweepRunState { to_start, to_resume, finished };
// finished: RUN/checkpoints/ holds the checkpoint of step `steps`; to_resume: it holds another.
SweepRunState sweep_run_state(const std::filesystem::path& run_dir, int64_t steps);

// The sweep: plan_sweep, then every run not finished through `nibble_program train ...`, then the
// table and SWEEP/sweep.png. Returns the exit status: 0 when every run finished, 1 when one failed
// (its log named), 128 + the signal when SIGINT or SIGTERM stopped it (each running run then
// writes a checkpoint and stops; the next sweep resumes them).
int run_sweep(const SweepOptions& o, const std::string& nibble_program);

// The comparison at equal tokens: each run's validation loss at the tokens every run reached (its
// last evaluation at or before them), its best, and the gap to runs[baseline] in % and in nats.
std::string sweep_table(const std::vector<RunSummary>& runs, size_t baseline);

}  // namespace nibble::train
