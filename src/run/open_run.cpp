#include "run/open_run.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <cmath>

#include "data/data.h"
#include "ops/backend.h"
#include "run/run.h"

namespace nibble::train {

namespace fs = std::filesystem;

namespace {

// A rotation removes the newest checkpoint only after writing a newer one, so each retry finds a
// newer checkpoint; the bound only keeps a pathological directory from looping forever.
constexpr int kListingAttempts = 1000;
// readdir(3) may miss an entry renamed while it lists (a checkpoint put in place, another moved out
// for removal), so a listing taken during a rotation can seem empty: listed again, after a pause
// that lets the rotation finish, before a run is said to have no checkpoint.
constexpr int kEmptyListings = 50;

std::optional<fs::path> newest_listed(const fs::path& run_dir) {
  for (int attempt = 1;; ++attempt) {
    if (auto latest = latest_checkpoint(run_dir); latest || attempt == kEmptyListings) return latest;
    std::error_code ec;
    if (!fs::exists(checkpoints_dir(run_dir), ec)) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// The newest checkpoint of `run_dir`, locked for reading.
fs::path lock_newest(const fs::path& run_dir, std::unique_ptr<io::CheckpointLock>& lock) {
  for (int attempt = 0; attempt < kListingAttempts; ++attempt) {
    const auto latest = newest_listed(run_dir);
    if (!latest)
      throw UsageError(fmt::format("run '{}' has no checkpoint yet: train it further (resume=true) first", run_dir.string()));
    if ((lock = io::CheckpointLock::for_reading(*latest))) return *latest;
  }
  throw UsageError(fmt::format("run '{}': its newest checkpoint was removed {} times while this tried to read it: pass "
                               "--checkpoint with one of its checkpoints ({})",
                               run_dir.string(), kListingAttempts, checkpoint_names(list_checkpoints(run_dir))));
}

// The checkpoint --checkpoint names (a bare name is one of the run's, as `nibble train
// --checkpoint` takes it), locked for reading.
fs::path lock_chosen(const fs::path& run_dir, const fs::path& checkpoint, std::unique_ptr<io::CheckpointLock>& lock) {
  fs::path path = checkpoint;
  std::error_code ec;
  if (!checkpoint.has_parent_path() && !fs::exists(checkpoint, ec)) path = checkpoints_dir(run_dir) / checkpoint;
  // A directory without state.json is no checkpoint, damaged or not (`--checkpoint /etc`): named as
  // such, never met with the damaged-checkpoint advice to remove it.
  if (!fs::is_directory(path, ec) || !fs::is_regular_file(path / "state.json", ec) ||
      !(lock = io::CheckpointLock::for_reading(path)))
    throw UsageError(fmt::format("--checkpoint '{}': {} is not a checkpoint directory; run '{}' has the checkpoints "
                                 "{} (in {})",
                                 checkpoint.string(), path.string(), run_dir.string(),
                                 checkpoint_names(list_checkpoints(run_dir)), checkpoints_dir(run_dir).string()));
  return path;
}

}  // namespace

LoadedRun load_run(const fs::path& run_dir, const std::optional<fs::path>& checkpoint, ops::Device device) {
  ops::Backend& backend = ops::backend(device);  // no usable GPU: the fix, before anything is read
  const fs::path config_path = run_dir / kRunConfigFile;
  if (!fs::exists(config_path))
    throw UsageError(fmt::format("'{}' is not a run directory: {} is missing (runs are made by `nibble train`)",
                                 run_dir.string(), config_path.string()));
  LoadedRun run;
  apply_config_yaml(run.config, read_text_file(config_path.string()), config_path.string());
  // A run on llm.c or nanoGPT files has its config's model.vocab, and a tokenizer only where
  // data.tokenizer gave one (copied into the run directory).
  const bool token_files = run.config.data_format != TokenFormat::nibble;
  if (!token_files || has_tokenizer(run_dir)) run.tokenizer = load_tokenizer(run_dir);
  run.config.train.model.vocab = token_files ? run.config.vocab : run.tokenizer->vocab_size();
  const std::string identity = run.tokenizer ? run.tokenizer->identity()
                                             : pretokenized_identity(run.config.data_format, run.config.vocab);
  run.config.train.model.validate();
  run.checkpoint = checkpoint ? lock_chosen(run_dir, *checkpoint, run.checkpoint_lock)
                              : lock_newest(run_dir, run.checkpoint_lock);
  run.model = std::make_unique<model::Transformer>(run.config.train.model, backend);
  run.state = load_checkpoint(run.checkpoint, *run.model, nullptr, identity);
  return run;
}

double EvalResult::perplexity() const { return std::exp(loss); }

EvalResult evaluate_token_stream(LoadedRun& run, const std::vector<int32_t>& tokens, int64_t max_windows,
                                 bool use_recipe, const std::function<void(const model::Transformer&)>& after_batch) {
  const int64_t vocab = run.model->config().vocab;
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab)
      throw UsageError(fmt::format("token {} at position {} is outside this run's vocabulary [0, {}): the token file "
                                   "was made with another tokenizer",
                                   tokens[i], i, vocab));
  return evaluate_token_stream(run, TokenStream::view(tokens), max_windows, use_recipe, after_batch);
}

EvalResult evaluate_token_stream(LoadedRun& run, const TokenStream& tokens, int64_t max_windows, bool use_recipe,
                                 const std::function<void(const model::Transformer&)>& after_batch) {
  const auto& c = run.config.train;
  const int64_t seq = c.seq > 0 ? c.seq : c.model.context;
  int64_t windows = tokens.size() > 1 ? static_cast<int64_t>((tokens.size() - 1) / static_cast<size_t>(seq)) : 0;
  if (windows == 0)
    throw UsageError(fmt::format("the token file holds {} tokens, fewer than one window of {} + 1", tokens.size(), seq));
  if (max_windows > 0) windows = std::min(windows, max_windows);
  // Whole batches of the run's size only: a quantized recipe needs the token count of a micro-batch
  // to fill its blocks, which the run's batch * seq does by construction.
  const int64_t batch = std::min<int64_t>(std::max<int64_t>(1, c.batch), windows);
  windows -= windows % batch;
  Recipe recipe(c.recipe, static_cast<int>(c.model.layers), run.model->block_linear_shapes(), batch * seq,
                run.model->backend());
  model::ModelStep step;
  step.recipe = use_recipe ? &recipe : nullptr;
  step.progress = std::min(1.0, static_cast<double>(run.state.step) / static_cast<double>(c.schedule.total_steps));
  step.run_seed = c.seed;
  step.weight_version = run.state.step;
  step.training = false;  // forward only: the linears keep nothing for a backward that never comes
  EvalResult result;
  double total = 0;
  std::vector<int32_t> inputs, targets;
  for (int64_t first = 0; first < windows; first += batch) {
    const int64_t rows = std::min(batch, windows - first);
    inputs.resize(static_cast<size_t>(rows * seq));
    targets.resize(inputs.size());
    std::vector<int32_t> window(static_cast<size_t>(seq + 1));
    for (int64_t r = 0; r < rows; ++r) {
      tokens.read(static_cast<uint64_t>((first + r) * seq), window.size(), window.data());
      std::copy(window.begin(), window.end() - 1, inputs.begin() + r * seq);
      std::copy(window.begin() + 1, window.end(), targets.begin() + r * seq);
    }
    step.micro_step = -1 - first;
    total += run.model->forward(inputs, targets, rows, seq, step) * static_cast<double>(rows * seq);
    if (after_batch) after_batch(*run.model);
    result.tokens += rows * seq;
  }
  result.windows = windows;
  result.loss = total / static_cast<double>(result.tokens);
  return result;
}

}  // namespace nibble::train
