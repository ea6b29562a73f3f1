// What `nibble train` may do with the directory it is given as run.dir (docs/run-directory.md,
// "What protects a run"): write only inside it, only into names it owns, and delete only what it
// wrote. The checks run before anything is written; each throws UsageError naming the path and
// the fix.
#pragma once
#include <filesystem>
#include <span>
#include <string>

#include "run/config.h"

namespace nibble::train {

// The run directory a `nibble train CONFIG` trains in. When CONFIG is the config.yaml of a run
// directory (what the stop message and the docs tell to pass), the run is that directory's,
// wherever it was moved or copied to: its saved run.dir names the directory it was first trained in,
// which for a copy is the original, whose checkpoints rotation would delete. A run.dir= among
// `overrides` wins (a run's config reused for a new run). Returns a note for the user when the
// directory differs from the one the config names ("" otherwise).
std::string settle_run_dir(RunConfig& config, const std::filesystem::path& config_file,
                           std::span<const std::string> overrides);

// run.dir is not a data directory, nor inside a data or another run directory (a run there would
// replace their files and be taken for a part of them).
void refuse_owned_location(const std::filesystem::path& run_dir);

// checkpoints/, abandoned/ and tensorboard/ (with `tensorboard`) inside the run directory are
// directories of it, and its files (config.yaml, metrics.jsonl, tokenizer.*) are not symlinks: a
// symlink there would make nibble write, rotate and delete in another directory. The run directory
// itself may be a symlink (it is locked and followed).
void refuse_redirected_entries(const std::filesystem::path& run_dir, bool tensorboard);

// A new run goes into a directory that does not exist, is a run directory, or holds nothing but
// names `nibble train` writes (what a run killed before its first step leaves): never into a
// directory of the user's, whose files of those names it would replace.
void refuse_foreign_directory(const std::filesystem::path& run_dir);

// Removes the temporaries (NAME.tmp.PID) of the files nibble writes at the top of a run directory
// that a killed trainer left: only of those names, only when that process is gone. A user's own
// files, whatever their names, stay.
void remove_stray_temporaries(const std::filesystem::path& run_dir);

}  // namespace nibble::train
