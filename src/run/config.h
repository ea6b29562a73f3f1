// The configuration of a `nibble train` run: one YAML file plus dotted key=value overrides from the
// command line (MaxText style: `nibble train configs/x.yaml quantization=nvfp4 steps=2000`).
// Every key is declared once in a table (name, type, meaning), which is what parsing, refusal
// messages ("did you mean ...?"), printing and saving all read, so they cannot drift apart.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <optional>

#include "data/sources.h"
#include "data/token_files.h"
#include "recipe/recipe.h"
#include "train/trainer.h"

namespace nibble::train {

// One entry of data.sources (docs/data-directory.md "Mixtures"): where its tokens are, and its weight.
struct SourceConfig {
  std::string name;  // defaults to the base name of dir
  double weight = 0;
  std::string dir, train_files, val_files;
  std::optional<TokenFormat> format;  // unset: data.format's
};

struct RunConfig {
  TrainConfig train;               // model, recipe, optimizer, schedule, batch, seq, seed, ...
  std::string run_dir = "runs/default";
  std::string data_dir;            // a directory written by `nibble prepare` (shards + tokenizer), or of llm.c/nanoGPT files
  TokenFormat data_format = TokenFormat::nibble;  // how data.dir's files are stored (data/token_files.h)
  std::string train_files, val_files;  // llmc/nanogpt: glob patterns instead of data.dir's listing
  std::string data_tokenizer;      // llmc/nanogpt: the tokenizer file (tokenizer.json, .model, .tiktoken) that wrote them
  std::vector<SourceConfig> sources;  // data.sources: a mixture instead of data.dir (empty: data.dir)
  int64_t vocab = 0;               // model.vocab as given: required for llmc/nanogpt; 0: the tokenizer's
  int64_t eval_interval = 250;     // steps between validation evaluations (and at the end)
  int64_t checkpoint_interval = 500;  // steps between checkpoints (and at the end)
  int64_t checkpoint_keep = 3;     // newest checkpoints kept; older ones are deleted
  int64_t log_interval = 10;       // steps between step lines / metrics.jsonl records
  bool tensorboard = false;        // also write TensorBoard event files to RUN/tensorboard
  int64_t threads = 0;             // OpenMP threads; 0: the OpenMP default
  bool resume = false;             // continue from the newest checkpoint in run_dir
  // `nibble train --checkpoint`: continue from this checkpoint of run_dir (a path, or its name
  // step_NNNNNNNN) instead of the newest; implies resume. A command-line option, not a config key:
  // it is neither read from nor saved to config.yaml.
  std::string resume_checkpoint;
  // schedule.rewarm=true: accept, at this resume, a changed schedule that raises the learning rate
  // at the resumed step (run/resume.h). Never saved to config.yaml: a later resume decides again.
  bool schedule_rewarm = false;

  // UsageError naming the key and the fix for values no run can use (also runs TrainConfig's).
  void validate() const;
  void validate_sources() const;
  // Where the run's tokens are, for data/token_files.h's load_dataset.
  DataSpec data_spec() const;
  // Every source the run reads: data.sources, or data.dir as one unnamed source of weight 1.
  std::vector<DataSource> data_sources() const;
};

// The recipe's keys (recipe/recipe.h: recipe_keys()) are config keys too and share their kinds.
using ConfigValueKind = KeyValueKind;

struct ConfigKeyInfo {
  std::string name;  // dotted: "model.layers"
  ConfigValueKind kind;
  std::string help;
};

// All keys in the order they are printed.
std::vector<ConfigKeyInfo> config_keys();

// Sets one key from its textual value. Throws UsageError for an unknown key (naming the closest
// valid key) or a value of the wrong type (naming the expected type). `origin` labels messages
// ("configs/x.yaml", "command line").
void set_config_value(RunConfig& config, std::string_view key, std::string_view value, std::string_view origin);

// Parses YAML text (nested maps are flattened to dotted keys) on top of `config`.
void apply_config_yaml(RunConfig& config, std::string_view yaml_text, std::string_view origin);
// Applies "key=value" words.
void apply_config_overrides(RunConfig& config, const std::vector<std::string>& overrides);
// A file, then the overrides, then validation. The model's vocabulary is left for the data to set.
RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides);

// The resolved configuration as YAML (nested maps), re-loadable by apply_config_yaml.
std::string config_to_yaml(const RunConfig& config);
// "cosine", "wsd", "constant": schedule.kind's value.
std::string schedule_name(Schedule s);
// key -> printed value, in table order (for diffs between a saved and a requested config).
std::vector<std::pair<std::string, std::string>> config_values(const RunConfig& config);

// Levenshtein distance, for "did you mean" suggestions.
size_t edit_distance(std::string_view a, std::string_view b);
// The valid key closest to `key` (by edit distance of the whole key, or of its last component).
std::string closest_config_key(std::string_view key);

}  // namespace nibble::train
