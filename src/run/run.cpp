#include "run/run.h"

#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <memory>
#include <optional>
#include <csignal>

#include "common/error.h"
#include "data/shards.h"
#include "data/sources.h"
#include "io/atomic_file.h"
#include "io/directory_lock.h"
#include "run/console.h"
#include "run/memory_plan.h"
#include "run/report.h"
#include "run/resume.h"
#include "run/run_checkpoints.h"
#include "run/run_directory.h"
#include "run/step_log.h"
#include "run/stop_signals.h"
#include "train/experiment.h"
#include "train/trainer.h"

namespace nibble::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kLockHolder = "another `nibble train`";
// The exit status of a rank that a fault plan makes crash.
constexpr int kExitInjectedCrash = 17;

void write_text(const fs::path& path, const std::string& text) {
  io::write_file_atomically(path, std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

// A new run that throws before its first step is done (out of memory for the activations,
// typically: the first step allocates them) takes its directory with it, so nothing is left behind.
// A refusal the run returns (not throws) keeps its record.
struct NewRunCleanup {
  fs::path dir;
  bool armed = false;
  ~NewRunCleanup() {
    if (!armed || std::uncaught_exceptions() == 0) return;
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

// Training wall time across resumes: the checkpoint's elapsed time plus this process's.
class RunClock {
 public:
  explicit RunClock(double before_s) : before_s_(before_s), start_(std::chrono::steady_clock::now()) {}
  double elapsed_s() const {
    return before_s_ + std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  double before_s_;
  std::chrono::steady_clock::time_point start_;
};

// One `nibble train` (or one rank of it), in the order of its phases: validate (nothing written),
// open the run directory, start every rank from rank 0's state, report, train, close.
class TrainingRun {
 public:
  TrainingRun(const RunConfig& config, std::FILE* out, Communicator& comm, const FaultPlan& faults);
  int run();

 private:
  void validate();
  void lock_and_inspect_directory();
  void open_directory();
  void start_ranks_alike();
  void broadcast_weights(bool resumed);
  void report();
  std::string describe_sources() const;
  void print_memory_per_rank();
  void print_peak_memory_per_rank();
  int train();

  void crash_if_planned() const;
  std::optional<int> take_step(StepResult& r, const RunCheckpoints& checkpoints);
  int stop_on_non_finite_loss(const StepResult& r, double seconds, StepLog& log, const RunCheckpoints& checkpoints);
  void check_replicas(int64_t step);
  double evaluate(int64_t step, StepLog& log);
  std::optional<int> stop_if_signalled(int64_t step, const StopSignals& signals, RunCheckpoints& checkpoints,
                                       const SpikeWatch& spikes);
  int finish(double last_loss, double last_val, const RunCheckpoints& checkpoints);

  RunConfig config_;
  Communicator& comm_;
  const FaultPlan& faults_;
  const bool root_;  // rank 0 alone reads and writes the run directory and prints
  const Console console_;
  const fs::path run_dir_, saved_config_;
  std::unique_ptr<io::DirectoryLock> lock_;
  NewRunCleanup new_run_cleanup_;
  std::optional<fs::path> existing_;  // the newest checkpoint already in run.dir (rank 0)
  std::vector<LoadedSource> sources_;  // data.dir as one source, or data.sources
  const Dataset& data() const { return sources_.front().data; }  // the tokenizer all sources share
  std::string tokenizer_identity_;
  std::unique_ptr<Trainer> trainer_;
  TrainingState state_;
  std::optional<fs::path> resumed_from_;
  AdamWState resumed_optimizer_;  // rank 0: the checkpoint's, until start_ranks_alike hands it out
  int64_t seq_ = 0, tokens_per_step_ = 0, total_steps_ = 0;
  double job_peak_flops_ = 0;
  int64_t process_bytes_ = 0;
  double step_seconds_ = 0;  // this process's time in training steps, for the loader's share
  std::optional<RunClock> clock_;
};

RunConfig with_implied_settings(const RunConfig& input) {
  RunConfig config = input;
  if (!config.resume_checkpoint.empty()) config.resume = true;  // resuming from a chosen checkpoint
  if (config.threads > 0) omp_set_num_threads(static_cast<int>(config.threads));
  return config;
}

TrainingRun::TrainingRun(const RunConfig& config, std::FILE* out, Communicator& comm, const FaultPlan& faults)
    : config_(with_implied_settings(config)),
      comm_(comm),
      faults_(faults),
      root_(comm.rank() == 0),
      console_(out, root_, comm.size() == 1 && ::isatty(::fileno(out))),
      run_dir_(config_.run_dir),
      saved_config_(run_dir_ / kRunConfigFile),
      new_run_cleanup_{run_dir_} {}

int TrainingRun::run() {
  validate();
  open_directory();
  start_ranks_alike();
  report();
  return train();
}

// Nothing is written into the run directory until the whole request is validated (config, data,
// recipe, the checkpoint to resume and its fit to this model and tokenizer): a refused command
// leaves every byte of the directory as it was. An existing directory is locked first, so that what
// is validated cannot change underneath (a second trainer is refused, naming its PID).
void TrainingRun::validate() {
  if (root_) lock_and_inspect_directory();
  if (existing_ && !config_.resume)
    throw UsageError(fmt::format("run.dir '{}' already holds checkpoints (newest {}): pass resume=true to continue that "
                                 "run, or choose another run.dir",
                                 run_dir_.string(), existing_->filename().string()));
  if (root_ && !existing_ && !config_.resume_checkpoint.empty())
    throw UsageError(fmt::format("--checkpoint '{}': run.dir '{}' holds no checkpoint yet, so there is nothing to "
                                 "resume: leave out --checkpoint to start the run, or give the run.dir of the run the "
                                 "checkpoint belongs to",
                                 config_.resume_checkpoint, run_dir_.string()));
  sources_ = load_sources(config_.data_sources());
  config_.train.model.vocab = data().vocab_size;
  config_.validate();
  tokenizer_identity_ = data().tokenizer_identity;
  seq_ = config_.train.seq > 0 ? config_.train.seq : config_.train.model.context;
  // A model that cannot fit is refused before its weights are allocated (minutes of paging for a
  // model.layers typo), the full estimate once the recipe exists.
  refuse_beyond_memory(estimate_memory(config_.train.model, nullptr, config_.train.batch, seq_), config_);
  // Built before anything is written, so that a recipe or shape the Trainer refuses leaves no
  // half-made run directory behind.
  std::vector<TrainSource> train_sources;
  for (const LoadedSource& s : sources_) train_sources.push_back(TrainSource{s.name, s.weight, s.data.train, s.data.val});
  process_bytes_ = resident_bytes_now();  // the program, MPI and the data before the model exists
  trainer_ = std::make_unique<Trainer>(config_.train, std::move(train_sources), &comm_);
  refuse_beyond_memory(estimate_memory(config_.train.model, &trainer_->recipe(), config_.train.batch, seq_), config_);
  state_.seed = config_.train.seed;
  if (config_.resume && existing_) {
    ResumePoint point = load_resume_point(config_, *trainer_, tokenizer_identity_, console_);
    state_ = point.state;
    resumed_from_ = point.checkpoint;
    resumed_optimizer_ = std::move(point.optimizer);
    note_config_changes(config_, saved_config_, state_.step, console_);
  }
  tokens_per_step_ = config_.train.batch * seq_ * config_.train.grad_accum;
  total_steps_ = config_.train.schedule.total_steps;
}

// Rank 0, before anything is read from run.dir: where it is (not in a data or another run
// directory), its lock, its own subdirectories (no symlinks out of it), its newest checkpoint, and
// for a new run that it is nobody else's directory (run/run_directory.h).
void TrainingRun::lock_and_inspect_directory() {
  refuse_owned_location(run_dir_);
  if (fs::is_directory(run_dir_)) {
    lock_ = std::make_unique<io::DirectoryLock>(run_dir_, kLockHolder);
    refuse_redirected_entries(run_dir_, config_.tensorboard);
  }
  existing_ = latest_checkpoint(run_dir_);
  if (!existing_) refuse_foreign_directory(run_dir_);
}

// Validated: from here on the run directory is written.
void TrainingRun::open_directory() {
  if (root_) {
    std::error_code ec;
    new_run_cleanup_.armed = !fs::exists(run_dir_);
    fs::create_directories(run_dir_, ec);
    if (ec) throw UsageError(fmt::format("cannot create run.dir '{}': {}", run_dir_.string(), ec.message()));
    if (!lock_) {
      lock_ = std::make_unique<io::DirectoryLock>(run_dir_, kLockHolder);
      // Another trainer may have made the directory and its first checkpoint while this one validated.
      if (latest_checkpoint(run_dir_))
        throw UsageError(fmt::format("run.dir '{}' received checkpoints from another process while this run started: "
                                     "choose another run.dir",
                                     run_dir_.string()));
    }
    remove_stray_temporaries(run_dir_);
  }
  const std::string resolved = config_to_yaml(config_);
  console_.print("# resolved config (saved as " + saved_config_.string() + ")\n" + resolved);
  if (root_) {
    write_text(saved_config_, resolved);
    if (data().tokenizer) data().tokenizer->save(run_dir_);
  }
  if (config_.resume && existing_)
    console_.print(fmt::format("resuming from {} (step {}, {} tokens)\n", resumed_from_->string(), state_.step,
                               state_.tokens));
  else if (config_.resume)
    console_.print(fmt::format("no checkpoint in '{}' yet: starting a new run\n", run_dir_.string()));
  if (root_ && resumed_from_ && !config_.resume_checkpoint.empty()) {
    // The checkpoints after the chosen one belong to a continuation given up: moved out of
    // RUN/checkpoints (they may hold days of compute), so that resume=true, eval and generate,
    // which take the newest checkpoint, never pick them; this run writes its own in their place.
    for (const MovedCheckpoint& m : abandon_checkpoints_after(run_dir_, state_.step))
      console_.print(fmt::format("note: {} is newer than the checkpoint resumed from: moved to {} (the continuation it "
                                 "belongs to is abandoned; nothing was deleted)\n",
                                 m.from.string(), m.to.string()));
  }
}

// Rank 0's weights, optimizer state and data position are the job's, whatever the rank count and
// shard mode of the run that saved them: the global batch and sample order depend only on the step.
void TrainingRun::start_ranks_alike() {
  AdamW& optimizer = trainer_->optimizer();
  int64_t resumed = resumed_from_.has_value();  // known on rank 0 only
  if (comm_.size() > 1) {
    comm_.broadcast_values(std::span(&state_, 1), 0);
    comm_.broadcast_values(std::span(&resumed, 1), 0);
    broadcast_weights(resumed != 0);
  }
  // A sharded optimizer takes its slice of rank 0's state; at a new run every slice starts at zero.
  if (optimizer.sharded()) {
    if (resumed) optimizer.scatter_state(resumed_optimizer_);
  } else {
    if (resumed_from_) optimizer.scatter_state(resumed_optimizer_);  // rank 0: no communication
    if (comm_.size() > 1) optimizer.broadcast_state(comm_);
  }
  resumed_optimizer_ = AdamWState{};  // its memory back before the first step
}

// Rank 0's weights to every rank: in place on the CPU (no host copy of the arena, which would be a
// start-up peak of memory above the training's), through a host copy from a GPU.
void TrainingRun::broadcast_weights(bool resumed) {
  model::ParamArena& params = trainer_->model().params();
  // distributed.shard=full: each rank keeps only its slice of what it initialised (from the same
  // seed as rank 0: nothing to send), or receives its slice of rank 0's resumed checkpoint.
  if (WeightShards* weights = trainer_->weight_shards()) {
    if (resumed) weights->scatter_from_root();
    return;
  }
  if (trainer_->model().backend().device() == ops::Device::cpu) {
    comm_.broadcast_values(params.values(), 0);
    return;
  }
  std::vector<float> values = params.host_values();
  comm_.broadcast_values(std::span<float>(values), 0);
  params.set_values(values);
}

void TrainingRun::report() {
  int64_t train_tokens = 0, val_tokens = 0;
  for (const LoadedSource& s : sources_) {
    train_tokens += static_cast<int64_t>(s.data.train.size());
    val_tokens += static_cast<int64_t>(s.data.val.size());
  }
  const double peak = trainer_->model().backend().measure_peak_f32_flops(0.1);
  const std::string files = config_.data_format == TokenFormat::nibble
                                ? ""
                                : fmt::format("{} token files, ", to_string(config_.data_format));
  const std::string tokenizer = files + (data().tokenizer ? fmt::format("{} tokenizer", to_string(data().tokenizer->kind()))
                                                          : std::string("no tokenizer"));
  console_.print(startup_report(config_, trainer_->model(), trainer_->recipe(), tokenizer,
                                train_tokens, val_tokens, peak));
  if (!config_.sources.empty()) console_.print(describe_sources());
  if (comm_.size() > 1)
    console_.print(fmt::format("parallel   {}: {}; MFU counts {} x the peak above\n", comm_.describe(),
                               trainer_->data_parallel().describe(seq_), comm_.size()));
  if (!comm_.host_placement().empty()) console_.print("hosts      " + comm_.host_placement() + "\n");
  print_memory_per_rank();
  if (const auto& shards = trainer_->optimizer().shards(); shards && !trainer_->weight_shards()) {
    const bool zero2 = config_.train.shard == ShardMode::gradients;
    console_.print(fmt::format("shard      distributed.shard={} ({}): each rank holds the AdamW state of its slice of "
                               "the {} parameters (rank 0: [{}, {})){}; weights all-gathered\n",
                               to_string(config_.train.shard), zero2 ? "ZeRO-2" : "ZeRO-1", shards->layout.total(),
                               shards->layout.begin(0), shards->layout.end(0),
                               zero2 ? " and of the summed gradient only that slice: each block's gradients "
                                       "reduce-scattered as the backward pass completes them"
                                     : "; gradients reduce-scattered after the backward pass"));
  }
  if (const WeightShards* weights = trainer_->weight_shards())
    console_.print(fmt::format("shard      distributed.shard=full (ZeRO-3): each rank holds the FP32 weights and "
                               "AdamW state of its slice of the {} parameters (rank 0: [{}, {})); each block's "
                               "weights all-gathered {} before its forward and its backward and freed after; "
                               "of the summed gradient only that slice (each block's reduce-scattered as the backward "
                               "pass completes it)\n",
                               weights->layout().total(), weights->owned_begin(), weights->owned_end(),
                               config_.train.fp4_param_gather
                                   ? "(the linears' NVFP4 16x16-tile weights as codes and scales, the rest in FP32)"
                                   : "in FP32 (distributed.fp4_param_gather=false)"));
  // MFU over the whole job: every rank has the peak rank 0 measured (homogeneous hosts).
  job_peak_flops_ = peak * comm_.size();
}

// The memory plan of this job (run/memory_plan.h): rank 0, and the largest other rank.
void TrainingRun::print_memory_per_rank() {
  MemoryPlanInput in;
  in.train = config_.train;
  in.ranks = comm_.size();
  in.shard = config_.train.shard;
  in.process_bytes = process_bytes_;
  console_.print(fmt::format("memory/rank 0{}: {}\n", comm_.size() > 1 ? "" : " (this process)",
                             describe_rank_memory(plan_rank_memory(in, 0))));
  if (comm_.size() == 1) return;
  RankMemory largest = plan_rank_memory(in, 1);
  for (int r = 2; r < comm_.size(); ++r)
    if (const RankMemory m = plan_rank_memory(in, r); m.resident() > largest.resident()) largest = m;
  const std::string others = comm_.size() == 2 ? "1" : fmt::format("1-{} (the largest)", comm_.size() - 1);
  console_.print(fmt::format("memory/rank {}: {}\n", others, describe_rank_memory(largest)));
}

// At the end of a run: every rank's peak resident memory (VmHWM) beside the plan's prediction for
// it (the start-up lines' figures: training, start-up, rank 0's checkpoint). Collective.
void TrainingRun::print_peak_memory_per_rank() {
  const std::vector<uint64_t> peaks = comm_.all_gather(static_cast<uint64_t>(peak_resident_bytes()));
  MemoryPlanInput in;
  in.train = config_.train;
  in.ranks = comm_.size();
  in.shard = config_.train.shard;
  in.process_bytes = process_bytes_;
  std::string text;
  for (int r = 0; r < comm_.size(); ++r)
    text += fmt::format("memory/rank {}: peak resident {}, predicted {}\n", r,
                        bytes_text(static_cast<double>(peaks[static_cast<size_t>(r)])),
                        bytes_text(static_cast<double>(plan_rank_memory(in, r).peak())));
  console_.print(text);
}

// One line per source of a mixture: its share of the rows and its tokens.
std::string TrainingRun::describe_sources() const {
  double total = 0;
  for (const LoadedSource& s : sources_) total += s.weight;
  std::string out;
  for (const LoadedSource& s : sources_)
    out += fmt::format("source     {}: weight {:.4g} ({:.1f}% of the rows), {} train / {} val tokens\n", s.name,
                       s.weight, 100 * s.weight / total, format_si(static_cast<double>(s.data.train.size())),
                       format_si(static_cast<double>(s.data.val.size())));
  return out;
}

// The loop: a step, then its side concerns (divergence, spikes, logging, replica checks,
// evaluation, checkpoints, stop signals), each in an object of its own.
int TrainingRun::train() {
  const StepLogShape shape{tokens_per_step_, total_steps_, training_flops_per_token(config_.train.model, seq_),
                           job_peak_flops_};
  StepLog log(run_dir_, root_, config_.tensorboard, config_.resume && existing_ ? state_.step : -1, shape, comm_,
              console_);
  CheckpointOptions checkpoint_options;
  checkpoint_options.keep = config_.checkpoint_keep;
  checkpoint_options.tokenizer_identity = tokenizer_identity_;
  if (faults_.kill_during_checkpoint)
    checkpoint_options.after_weights_written = [at = *faults_.kill_during_checkpoint](int64_t step) {
      if (at == FaultPlan::kAnyStep || at == step) std::raise(SIGKILL);
    };
  RunCheckpoints checkpoints(run_dir_, saved_config_, root_, *trainer_, checkpoint_options, resumed_from_);
  SpikeWatch spikes;
  clock_.emplace(state_.elapsed_s);
  double last_loss = std::nan(""), last_val = std::nan("");
  if (state_.step >= total_steps_)
    console_.print(fmt::format("the run is already complete at step {} of {}\n", state_.step, total_steps_));
  const StopSignals stop_signals;
  while (trainer_->steps_done() < total_steps_) {
    crash_if_planned();
    const auto t0 = std::chrono::steady_clock::now();
    StepResult r;
    if (const auto failed = take_step(r, checkpoints)) return *failed;
    new_run_cleanup_.armed = false;  // a step is done: from now on the directory is a run's
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    log.add_step_time(seconds);
    step_seconds_ += seconds;
    state_.step = r.step;
    state_.tokens += tokens_per_step_;
    state_.micro_batches += config_.train.grad_accum;
    last_loss = r.loss;
    if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) return stop_on_non_finite_loss(r, seconds, log, checkpoints);
    spikes.observe(r.step, r.loss, checkpoints, console_);
    const bool last_step = r.step == total_steps_;
    if (r.step % config_.log_interval == 0 || last_step) {
      log.log_step(r.step, state_.tokens, r.loss, r.lr, r.grad_norm, clock_->elapsed_s());
      check_replicas(r.step);
    } else {
      log.show_progress(r.step, r.loss, seconds);
    }
    if (r.step % config_.eval_interval == 0 || last_step) last_val = evaluate(r.step, log);
    if (r.step % config_.checkpoint_interval == 0 || last_step)
      checkpoints.save_interval(state_, clock_->elapsed_s(), spikes.in_spike(), console_);
    if (const auto stopped = stop_if_signalled(r.step, stop_signals, checkpoints, spikes)) return *stopped;
  }
  return finish(last_loss, last_val, checkpoints);
}

void TrainingRun::crash_if_planned() const {
  if (!faults_.rank_exits.at(comm_.rank(), trainer_->steps_done() + 1)) return;
  std::fprintf(stderr, "nibble: injected fault: rank %d exits before step %ld\n", comm_.rank(),
               static_cast<long>(trainer_->steps_done() + 1));
  std::fflush(stderr);
  std::_Exit(kExitInjectedCrash);
}

// One optimizer step. The config and data were checked before the first step, so a NumericalError
// inside one is the numbers going wrong: typically a quantizer meeting non-finite activations after
// divergence. Returns the exit code when the run stops there.
std::optional<int> TrainingRun::take_step(StepResult& r, const RunCheckpoints& checkpoints) {
  try {
    if (faults_.rank_step_fails.at(comm_.rank(), trainer_->steps_done() + 1))
      throw NumericalError("injected fault: non-finite activations");
    r = trainer_->step();
    if (faults_.loss_spike_from > 0 && r.step >= faults_.loss_spike_from) r.loss += FaultPlan::kSpikeAddedLoss;
    if (faults_.loss_nan_at > 0 && r.step == faults_.loss_nan_at) r.loss = std::nan("");
    return std::nullopt;
  } catch (const NumericalError& e) {
    console_.end_live_line();
    const std::string message =
        fmt::format("training stopped at step {}: {}\nthe run has probably diverged. last good checkpoint: {}\n{}",
                    trainer_->steps_done() + 1, e.what(), checkpoints.last_good_text(), checkpoints.resume_advice());
    // With the data split over ranks, this rank may be the only one that met the bad numbers: the
    // others wait in the gradient sum, so the whole job has to be ended from here.
    if (comm_.size() > 1) comm_.abort(message, kExitNonFiniteLoss);
    console_.print("error: " + message + "\n");
    return kExitNonFiniteLoss;
  }
}

int TrainingRun::stop_on_non_finite_loss(const StepResult& r, double seconds, StepLog& log,
                                         const RunCheckpoints& checkpoints) {
  console_.end_live_line();
  log.log_failed_step(StepRecord{r.step, total_steps_, state_.tokens, r.loss, r.lr, r.grad_norm, seconds, 0, 0, 0,
                                 clock_->elapsed_s()});
  console_.print(fmt::format("error: the training loss is {} at step {} (gradient norm {}): training stopped, nothing "
                             "of it saved.\nlast good checkpoint: {}\n{}\n",
                             r.loss, r.step, r.grad_norm, checkpoints.last_good_text(), checkpoints.resume_advice()));
  return kExitNonFiniteLoss;
}

// Replicas must stay bitwise identical (same summed gradients, same AdamW): a cheap check.
void TrainingRun::check_replicas(int64_t step) {
  // distributed.shard=full: each rank holds its slice of the weights only, so there is no replica.
  if (comm_.size() == 1 || trainer_->weight_shards()) return;
  // On the CPU the arena is host memory, checksummed in place: a host copy at every logged step
  // would add the weights' size again to every rank's memory.
  const model::ParamArena& params = trainer_->model().params();
  const bool host = trainer_->model().backend().device() == ops::Device::cpu;
  const std::vector<float> copy = host ? std::vector<float>() : params.host_values();
  const std::string diverged = check_replicas_identical(comm_, host ? params.values() : std::span<const float>(copy), step);
  if (!diverged.empty() && root_) comm_.abort(diverged, 1);
}

double TrainingRun::evaluate(int64_t step, StepLog& log) {
  EvalRecord e;
  e.step = step;
  e.tokens = state_.tokens;
  const Validation v = trainer_->evaluate_sources();
  e.val_loss = v.loss;
  // A mixture's per-source losses (data.sources names them; a data.dir run has the one loss).
  if (!config_.sources.empty())
    for (size_t s = 0; s < sources_.size(); ++s) e.sources.emplace_back(sources_[s].name, v.per_source[s]);
  e.elapsed_s = clock_->elapsed_s();
  if (std::isfinite(e.val_loss) && (state_.best_val_step < 0 || e.val_loss < state_.best_val_loss)) {
    state_.best_val_loss = e.val_loss;
    state_.best_val_step = step;
  }
  log.log_eval(e);
  return e.val_loss;
}

// Every rank stops after the same step: rank 0's signal decides (mpirun forwards it to all).
std::optional<int> TrainingRun::stop_if_signalled(int64_t step, const StopSignals& signals, RunCheckpoints& checkpoints,
                                                  const SpikeWatch& spikes) {
  int64_t stop = signals.received();
  if (comm_.size() > 1) comm_.broadcast_values(std::span(&stop, 1), 0);
  if (stop == 0 || step == total_steps_) return std::nullopt;
  checkpoints.save_before_stop(state_, clock_->elapsed_s(), spikes.in_spike());
  console_.print(fmt::format("{}stopped by {} after step {} of {}: checkpoint {} written.\ncontinue the run with: "
                             "nibble train {} resume=true\n",
                             console_.clear_line(), stop == SIGINT ? "SIGINT" : "SIGTERM", step, total_steps_,
                             checkpoint_path(run_dir_, step).string(), saved_config_.string()));
  if (spikes.in_spike()) {
    const auto& last_good = checkpoints.last_good();
    console_.print(fmt::format("note: the loss has been spiking since step {}; the last checkpoint before the spike is "
                               "{}{}\n",
                               spikes.spike_step(), checkpoints.last_good_text(),
                               last_good ? " (resume=true --checkpoint " + last_good->filename().string() +
                                               " continues from it)"
                                         : ""));
  }
  return 128 + static_cast<int>(stop);
}

int TrainingRun::finish(double last_loss, double last_val, const RunCheckpoints& checkpoints) {
  const double wall = clock_->elapsed_s();
  if (std::isnan(last_loss)) {  // nothing left to train
    console_.print(fmt::format("run directory: {}; newest checkpoint {}\n", run_dir_.string(),
                               checkpoints.last_good_text()));
    return 0;
  }
  console_.print(fmt::format(
      "done: {} steps, {} tokens in {}; final train loss {:.4f}, val loss {:.4f}{}{}\nrun directory: {}\n", state_.step,
      format_si(static_cast<double>(state_.tokens)), format_duration(wall), last_loss, last_val,
      config_.sources.empty() ? "" : " (weight-averaged over the sources)",
      state_.best_val_step >= 0 ? fmt::format(" (best {:.4f} at step {})", state_.best_val_loss, state_.best_val_step)
                                : std::string(),
      run_dir_.string()));
  print_peak_memory_per_rank();
  if (const WeightShards* weights = trainer_->weight_shards(); weights && comm_.size() > 1)
    console_.print(fmt::format("shard: each training step all-gathered {} of weights into rank 0, {} of them "
                               "quantized linear weights (the whole arena in FP32: {})\n",
                               bytes_text(trainer_->gathered_bytes_per_step()),
                               bytes_text(trainer_->gathered_quantized_bytes_per_step()),
                               bytes_text(static_cast<double>(weights->layout().total()) * sizeof(float))));
  if (step_seconds_ > 0)
    console_.print(fmt::format("data: {:.3g}s of {:.3g}s in training steps went to copying windows out of the token "
                               "files ({:.3g}%)\n",
                               trainer_->data_seconds(), step_seconds_, 100 * trainer_->data_seconds() / step_seconds_));
  return 0;
}

}  // namespace

int run_training(const RunConfig& config, std::FILE* out) {
  SingleProcessCommunicator single_process;
  return run_training(config, out, single_process);
}

int run_training(const RunConfig& config, std::FILE* out, Communicator& comm, const FaultPlan& faults) {
  TrainingRun run(config, out, comm, faults);
  return run.run();
}

}  // namespace nibble::train
