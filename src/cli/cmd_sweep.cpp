// `nibble sweep BASE.yaml key=v1,v2 ... [--variant "k=v ..."]... [-o SWEEP] [--steps N] [--parallel K]
// [--baseline NAME] [--dry-run]`: a grid of training runs, resumable, then their comparison at equal
// tokens and one loss plot (run/sweep.h).
#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "common/error.h"
#include "run/sweep.h"

namespace nibble::cli {
namespace {

struct SweepCliOptions {
  std::string base;
  std::vector<std::string> grid, variants;
  std::string output, baseline;
  int64_t steps = 0;
  int parallel = 1;
  bool dry_run = false;
};

// The program the runs are: this nibble, wherever it was started from.
std::string this_program() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw UsageError("sweep starts each run as `nibble train` and needs /proc/self/exe to find this nibble: mount /proc");
  return exe.string();
}

CommandRegistration sweep_command("sweep", [](CLI::App& app, int& exit_code) {
  auto o = std::make_shared<SweepCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "sweep", "Train a grid of runs on one config (resumable), then compare them at equal tokens and plot them");
  cmd->add_option("config", o->base, "the base YAML config every run starts from")->required();
  cmd->add_option("grid", o->grid, "key=v1,v2 words: every combination of their values is a run");
  cmd->add_option("--variant", o->variants,
                  "one more run with these key=value words (quoted, space-separated), e.g. --variant "
                  "'quantization=nvfp4 nvfp4.rht=false'; repeatable");
  cmd->add_option("-o,--output", o->output, "the sweep's directory, holding a run directory per run (default: "
                                            "runs/sweep-CONFIG_NAME)");
  cmd->add_option("--steps", o->steps, "steps of every run (default: the config's)")->check(CLI::PositiveNumber);
  cmd->add_option("--parallel", o->parallel, "runs training at a time, each on cores / K threads")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--baseline", o->baseline, "the run the gaps are measured against (its name; default: the first)");
  cmd->add_flag("--dry-run", o->dry_run, "list the runs, their directories and whether each is finished; run nothing");
  cmd->callback([o, &exit_code] {
    train::SweepOptions s;
    s.base_config = o->base;
    s.grid = o->grid;
    s.variants = o->variants;
    s.dir = o->output.empty() ? std::filesystem::path("runs") / ("sweep-" + s.base_config.stem().string())
                              : std::filesystem::path(o->output);
    s.steps = o->steps;
    s.parallel = o->parallel;
    s.baseline = o->baseline;
    s.dry_run = o->dry_run;
    exit_code = train::run_sweep(s, s.dry_run ? std::string() : this_program());
  });
});

}  // namespace
}  // namespace nibble::cli
