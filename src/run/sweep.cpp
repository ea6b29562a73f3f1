#include "run/sweep.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <omp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "io/atomic_file.h"
#include "io/write_rules.h"
#include "ops/backend.h"
#include "model/transformer.h"
#include "recipe/recipe.h"
#include "run/checkpoint.h"
#include "run/config.h"
#include "run/metrics.h"

namespace nibble::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSweepManifest = "sweep.json";
constexpr const char* kSweepPlot = "sweep.png";

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, separator);) out.push_back(item);
  if (!text.empty() && text.back() == separator) out.push_back("");
  return out;
}

// A run directory's name from its overrides: the words joined by ',', with '/' (a path among the
// values) and '%' percent-encoded so that the name is one path component.
std::string run_name(const std::vector<std::string>& overrides) {
  std::string name;
  for (const auto& word : overrides) {
    if (!name.empty()) name += ',';
    for (char ch : word) name += ch == '/' ? std::string("%2F") : ch == '%' ? std::string("%25") : std::string(1, ch);
  }
  return name;
}

struct Axis {
  std::string key;
  std::vector<std::string> values;
};

// "key=v1,v2" -> {key, [v1, v2]}; the sweep decides run.dir and resume itself.
Axis parse_axis(const std::string& word) {
  const auto eq = word.find('=');
  if (eq == std::string::npos || eq == 0)
    throw UsageError(fmt::format("'{}' is not key=v1,v2 (example: quantization=bf16,nvfp4)", word));
  Axis a{word.substr(0, eq), split(word.substr(eq + 1), ',')};
  for (const auto& v : a.values)
    if (v.empty())
      throw UsageError(fmt::format("'{}' has an empty value: list values separated by single commas", word));
  return a;
}

void refuse_sweep_owned_key(const std::string& key, const std::string& word) {
  if (key == "run.dir" || key == "resume")
    throw UsageError(fmt::format("'{}': the sweep sets {} itself (each run trains into SWEEP/NAME and resumes there); "
                                 "drop it (-o names SWEEP)",
                                 word, key));
}

// Every combination of the axes' values, the first axis varying slowest.
std::vector<std::vector<std::string>> grid_runs(const std::vector<Axis>& axes) {
  std::vector<std::vector<std::string>> runs{{}};
  for (const Axis& axis : axes) {
    std::vector<std::vector<std::string>> next;
    for (const auto& run : runs)
      for (const auto& value : axis.values) {
        next.push_back(run);
        next.back().push_back(axis.key + "=" + value);
      }
    runs = std::move(next);
  }
  return axes.empty() ? std::vector<std::vector<std::string>>{} : runs;
}

// The run's config as `nibble train` resolves it, checked as far as it can be without the data.
int64_t checked_steps(const SweepOptions& o, const std::vector<std::string>& overrides, const std::string& name,
                      bool in_grid) {
  std::vector<std::string> words = overrides;
  if (o.steps > 0) words.push_back("steps=" + std::to_string(o.steps));
  try {
    const RunConfig c = load_run_config(o.base_config.string(), words);  // validated there
    // Tokens 0: the micro-batch's token count is checked when the run starts (it depends on the ranks).
    Recipe(c.train.recipe, static_cast<int>(c.train.model.layers), model::block_linear_shapes(c.train.model), 0, ops::cpu());
    return c.train.schedule.total_steps;
  } catch (const UsageError& e) {
    throw UsageError(fmt::format("sweep run {}: {}{}", name, e.what(),
                                 in_grid ? " (the key=v1,v2 words run every combination of their values: give runs "
                                           "that differ in several keys as --variant 'k=v k2=v2')"
                                         : ""));
  }
}

}  // namespace

std::vector<SweepRun> plan_sweep(const SweepOptions& o) {
  std::vector<Axis> axes;
  std::set<std::string> keys;
  for (const auto& word : o.grid) {
    axes.push_back(parse_axis(word));
    refuse_sweep_owned_key(axes.back().key, word);
    if (!keys.insert(axes.back().key).second)
      throw UsageError(fmt::format("{} is swept twice: give all its values in one word ({}=a,b,c)", axes.back().key,
                                   axes.back().key));
  }
  std::vector<std::vector<std::string>> settings = grid_runs(axes);
  for (const auto& variant : o.variants) {
    std::vector<std::string> words;
    for (const auto& word : split(variant, ' '))
      if (!word.empty()) {
        const auto eq = word.find('=');
        if (eq == std::string::npos || eq == 0)
          throw UsageError(fmt::format("--variant '{}': '{}' is not key=value", variant, word));
        refuse_sweep_owned_key(word.substr(0, eq), word);
        words.push_back(word);
      }
    if (words.empty()) throw UsageError("--variant '' sets nothing: give key=value words, e.g. --variant 'quantization=bf16'");
    settings.push_back(words);
  }
  if (settings.empty())
    throw UsageError("the sweep has no runs: give key=v1,v2 words (every combination runs) or --variant 'k=v ...'");
  std::vector<SweepRun> runs;
  std::set<std::string> names;
  const size_t grid_count = settings.size() - o.variants.size();
  for (size_t i = 0; i < settings.size(); ++i) {
    SweepRun r{run_name(settings[i]), settings[i], 0};
    if (!names.insert(r.name).second)
      throw UsageError(fmt::format("the run {} is listed twice: drop the repeated value or --variant", r.name));
    r.steps = checked_steps(o, settings[i], r.name, i < grid_count);
    runs.push_back(std::move(r));
  }
  if (!o.baseline.empty() && !names.count(o.baseline)) {
    std::string all;
    for (const auto& r : runs) all += (all.empty() ? "" : ", ") + r.name;
    throw UsageError(fmt::format("--baseline {} is not a run of this sweep: the runs are {}", o.baseline, all));
  }
  return runs;
}

SweepRunState sweep_run_state(const fs::path& run_dir, int64_t steps) {
  std::error_code ec;
  if (fs::is_directory(checkpoint_path(run_dir, steps), ec)) return SweepRunState::finished;
  return list_checkpoints(run_dir).empty() ? SweepRunState::to_start : SweepRunState::to_resume;
}

namespace {

std::string_view to_string(SweepRunState s) {
  return s == SweepRunState::finished ? "finished" : s == SweepRunState::to_resume ? "to resume" : "to start";
}

// SWEEP: not a run or data directory nor inside one; new, empty, or a sweep of the same base
// config and steps (another would find runs trained on other settings under the same names).
void prepare_sweep_dir(const SweepOptions& o, const std::vector<SweepRun>& runs) {
  if (const auto owned = io::enclosing_owned_directory(o.dir))
    throw UsageError(fmt::format("sweep -o {}: {} is a {}; the sweep's runs go into a directory of their own: give another -o",
                                 o.dir.string(), owned->dir.string(), io::to_string(owned->kind)));
  const fs::path manifest = o.dir / kSweepManifest;
  nlohmann::json j;
  j["base_config"] = fs::absolute(o.base_config).lexically_normal().string();
  j["steps"] = o.steps;
  std::error_code ec;
  if (fs::exists(manifest, ec)) {
    const auto old = nlohmann::json::parse(io::read_file_bytes(manifest), nullptr, false);
    if (old.is_discarded() || old.value("base_config", "") != j["base_config"] || old.value("steps", -1) != o.steps)
      throw UsageError(fmt::format(
          "sweep -o {} holds a sweep of {}: its runs would continue on other settings; give another -o",
          o.dir.string(),
          old.is_discarded() ? std::string("other settings (its sweep.json is unreadable)")
                             : fmt::format("{} with --steps {} (this one: {} with --steps {}; 0: the config's)",
                                           old.value("base_config", "?"), old.value("steps", int64_t{-1}),
                                           j["base_config"].get<std::string>(), o.steps)));
  } else if (fs::exists(o.dir, ec) && !fs::is_empty(o.dir, ec)) {
    throw UsageError(fmt::format("sweep -o {} is a directory holding other files (no sweep.json): give a new or empty "
                                 "directory",
                                 o.dir.string()));
  }
  for (const auto& r : runs) j["runs"].push_back({{"name", r.name}, {"overrides", r.overrides}});
  fs::create_directories(o.dir);
  const std::string text = j.dump(2) + "\n";
  io::write_file_atomically(manifest, {reinterpret_cast<const uint8_t*>(text.data()), text.size()});
}

volatile sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int signal) {
  if (!g_stop_signal) g_stop_signal = signal;
}

// SIGINT and SIGTERM set g_stop_signal while the sweep runs (restored after).
struct SweepSignals {
  struct sigaction previous[2] {};
  SweepSignals() {
    g_stop_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, &previous[0]);
    ::sigaction(SIGTERM, &sa, &previous[1]);
  }
  ~SweepSignals() {
    ::sigaction(SIGINT, &previous[0], nullptr);
    ::sigaction(SIGTERM, &previous[1], nullptr);
  }
};

// `nibble train BASE overrides... run.dir=SWEEP/NAME threads=T [steps=N] [resume=true]`, its output
// appended to SWEEP/NAME.log. In its own process group, so that a Ctrl-C reaches the sweep alone and
// the sweep sends each run one SIGTERM (a run's second signal would end it without a checkpoint);
// and SIGTERM when the sweep dies, so that no run trains on unobserved.
pid_t start_run(const SweepOptions& o, const SweepRun& r, const std::string& program, int threads, bool resume) {
  std::vector<std::string> args = {program, "train", o.base_config.string()};
  args.insert(args.end(), r.overrides.begin(), r.overrides.end());
  if (o.steps > 0) args.push_back("steps=" + std::to_string(o.steps));
  bool threads_set = false;
  for (const auto& w : r.overrides) threads_set |= w.starts_with("threads=");
  if (!threads_set) args.push_back("threads=" + std::to_string(threads));
  args.push_back("run.dir=" + (o.dir / r.name).string());
  if (resume) args.push_back("resume=true");
  const std::string log = (o.dir / (r.name + ".log")).string();
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(fmt::format("sweep: cannot start a run: {}", std::strerror(errno)));
  if (pid > 0) return pid;
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd >= 0) ::dup2(fd, 1), ::dup2(fd, 2);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execv(argv[0], argv.data());
  std::fprintf(stderr, "sweep: cannot run %s: %s\n", argv[0], std::strerror(errno));
  ::_exit(127);
}

struct Running {
  size_t run = 0;
  std::chrono::steady_clock::time_point start;
};

// Runs the runs not finished, `parallel` at a time; returns the names of those that failed.
std::vector<std::string> train_runs(const SweepOptions& o, const std::vector<SweepRun>& runs, const std::string& program) {
  const int threads = std::max(1, omp_get_max_threads() / std::max(1, o.parallel));
  std::vector<size_t> queue;
  for (size_t i = 0; i < runs.size(); ++i)
    if (sweep_run_state(o.dir / runs[i].name, runs[i].steps) != SweepRunState::finished) queue.push_back(i);
  fmt::print("sweep: {} runs, {} finished before; {} to train, {} at a time on {} threads each\n", runs.size(),
             runs.size() - queue.size(), queue.size(), o.parallel, threads);
  SweepSignals signals;
  std::map<pid_t, Running> running;
  std::vector<std::string> failed;
  size_t next = 0, done = 0;
  bool stopping = false;
  while ((!stopping && next < queue.size()) || !running.empty()) {
    while (!stopping && next < queue.size() && static_cast<int>(running.size()) < o.parallel) {
      const SweepRun& r = runs[queue[next++]];
      const bool resume = sweep_run_state(o.dir / r.name, r.steps) == SweepRunState::to_resume;
      running[start_run(o, r, program, threads, resume)] = {queue[next - 1], std::chrono::steady_clock::now()};
      fmt::print("[{}/{}] {} {} (log: {})\n", next, queue.size(), resume ? "resuming" : "starting", r.name,
                 (o.dir / (r.name + ".log")).string());
      std::fflush(stdout);
    }
    if (g_stop_signal && !stopping) {
      stopping = true;
      fmt::print("sweep: stopping: each running run writes a checkpoint and stops; run the same sweep again to "
                 "continue\n");
      for (const auto& [pid, _] : running) ::kill(pid, SIGTERM);
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    const auto it = running.find(pid);
    if (it == running.end()) continue;
    const SweepRun& r = runs[it->second.run];
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - it->second.start).count();
    running.erase(it);
    ++done;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      fmt::print("[{}/{} done] {} finished in {}\n", done, queue.size(), r.name, format_duration(seconds));
    } else if (stopping && WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM) {
      fmt::print("{} stopped after {} at a checkpoint it resumes from\n", r.name, format_duration(seconds));
    } else {
      failed.push_back(r.name);
      fmt::print("[{}/{} done] {} {} after {}: see {}\n", done, queue.size(), r.name,
                 WIFEXITED(status) ? fmt::format("exited with status {}", WEXITSTATUS(status))
                                   : fmt::format("was killed by signal {}", WTERMSIG(status)),
                 format_duration(seconds), (o.dir / (r.name + ".log")).string());
    }
    std::fflush(stdout);
  }
  return failed;
}

}  // namespace

std::string sweep_table(const std::vector<RunSummary>& runs, size_t baseline) {
  // Equal tokens: the fewest tokens any run evaluated at last; each run's last evaluation up to them.
  int64_t common = INT64_MAX;
  for (const auto& r : runs)
    if (!r.history.evals.empty()) common = std::min(common, r.history.evals.back().tokens);
  auto val_at_common = [&](const RunSummary& r) {
    double v = NAN;
    for (const auto& e : r.history.evals)
      if (e.tokens <= common) v = e.val_loss;
    return v;
  };
  size_t width = 3;
  for (const auto& r : runs) width = std::max(width, r.name.size());
  std::string out = fmt::format("{:<{}}  {:>7} {:>10} {:>10} {:>9} {:>9} {:>10} {:>9}\n", "run", width, "steps",
                                "val loss", "best val", "gap %", "gap nats", "tokens/s", "time");
  const double reference = baseline < runs.size() ? val_at_common(runs[baseline]) : NAN;
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunSummary& r = runs[i];
    const double v = val_at_common(r);
    const bool gap = i != baseline && std::isfinite(v) && std::isfinite(reference);
    out += fmt::format("{:<{}}  {:>7} {:>10} {:>10} {:>9} {:>9} {:>10.0f} {:>9}\n", r.name, width, r.steps,
                       std::isfinite(v) ? fmt::format("{:.4f}", v) : "-",
                       r.has_val ? fmt::format("{:.4f}", r.best_val_loss) : "-",
                       i == baseline ? "(base)" : gap ? fmt::format("{:+.2f}%", 100.0 * (v / reference - 1.0)) : "-",
                       gap ? fmt::format("{:+.4f}", v - reference) : "-", r.tokens_per_s, format_duration(r.wall_s));
  }
  if (common != INT64_MAX)
    out += fmt::format("val loss: each run's last evaluation at or before {} tokens (the fewest any run reached); gap: "
                       "against {}; best val: the lowest evaluation of the whole run; tokens/s: median of the "
                       "logged windows\n",
                       common, baseline < runs.size() ? runs[baseline].name : std::string("-"));
  return out;
}

int run_sweep(const SweepOptions& o, const std::string& nibble_program) {
  if (o.parallel < 1) throw UsageError(fmt::format("--parallel {} must be at least 1", o.parallel));
  const std::vector<SweepRun> runs = plan_sweep(o);
  if (o.dry_run) {
    for (const auto& r : runs)
      fmt::print("{:<12} {}  ({} steps: {})\n", to_string(sweep_run_state(o.dir / r.name, r.steps)),
                 (o.dir / r.name).string(), r.steps, fmt::join(r.overrides, " "));
    return 0;
  }
  prepare_sweep_dir(o, runs);
  const std::vector<std::string> failed = train_runs(o, runs, nibble_program);
  std::vector<RunSummary> summaries;
  size_t baseline = 0;
  for (const auto& r : runs) {
    if (r.name == o.baseline) baseline = summaries.size();
    try {
      summaries.push_back(summarize_run(o.dir / r.name));
    } catch (const UsageError&) {
      fmt::print("{}: no metrics (the run did not get to its first step)\n", r.name);
    }
  }
  if (!summaries.empty()) {
    fmt::print("\n{}", sweep_table(summaries, std::min(baseline, summaries.size() - 1)));
    plot_loss_curves(summaries, o.dir / kSweepPlot);
    fmt::print("plot: {}\n", (o.dir / kSweepPlot).string());
  }
  if (g_stop_signal) return 128 + g_stop_signal;
  if (!failed.empty()) {
    fmt::print("{} of {} runs failed: {} (their logs are in {})\n", failed.size(), runs.size(), fmt::join(failed, ", "),
               o.dir.string());
    return 1;
  }
  return 0;
}

}  // namespace nibble::train
