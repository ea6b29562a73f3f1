#include "run/run.h"

#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <csignal>
#include <cmath>
#include <set>

#include "format/quantized_tensor.h"
#include "io/atomic_file.h"
#include "io/directory_lock.h"
#include "ops/backend.h"
#include "run/checkpoint.h"
#include "data/data.h"
#include "train/experiment.h"
#include "run/loss_spike.h"
#include "run/metrics.h"
#include "data/shards.h"
#include "train/trainer.h"

namespace nibble::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kConfigFile = "config.yaml";
constexpr const char* kMetricsFile = "metrics.jsonl";

std::string bytes_text(double b) {
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
  return fmt::format("{:.1f} KiB", b / 1024.0);
}

// Storage of one element of a saved wgrad input, codes plus block scales.
double bytes_per_element(const GemmRecipe& g) {
  switch (g.precision) {
    case GemmPrecision::fp32: return 4;
    case GemmPrecision::bf16: return 2;
    case GemmPrecision::quantized: return stored_bytes_per_element(g.b.format);
  }
  return 4;
}

std::string operand_text(const QuantOptions& q, bool weight) {
  std::string s(to_string(q.format));
  if (q.format == Format::nvfp4 && weight) s += q.tile_16x16 ? "(16x16)" : "(1x16)";
  if (q.rounding == Rounding::stochastic) s += "/SR";
  if (q.rht) s += "/RHT";
  if (q.four_over_six)
    s += "/4over6(" + std::string(to_string(q.four_over_six_error)) + "," + std::to_string(q.four_over_six_e4m3_max) + ")";
  return s;
}

std::string gemm_text(const GemmRecipe& g, GemmRole role) {
  std::string s(to_string(role));
  if (g.precision != GemmPrecision::quantized) return s + " " + std::string(to_string(g.precision));
  // fprop multiplies X by W, dgrad dY by W^T, wgrad dY^T by X^T (recipe/recipe.h).
  return s + " " + operand_text(g.a, false) + " x " + operand_text(g.b, role != GemmRole::wgrad);
}

std::string peak_note(double peak, const ops::Backend& backend) {
  if (backend.device() == ops::Device::cpu)
    return fmt::format("{:.1f} GFLOP/s = {} threads x FP32 FMA peak measured on this CPU", peak / 1e9,
                       omp_get_max_threads());
  return fmt::format("{:.1f} GFLOP/s = FP32 GEMM rate measured on {}", peak / 1e9, backend.describe());
}

// Keys whose change makes a resumed run differ from the run it continues.
bool changes_the_math(const std::string& key) {
  static const std::set<std::string> harmless = {"resume", "threads", "eval.interval", "checkpoint.interval",
                                                 "checkpoint.keep", "log.interval", "run.dir", "data.dir"};
  return !harmless.contains(key);
}

void write_text(const fs::path& path, const std::string& text) {
  io::write_file_atomically(path, std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

// AtomicFileWriter's temporaries (NAME.tmp.PID) that a killed process left in the run directory.
// Called under the run's lock, so no live writer owns one.
void remove_stray_temporaries(const fs::path& run_dir) {
  std::error_code ec;
  for (fs::directory_iterator it(run_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const auto at = name.rfind(".tmp.");
    if (at == std::string::npos || at + 5 == name.size() || !it->is_regular_file()) continue;
    if (std::all_of(name.begin() + static_cast<std::ptrdiff_t>(at + 5), name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      std::error_code ignored;
      fs::remove(it->path(), ignored);
    }
  }
}

std::string checkpoint_names(const std::vector<fs::path>& checkpoints) {
  std::string names;
  for (const auto& c : checkpoints) names += (names.empty() ? "" : ", ") + c.filename().string();
  return names.empty() ? "none" : names;
}

// The checkpoint among `checkpoints` (run_dir's own) that `requested` names: `nibble train
// --checkpoint`'s value, a path or the bare name of a directory in RUN/checkpoints. Refused
// (UsageError, naming the value and the run's checkpoints) when it is none of them.
fs::path requested_checkpoint(const fs::path& run_dir, const std::string& requested,
                              const std::vector<fs::path>& checkpoints) {
  fs::path given(requested);
  if (!given.has_filename()) given = given.parent_path();  // "step_00000100/"
  const fs::path candidate = given.has_parent_path() ? given : checkpoints_dir(run_dir) / given;
  for (const fs::path& c : checkpoints) {
    std::error_code ec;
    if (fs::equivalent(c, candidate, ec)) return c;
  }
  const std::string choices =
      fmt::format("run.dir '{}' has the checkpoints {} (in {}): pass one of them, by name or path, or leave out "
                  "--checkpoint to resume from the newest",
                  run_dir.string(), checkpoint_names(checkpoints), checkpoints_dir(run_dir).string());
  std::error_code ec;
  if (!fs::exists(candidate, ec))
    throw UsageError(fmt::format("--checkpoint '{}': {} does not exist; {}", requested, candidate.string(), choices));
  if (fs::equivalent(candidate.parent_path(), abandoned_dir(run_dir), ec))
    throw UsageError(fmt::format("--checkpoint '{}' was set aside in {} by an earlier --checkpoint, with the "
                                 "continuation it belongs to. To go back to that continuation, move it into {} under "
                                 "its step_NNNNNNNN name first (and the run's newer checkpoints out of the way); {}",
                                 requested, abandoned_dir(run_dir).string(), checkpoints_dir(run_dir).string(), choices));
  throw UsageError(fmt::format("--checkpoint '{}' is not a checkpoint of run.dir '{}'; {}. To continue another "
                               "run from one of its checkpoints, pass that run's config.yaml",
                               requested, run_dir.string(), choices));
}

// SIGINT / SIGTERM (Ctrl-C, a scheduler's warning before preemption): the first asks the loop to
// finish its step, write a checkpoint and stop; a second ends the process at once.
volatile std::sig_atomic_t stop_signal = 0;

extern "C" void on_stop_signal(int sig) {
  if (stop_signal != 0) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  stop_signal = sig;
}

// Installs on_stop_signal for the training loop and restores the previous handlers after it. A
// signal ignored at start stays ignored: a shell starts background jobs with SIGINT ignored so that
// Ctrl-C in the terminal does not reach them.
class StopSignals {
 public:
  StopSignals() {
    stop_signal = 0;
    for (int i = 0; i < 2; ++i) {
      struct sigaction action {};
      action.sa_handler = on_stop_signal;
      action.sa_flags = SA_RESTART;
      sigemptyset(&action.sa_mask);
      ::sigaction(kSignals[i], nullptr, &previous_[i]);
      installed_[i] = previous_[i].sa_handler != SIG_IGN && ::sigaction(kSignals[i], &action, nullptr) == 0;
    }
  }
  ~StopSignals() {
    for (int i = 0; i < 2; ++i)
      if (installed_[i]) ::sigaction(kSignals[i], &previous_[i], nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  static constexpr int kSignals[2] = {SIGINT, SIGTERM};
  struct sigaction previous_[2] {};
  bool installed_[2] = {false, false};
};

}  // namespace

MemoryEstimate estimate_memory(const model::ModelConfig& m, const Recipe& recipe, int64_t batch, int64_t seq) {
  MemoryEstimate e;
  int64_t params = 0;
  {
    const int64_t d = m.width, hd = m.head_dim(), f = m.hidden();
    params = m.vocab * d + m.layers * (2 * d + (m.heads + 2 * m.kv_head_count()) * hd * d + d * m.heads * hd + 2 * f * d + d * f) + d +
             (m.tied_embeddings ? 0 : m.vocab * d);
  }
  e.weights = 4 * params;
  e.gradients = 4 * params;
  e.optimizer = 8 * params;  // AdamW's two FP32 moments
  const int64_t N = batch * seq, d = m.width, hd = m.head_dim(), f = m.hidden();
  const int64_t qkv = (m.heads + 2 * m.kv_head_count()) * hd;
  // Per block, kept by the model: residual input, x_mid, two rstd rows, post-RoPE qkv, softmax
  // probabilities, gate_up.
  const int64_t block_floats = N * d + N * d + 2 * N + N * qkv + batch * m.heads * seq * seq + N * 2 * f;
  // The inputs each linear keeps for its wgrad GEMM: qkv and gate_up see [N, d], attn_out
  // [N, heads*hd], down [N, f].
  const int64_t linear_inputs = N * d + N * m.heads * hd + N * d + N * f;
  const int64_t final_floats = N * d + N + N * d + N * m.vocab + N;
  double recipe_bytes = 4.0 * static_cast<double>(m.layers * block_floats + final_floats);
  for (int64_t l = 0; l < m.layers; ++l) {
    const GemmRecipe& w = recipe.for_layer(static_cast<int>(l), 0.0).wgrad;
    recipe_bytes += bytes_per_element(w) * static_cast<double>(linear_inputs);
  }
  e.activations_fp32 = 4 * (m.layers * (block_floats + linear_inputs) + final_floats);
  e.activations_recipe = static_cast<int64_t>(recipe_bytes);
  return e;
}

std::vector<std::string> describe_recipe_per_layer(const Recipe& recipe, int layers) {
  std::vector<std::string> lines;
  std::string previous;
  int first = 0;
  auto flush = [&](int last) {
    if (previous.empty()) return;
    lines.push_back(first == last ? fmt::format("block {}: {}", first, previous)
                                  : fmt::format("blocks {}-{}: {}", first, last, previous));
  };
  for (int l = 0; l < layers; ++l) {
    const LinearRecipe r = recipe.for_layer(l, 0.0);
    std::string text;
    for (GemmRole role : kGemmRoles) text += (text.empty() ? "" : " | ") + gemm_text(r[role], role);
    if (text != previous) {
      flush(l - 1);
      previous = text;
      first = l;
    }
  }
  flush(layers - 1);
  if (recipe.config().precision_switch_at < 1.0)
    lines.push_back(fmt::format("after {:.0f}% of the steps every GEMM runs in BF16 (precision_switch_at)",
                                100 * recipe.config().precision_switch_at));
  lines.push_back(recipe.attention_bf16()
                      ? "embedding, norms, softmax, LM head and loss: FP32; attention's QK^T and PV: BF16 operands, FP32 sums"
                      : "embedding, norms, attention core, LM head and loss: FP32");
  return lines;
}

std::string startup_report(const RunConfig& c, const model::Transformer& model, const Recipe& recipe,
                           const Tokenizer& tokenizer, int64_t train_tokens, int64_t val_tokens, double peak_flops) {
  const auto& m = model.config();
  const int64_t seq = c.train.seq > 0 ? c.train.seq : m.context;
  const int64_t tokens_per_step = c.train.batch * seq * c.train.grad_accum;
  const double flops_token = training_flops_per_token(m, seq);
  const int64_t params = model.params().parameter_count();
  const int64_t embedding = m.vocab * m.width;
  const MemoryEstimate mem = estimate_memory(m, recipe, c.train.batch, seq);
  std::string s;
  s += fmt::format("model      {} blocks x width {} ({} heads, {} kv heads, head dim {}), SwiGLU hidden {}, context {}, "
                   "vocab {} ({} tokenizer), {} embeddings\n",
                   m.layers, m.width, m.heads, m.kv_head_count(), m.head_dim(), m.hidden(), m.context, m.vocab,
                   to_string(tokenizer.kind()), m.tied_embeddings ? "tied" : "untied");
  s += fmt::format("parameters {} ({:.2f}M; {:.2f}M without the embedding)\n", params, params / 1e6,
                   (params - embedding) / 1e6);
  s += fmt::format("data       {} train tokens, {} validation tokens; {} tokens/step = batch {} x seq {} x grad_accum "
                   "{}; {} steps = {} tokens ({:.2f} epochs)\n",
                   train_tokens, val_tokens, tokens_per_step, c.train.batch, seq, c.train.grad_accum,
                   c.train.schedule.total_steps, format_si(static_cast<double>(tokens_per_step * c.train.schedule.total_steps)),
                   static_cast<double>(tokens_per_step * c.train.schedule.total_steps) / static_cast<double>(train_tokens));
  s += fmt::format("compute    {:.3g} training FLOPs/token (6N + 12 L d T), {:.3g} FLOPs/step, {:.3g} FLOPs in total\n",
                   flops_token, flops_token * tokens_per_step,
                   flops_token * tokens_per_step * static_cast<double>(c.train.schedule.total_steps));
  s += fmt::format("MFU peak   {}\n", peak_note(peak_flops, model.backend()));
  s += fmt::format("memory     weights {}, gradients {}, AdamW {}; activations per micro-batch {} in FP32, {} with the "
                   "recipe's quantized saved activations; total {} (FP32 activations) / {} (quantized)\n",
                   bytes_text(mem.weights), bytes_text(mem.gradients), bytes_text(mem.optimizer),
                   bytes_text(mem.activations_fp32), bytes_text(mem.activations_recipe),
                   bytes_text(mem.weights + mem.gradients + mem.optimizer + mem.activations_fp32),
                   bytes_text(mem.weights + mem.gradients + mem.optimizer + mem.activations_recipe));
  s += fmt::format("recipe     {}\n", describe(recipe.config()));
  for (const auto& line : describe_recipe_per_layer(recipe, static_cast<int>(m.layers))) s += "           " + line + "\n";
  s += fmt::format("kernels    {}\n", describe_kernels(recipe));
  s += fmt::format("threads    {}\n", omp_get_max_threads());
  s += fmt::format("device     {}\n", model.backend().describe());
  return s;
}

int run_training(const RunConfig& config, std::FILE* out) {
  SingleProcessCommunicator single_process;
  return run_training(config, out, single_process);
}

int run_training(const RunConfig& input_config, std::FILE* out, Communicator& comm) {
  RunConfig config = input_config;
  if (!config.resume_checkpoint.empty()) config.resume = true;  // resuming from a chosen checkpoint
  if (config.threads > 0) omp_set_num_threads(static_cast<int>(config.threads));
  const fs::path run_dir = config.run_dir;
  // Rank 0 alone reads and writes the run directory and prints; the others only compute, so a
  // multi-host job needs the run directory on rank 0's host only (the data directory on every host).
  const bool root = comm.rank() == 0;
  auto print = [out, root](const std::string& text) {
    if (!root) return;
    std::fputs(text.c_str(), out);
    std::fflush(out);
  };
  int exit_rank = -1;
  int64_t exit_step = -1;
  if (const char* hook = std::getenv("NIBBLE_TEST_RANK_EXIT"); hook && *hook)
    if (std::sscanf(hook, "%d:%ld", &exit_rank, &exit_step) != 2) exit_rank = -1;
  // Test hook: rank R's step S fails as a quantizer meeting non-finite activations would.
  int fail_rank = -1;
  int64_t fail_step = -1;
  if (const char* hook = std::getenv("NIBBLE_TEST_RANK_STEP_FAILS"); hook && *hook)
    if (std::sscanf(hook, "%d:%ld", &fail_rank, &fail_step) != 2) fail_rank = -1;
  // Test hooks of the loss-spike detector: from step S on, the reported loss is kTestSpikeAddedLoss
  // higher (the training itself is unchanged); at step T it is NaN.
  constexpr double kTestSpikeAddedLoss = 10.0;
  auto hook_step = [](const char* name) -> int64_t {
    const char* value = std::getenv(name);
    return value && *value ? std::atoll(value) : -1;
  };
  const int64_t spike_from = hook_step("NIBBLE_TEST_LOSS_SPIKE_FROM"), nan_at = hook_step("NIBBLE_TEST_LOSS_NAN_AT");

  // Nothing is written into the run directory until the whole request is validated (config, data,
  // recipe, the checkpoint to resume and its fit to this model and tokenizer): a refused command
  // leaves every byte of the directory as it was. An existing directory is locked first, so that
  // what is validated cannot change underneath (a second trainer is refused, naming its PID).
  const std::string lock_holder = "another `nibble train`";
  std::unique_ptr<io::DirectoryLock> lock;
  if (root && fs::is_directory(run_dir)) lock = std::make_unique<io::DirectoryLock>(run_dir, lock_holder);

  const auto existing = root ? latest_checkpoint(run_dir) : std::nullopt;
  if (existing && !config.resume)
    throw UsageError(fmt::format("run.dir '{}' already holds checkpoints (newest {}): pass resume=true to continue that "
                                 "run, or choose another run.dir",
                                 run_dir.string(), existing->filename().string()));
  if (root && !existing && !config.resume_checkpoint.empty())
    throw UsageError(fmt::format("--checkpoint '{}': run.dir '{}' holds no checkpoint yet, so there is nothing to "
                                 "resume: leave out --checkpoint to start the run, or give the run.dir of the run the "
                                 "checkpoint belongs to",
                                 config.resume_checkpoint, run_dir.string()));

  Dataset data = load_dataset(config.data_dir);
  config.train.model.vocab = data.tokenizer->vocab_size();
  config.validate();
  const std::string tokenizer_identity = data.tokenizer->identity();

  // Built before anything is written, so that a recipe or shape the Trainer refuses leaves no
  // half-made run directory behind.
  Trainer trainer(config.train, data.corpus(), &comm);

  TrainingState state;
  state.seed = config.train.seed;
  // The newest checkpoint written before any loss spike that is still going on: what a divergence
  // message names as the one to go back to.
  std::optional<fs::path> last_good;
  std::optional<fs::path> loaded;  // the checkpoint resumed from
  if (config.resume && existing) {
    const auto all = list_checkpoints(run_dir);
    std::vector<std::string> damaged;
    if (!config.resume_checkpoint.empty()) {
      // The one asked for, or nothing: falling back to another would continue a run nobody chose.
      const fs::path chosen = requested_checkpoint(run_dir, config.resume_checkpoint, all);
      try {
        state = load_checkpoint(chosen, trainer.model(), &trainer.optimizer(), tokenizer_identity);
      } catch (const DamagedCheckpoint& e) {
        throw UsageError(fmt::format("--checkpoint '{}' does not verify: {}\nchoose another of the run's checkpoints "
                                     "({}), or leave out --checkpoint to resume from the newest that verifies",
                                     config.resume_checkpoint, e.what(), checkpoint_names(all)));
      }
      // Going back to a checkpoint at or past the last step trains nothing, yet would set the newer
      // checkpoints aside: refused before anything moves.
      const auto newer = std::count_if(all.begin(), all.end(), [&](const fs::path& c) { return c > chosen; });
      if (state.step >= config.train.schedule.total_steps && newer > 0)
        throw UsageError(fmt::format("--checkpoint '{}' is at step {}, and steps={} ends the run there: nothing would be "
                                     "trained, yet its {} newer checkpoint(s) would be set aside. Pass a larger steps= "
                                     "to continue from it",
                                     config.resume_checkpoint, state.step, config.train.schedule.total_steps, newer));
      const fs::path aside = abandoned_dir(run_dir);
      std::error_code ec;
      if (newer > 0 && fs::exists(aside, ec) && !fs::is_directory(aside, ec))
        throw UsageError(fmt::format("--checkpoint '{}': the {} newer checkpoint(s) are set aside in {}, which is not a "
                                     "directory: move that file out of the way and run again",
                                     config.resume_checkpoint, newer, aside.string()));
      loaded = chosen;
    }
    // Newest first; a damaged checkpoint (flipped bytes, NaN weights) is named and passed over for
    // the newest one that verifies. A shape or tokenizer mismatch is not: every checkpoint shares it.
    for (auto it = all.rbegin(); it != all.rend() && !loaded; ++it) {
      try {
        state = load_checkpoint(*it, trainer.model(), &trainer.optimizer(), tokenizer_identity);
        loaded = *it;
      } catch (const DamagedCheckpoint& e) {
        damaged.push_back(e.what());
        print(fmt::format("warning: not resuming from {}: {}\n", it->string(), e.what()));
      }
    }
    if (!loaded)
      throw UsageError(fmt::format("no checkpoint in '{}' verifies ({} damaged, named above): the run cannot be "
                                   "continued; start a new run.dir",
                                   run_dir.string(), damaged.size()));
    if (state.micro_batches != state.step * config.train.grad_accum)
      throw UsageError(fmt::format("{}: the checkpoint drew {} micro-batches in {} steps, which grad_accum={} cannot "
                                   "continue: resume with the run's grad_accum",
                                   loaded->string(), state.micro_batches, state.step, config.train.grad_accum));
    if (!damaged.empty())
      print(fmt::format("warning: falling back to {} (step {}), the newest checkpoint that verifies; the {} newer "
                        "damaged one(s) will be replaced as training passes their steps\n",
                        loaded->string(), state.step, damaged.size()));
    if (state.seed != config.train.seed)
      print(fmt::format("note: the checkpoint was trained with seed={}, this config has seed={}: data order and "
                        "rounding continue with the new seed\n",
                        state.seed, config.train.seed));
    state.seed = config.train.seed;
    last_good = loaded;
  }

  const fs::path saved_config = run_dir / kConfigFile;
  if (config.resume && existing && fs::exists(saved_config)) {
    RunConfig before;
    apply_config_yaml(before, read_text_file(saved_config.string()), saved_config.string());
    const auto old_values = config_values(before), new_values = config_values(config);
    if (before.train.device != config.train.device)  // (device=cpu is not written to config.yaml)
      print(fmt::format("note: resuming on device={} (the run was started on {}): the checkpoint carries over, but the "
                        "GEMMs sum in another order, so the continuation differs from an uninterrupted run\n",
                        ops::to_string(config.train.device), ops::to_string(before.train.device)));
    for (const auto& [key, value] : new_values) {
      const std::string& name = key;  // C++20 lambdas cannot capture structured bindings in clang 14
      auto it = std::find_if(old_values.begin(), old_values.end(), [&](const auto& kv) { return kv.first == name; });
      const std::string old_value = it == old_values.end() ? "(unset)" : it->second;
      if (old_value != value && changes_the_math(key))
        print(fmt::format("note: resuming with {}={} (the run was started with {}): the continuation differs from an "
                          "uninterrupted run\n",
                          key, value, old_value));
    }
  }

  // Validated: from here on the run directory is written.
  // A new run that throws before its first step is done (out of memory for the activations,
  // typically: the first step allocates them) takes its directory with it, so nothing is left behind.
  struct NewRunCleanup {
    fs::path dir;
    bool armed = false;
    ~NewRunCleanup() {
      if (!armed || std::uncaught_exceptions() == 0) return;  // a refusal it returned keeps its record
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } new_run_cleanup{run_dir};
  if (root) {
    std::error_code ec;
    new_run_cleanup.armed = !fs::exists(run_dir);
    fs::create_directories(run_dir, ec);
    if (ec) throw UsageError(fmt::format("cannot create run.dir '{}': {}", run_dir.string(), ec.message()));
    if (!lock) {
      lock = std::make_unique<io::DirectoryLock>(run_dir, lock_holder);
      // Another trainer may have made the directory and its first checkpoint while this one validated.
      if (latest_checkpoint(run_dir))
        throw UsageError(fmt::format("run.dir '{}' received checkpoints from another process while this run started: "
                                     "choose another run.dir",
                                     run_dir.string()));
    }
    remove_stray_temporaries(run_dir);
  }
  const std::string resolved = config_to_yaml(config);
  print("# resolved config (saved as " + saved_config.string() + ")\n" + resolved);
  if (root) {
    write_text(saved_config, resolved);
    data.tokenizer->save(run_dir);
  }
  if (config.resume) {
    if (existing)
      print(fmt::format("resuming from {} (step {}, {} tokens)\n", loaded->string(), state.step, state.tokens));
    else
      print(fmt::format("no checkpoint in '{}' yet: starting a new run\n", run_dir.string()));
  }
  if (root && loaded && !config.resume_checkpoint.empty()) {
    // The checkpoints after the chosen one belong to a continuation given up: moved out of
    // RUN/checkpoints (they may hold days of compute), so that resume=true, eval and generate,
    // which take the newest checkpoint, never pick them; this run writes its own in their place.
    const auto moved = abandon_checkpoints_after(run_dir, state.step);
    for (const MovedCheckpoint& m : moved)
      print(fmt::format("note: {} is newer than the checkpoint resumed from: moved to {} (the continuation it "
                        "belongs to is abandoned; nothing was deleted)\n",
                        m.from.string(), m.to.string()));
  }

  const int64_t seq = config.train.seq > 0 ? config.train.seq : config.train.model.context;
  const int64_t tokens_per_step = config.train.batch * seq * config.train.grad_accum;
  const int64_t total = config.train.schedule.total_steps;

  if (comm.size() > 1) {
    // Rank 0's weights, optimizer state and data position are the job's, whatever the rank count
    // of the run that saved them: the global batch and sample order depend only on the step.
    comm.broadcast_values(std::span(&state, 1), 0);
    std::vector<float> values = trainer.model().params().host_values(), m = trainer.optimizer().first_moments(),
                       v = trainer.optimizer().second_moments();
    comm.broadcast_values(std::span<float>(values), 0);
    comm.broadcast_values(std::span<float>(m), 0);
    comm.broadcast_values(std::span<float>(v), 0);
    trainer.model().params().set_values(values);
    trainer.optimizer().set_moments(m, v);
    int64_t optimizer_steps = trainer.optimizer().steps();
    comm.broadcast_values(std::span(&optimizer_steps, 1), 0);
    trainer.optimizer().set_steps(optimizer_steps);
  }

  const double peak = trainer.model().backend().measure_peak_f32_flops(0.1);
  print(startup_report(config, trainer.model(), trainer.recipe(), *data.tokenizer, static_cast<int64_t>(data.train.size()),
                       static_cast<int64_t>(data.val.size()), peak));
  if (comm.size() > 1)
    print(fmt::format("parallel   {}: {}; MFU counts {} x the peak above\n", comm.describe(),
                      trainer.data_parallel().describe(seq), comm.size()));
  // MFU over the whole job: every rank has the peak rank 0 measured (homogeneous hosts).
  const double job_peak = peak * comm.size();

  std::unique_ptr<MetricsLog> metrics;
  if (root) metrics = std::make_unique<MetricsLog>(run_dir / kMetricsFile, config.resume && existing ? state.step : -1);
  std::unique_ptr<TensorBoardWriter> tensorboard;
  if (config.tensorboard && root) {
    tensorboard = std::make_unique<TensorBoardWriter>(run_dir / "tensorboard");
    print(fmt::format("tensorboard: {} (tensorboard --logdir {})\n", tensorboard->path().string(),
                      (run_dir / "tensorboard").string()));
  }
  const double flops_per_token = training_flops_per_token(config.train.model, seq);
  // Under mpirun a rank's stdout may be a pty that mpirun forwards line by line: no in-place progress there.
  const bool live = comm.size() == 1 && ::isatty(::fileno(out));
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const double elapsed_before = state.elapsed_s;
  auto elapsed = [&] { return elapsed_before + std::chrono::duration<double>(clock::now() - start).count(); };

  double window_time = 0, window_comm_start = comm.gradient_sum_seconds();
  int64_t window_steps = 0;
  double last_loss = std::nan("");
  double last_val = std::nan("");
  if (state.step >= total) print(fmt::format("the run is already complete at step {} of {}\n", state.step, total));
  const StopSignals stop_signals;
  int64_t checkpointed_step = -1;
  // Every rank sees the same step losses bit for bit (Trainer::step sums each loss slot, written by
  // one rank, with zeros from the others, which is exact), so every rank calls the same spikes and
  // names the same last good checkpoint without communicating.
  LossSpikeDetector loss_spikes;
  int64_t spike_step = -1;  // first step of the spike in progress
  auto last_good_text = [&] { return last_good ? last_good->string() : std::string("none (no checkpoint written yet)"); };
  auto resume_advice = [&] {
    const std::string fixes = "a lower schedule.lr (or a larger schedule.warmup_steps); quantization=bf16 tells "
                              "whether the recipe is the cause";
    if (!last_good) return "start again with " + fixes;
    return fmt::format("resume from it with `nibble train {} resume=true --checkpoint {}` and {}", saved_config.string(),
                       last_good->filename().string(), fixes);
  };
  // During a spike the checkpoint before it is kept through checkpoint rotation.
  auto save = [&](const TrainingState& s) {
    return save_checkpoint(run_dir, trainer.model(), &trainer.optimizer(), s, config.checkpoint_keep,
                           tokenizer_identity, loss_spikes.in_spike() ? last_good : std::nullopt);
  };
  while (trainer.steps_done() < total) {
    if (comm.rank() == exit_rank && trainer.steps_done() + 1 == exit_step) {
      std::fprintf(stderr, "nibble: test hook NIBBLE_TEST_RANK_EXIT: rank %d exits before step %ld\n", exit_rank,
                   static_cast<long>(exit_step));
      std::fflush(stderr);
      std::_Exit(17);
    }
    const auto t0 = clock::now();
    StepResult r;
    try {
      if (comm.rank() == fail_rank && trainer.steps_done() + 1 == fail_step)
        throw UsageError("test hook NIBBLE_TEST_RANK_STEP_FAILS: non-finite activations");
      r = trainer.step();
      if (spike_from > 0 && r.step >= spike_from) r.loss += kTestSpikeAddedLoss;
      if (nan_at > 0 && r.step == nan_at) r.loss = std::nan("");
    } catch (const UsageError& e) {
      // The config and data were checked before the first step, so a refusal inside a step is the
      // numbers going wrong: typically a quantizer meeting non-finite activations after divergence.
      if (live) print("\n");
      const std::string message =
          fmt::format("training stopped at step {}: {}\nthe run has probably diverged. last good checkpoint: {}\n{}",
                      trainer.steps_done() + 1, e.what(), last_good_text(), resume_advice());
      // With the data split over ranks, this rank may be the only one that met the bad numbers:
      // the others wait in the gradient sum, so the whole job has to be ended from here.
      if (comm.size() > 1) comm.abort(message, kExitNonFiniteLoss);
      print("error: " + message + "\n");
      return kExitNonFiniteLoss;
    }
    new_run_cleanup.armed = false;  // a step is done: from now on the directory is a run's
    const double dt = std::chrono::duration<double>(clock::now() - t0).count();
    window_time += dt;
    ++window_steps;
    state.step = r.step;
    state.tokens += tokens_per_step;
    state.micro_batches += config.train.grad_accum;
    last_loss = r.loss;

    if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) {
      if (live) print("\n");
      StepRecord bad{r.step, total, state.tokens, r.loss, r.lr, r.grad_norm, dt, 0, 0, 0, elapsed()};
      if (metrics) metrics->write(bad);
      print(fmt::format("error: the training loss is {} at step {} (gradient norm {}): training stopped, nothing of it "
                        "saved.\nlast good checkpoint: {}\n{}\n",
                        r.loss, r.step, r.grad_norm, last_good_text(), resume_advice()));
      return kExitNonFiniteLoss;
    }

    // A spike freezes last_good at the newest checkpoint written before it: the ones written while
    // the loss is off are not "good" until it comes back.
    switch (loss_spikes.observe(r.loss)) {
      case LossSpikeDetector::Event::spike_begins:
        spike_step = r.step;
        print(fmt::format("{}warning: loss spike at step {}: {:.4f} against a recent mean of {:.4f}; the last "
                          "checkpoint before it is {}\n",
                          live ? "\r\033[K" : "", r.step, r.loss, loss_spikes.mean(), last_good_text()));
        break;
      case LossSpikeDetector::Event::spike_ends:
        print(fmt::format("{}note: the loss is back to {:.4f} at step {} (recent mean {:.4f}), after the spike from "
                          "step {}\n",
                          live ? "\r\033[K" : "", r.loss, r.step, loss_spikes.mean(), spike_step));
        break;
      case LossSpikeDetector::Event::none:
      case LossSpikeDetector::Event::spike_continues: break;
    }

    const bool last_step = r.step == total;
    if (r.step % config.log_interval == 0 || last_step) {
      StepRecord rec;
      rec.step = r.step;
      rec.total_steps = total;
      rec.tokens = state.tokens;
      rec.loss = r.loss;
      rec.lr = r.lr;
      rec.grad_norm = r.grad_norm;
      rec.step_time_s = window_time / static_cast<double>(window_steps);
      rec.tokens_per_s = static_cast<double>(tokens_per_step) / rec.step_time_s;
      rec.mfu = flops_per_token * rec.tokens_per_s / job_peak;
      rec.eta_s = rec.step_time_s * static_cast<double>(total - r.step);
      rec.elapsed_s = elapsed();
      rec.ranks = comm.size();
      rec.comm_fraction = (comm.gradient_sum_seconds() - window_comm_start) / window_time;
      if (metrics) metrics->write(rec);
      if (tensorboard) tensorboard->write(rec);
      print((live ? "\r\033[K" : "") + format_step_line(rec) + "\n");
      window_time = 0;
      window_comm_start = comm.gradient_sum_seconds();
      window_steps = 0;
      // Replicas must stay bitwise identical (same summed gradients, same AdamW): a cheap check.
      const std::string diverged =
          comm.size() > 1 ? check_replicas_identical(comm, trainer.model().params().host_values(), r.step) : std::string();
      if (!diverged.empty() && root) comm.abort(diverged, 1);
    } else if (live) {
      print(fmt::format("\r\033[Kstep {}/{} | loss {:.4f} | {:.0f} ms/step", r.step, total, r.loss, dt * 1e3));
    }

    if (r.step % config.eval_interval == 0 || last_step) {
      EvalRecord e;
      e.step = r.step;
      e.tokens = state.tokens;
      e.val_loss = trainer.evaluate();
      e.elapsed_s = elapsed();
      last_val = e.val_loss;
      if (std::isfinite(e.val_loss) && (state.best_val_step < 0 || e.val_loss < state.best_val_loss)) {
        state.best_val_loss = e.val_loss;
        state.best_val_step = r.step;
      }
      if (metrics) metrics->write(e);
      if (tensorboard) tensorboard->write(e);
      print((live ? "\r\033[K" : "") + format_eval_line(e, total) + "\n");
    }

    if (r.step % config.checkpoint_interval == 0 || last_step) {
      // Rank 0 writes; every rank knows the path, so a stop on any rank names the same last good one.
      if (root) {
        state.elapsed_s = elapsed();
        const auto path = save(state);
        print(fmt::format("{}checkpoint {}\n", live ? "\r\033[K" : "", path.string()));
      }
      if (!loss_spikes.in_spike()) last_good = checkpoint_path(run_dir, r.step);
      checkpointed_step = r.step;
    }

    // Every rank stops after the same step: rank 0's signal decides (mpirun forwards it to all).
    int64_t stop = stop_signal;
    if (comm.size() > 1) comm.broadcast_values(std::span(&stop, 1), 0);
    if (stop != 0 && !last_step) {
      if (checkpointed_step != r.step) {
        state.elapsed_s = elapsed();
        if (root) save(state);
      }
      print(fmt::format("{}stopped by {} after step {} of {}: checkpoint {} written.\ncontinue the run with: nibble "
                        "train {} resume=true\n",
                        live ? "\r\033[K" : "", stop == SIGINT ? "SIGINT" : "SIGTERM", r.step, total,
                        checkpoint_path(run_dir, r.step).string(), saved_config.string()));
      if (loss_spikes.in_spike())
        print(fmt::format("note: the loss has been spiking since step {}; the last checkpoint before the spike is {}{}\n",
                          spike_step, last_good_text(),
                          last_good ? " (resume=true --checkpoint " + last_good->filename().string() + " continues from it)"
                                    : ""));
      return 128 + static_cast<int>(stop);
    }
  }

  const double wall = elapsed();
  if (std::isnan(last_loss)) {  // nothing left to train
    print(fmt::format("run directory: {}; newest checkpoint {}\n", run_dir.string(), last_good_text()));
    return 0;
  }
  print(fmt::format("done: {} steps, {} tokens in {}; final train loss {:.4f}, val loss {:.4f}{}\nrun directory: {}\n",
                    state.step, format_si(static_cast<double>(state.tokens)), format_duration(wall), last_loss, last_val,
                    state.best_val_step >= 0
                        ? fmt::format(" (best {:.4f} at step {})", state.best_val_loss, state.best_val_step)
                        : std::string(),
                    run_dir.string()));
  return 0;
}

LoadedRun load_run(const fs::path& run_dir, const std::optional<fs::path>& checkpoint, ops::Device device) {
  ops::Backend& backend = ops::backend(device);  // no usable GPU: the fix, before anything is read
  const fs::path config_path = run_dir / kConfigFile;
  if (!fs::exists(config_path))
    throw UsageError(fmt::format("'{}' is not a run directory: {} is missing (runs are made by `nibble train`)",
                                 run_dir.string(), config_path.string()));
  LoadedRun run;
  apply_config_yaml(run.config, read_text_file(config_path.string()), config_path.string());
  run.tokenizer = load_tokenizer(run_dir);
  run.config.train.model.vocab = run.tokenizer->vocab_size();
  run.config.train.model.validate();
  if (checkpoint) {
    // A bare name (step_00000100) is one of the run's checkpoints, as `nibble train --checkpoint` takes it.
    run.checkpoint = *checkpoint;
    std::error_code ec;
    if (!checkpoint->has_parent_path() && !fs::exists(*checkpoint, ec)) run.checkpoint = checkpoints_dir(run_dir) / *checkpoint;
    if (!fs::is_directory(run.checkpoint, ec))
      throw UsageError(fmt::format("--checkpoint '{}': {} is not a checkpoint directory; run '{}' has the checkpoints "
                                   "{} (in {})",
                                   checkpoint->string(), run.checkpoint.string(), run_dir.string(),
                                   checkpoint_names(list_checkpoints(run_dir)), checkpoints_dir(run_dir).string()));
  } else {
    auto latest = latest_checkpoint(run_dir);
    if (!latest)
      throw UsageError(fmt::format("run '{}' has no checkpoint yet: train it further (resume=true) first", run_dir.string()));
    run.checkpoint = *latest;
  }
  run.model = std::make_unique<model::Transformer>(run.config.train.model, backend);
  run.state = load_checkpoint(run.checkpoint, *run.model, nullptr, run.tokenizer->identity());
  return run;
}

double EvalResult::perplexity() const { return std::exp(loss); }

EvalResult evaluate_token_stream(LoadedRun& run, const std::vector<int32_t>& tokens, int64_t max_windows,
                                 bool use_recipe, const std::function<void(const model::Transformer&)>& after_batch) {
  const auto& c = run.config.train;
  const int64_t seq = c.seq > 0 ? c.seq : c.model.context;
  const int64_t vocab = run.model->config().vocab;
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab)
      throw UsageError(fmt::format("token {} at position {} is outside this run's vocabulary [0, {}): the token file "
                                   "was made with another tokenizer",
                                   tokens[i], i, vocab));
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
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t t = 0; t < seq; ++t) {
        const size_t at = static_cast<size_t>((first + r) * seq + t);
        inputs[r * seq + t] = tokens[at];
        targets[r * seq + t] = tokens[at + 1];
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
