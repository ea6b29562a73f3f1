// `nibble sweep` (run/sweep.h) through the binary on tiny runs: the grid and variants it plans, the
// refusals, a finished sweep run again trains nothing, an interrupted one resumes its runs where
// they stopped (bitwise the uninterrupted run), and the table compares at equal tokens.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "run/compare.h"
#include "run/sweep.h"
#include "support/cli.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;

namespace {

using cli_test::contains;
using cli_test::Result;
using cli_test::run;

fs::path work_dir() { return nibble_test::process_dir("test_sweep"); }

std::string file_text(const fs::path& p) {
  const auto bytes = cli_test::file_bytes(p);
  return std::string(bytes.begin(), bytes.end());
}

// WORK/NAME with the tiny corpus prepared and BASE.yaml: a 2-block model, `steps` steps,
// evaluated and checkpointed every 10.
fs::path set_up(const std::string& name, int steps) {
  const fs::path work = work_dir() / name;
  fs::remove_all(work);
  fs::create_directories(work);
  const Result p = cli_test::prepare_tiny_corpus(work, work / "data");
  EXPECT_EQ(p.exit_code, 0) << p.output;
  std::ofstream(work / "base.yaml") << "data:\n  dir: " << (work / "data").string() << "\nsteps: " << steps
                                    << "\nbatch: 4\nquantization: none\n"
                                       "model: {layers: 2, heads: 2, width: 32, context: 32}\n"
                                       "schedule: {warmup_steps: 4}\neval: {interval: 10, batches: 2}\n"
                                       "checkpoint: {interval: 10, keep: 2}\nlog: {interval: 5}\nthreads: 1\n";
  return work;
}

std::string sweep_args(const fs::path& work, const std::string& rest) {
  return "sweep " + (work / "base.yaml").string() + " " + rest + " -o " + (work / "sweep").string();
}

TEST(Sweep, PlansEveryCombinationThenTheVariants) {
  const fs::path work = set_up("plan", 20);
  nibble::train::SweepOptions o;
  o.base_config = work / "base.yaml";
  o.grid = {"quantization=bf16,nvfp4", "seed=1,2"};
  o.variants = {"quantization=nvfp4 precision_switch_at=0.5 precision_switch_scope=forward"};
  const auto runs = nibble::train::plan_sweep(o);
  ASSERT_EQ(runs.size(), 5u);
  EXPECT_EQ(runs[0].name, "quantization=bf16,seed=1");
  EXPECT_EQ(runs[1].name, "quantization=bf16,seed=2");
  EXPECT_EQ(runs[3].name, "quantization=nvfp4,seed=2");
  EXPECT_EQ(runs[4].name, "quantization=nvfp4,precision_switch_at=0.5,precision_switch_scope=forward");
  EXPECT_EQ(runs[4].steps, 20);
}

TEST(Sweep, RefusesWithTheReasonBeforeAnythingRuns) {
  const fs::path work = set_up("refuse", 20);
  auto refused = [&](const std::string& rest, const std::string& reason) {
    const Result r = run(sweep_args(work, rest));
    EXPECT_EQ(r.exit_code, 2) << rest << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, reason)) << rest << "\n" << r.output;
    EXPECT_FALSE(fs::exists(work / "sweep")) << rest;
  };
  refused("quantization=bf16,nvfp4 nvfp4.rht=true,false", "give runs that differ in several keys as --variant");
  refused("quantization=bf16,,nvfp4", "has an empty value");
  refused("quantization=bf16 quantization=nvfp4", "quantization is swept twice");
  refused("run.dir=a,b", "the sweep sets run.dir itself");
  refused("quantization=bf16,bf16", "is listed twice");
  refused("model.layerz=1,2", "model.layerz");
  refused("quantization=bf16,nvfp4 --baseline fp8", "--baseline fp8 is not a run of this sweep");
  refused("", "the sweep has no runs");
}

TEST(Sweep, AFinishedSweepTrainsNothingAgainAndTablesAtEqualTokens) {
  const fs::path work = set_up("finished", 20);
  Result r = run(sweep_args(work, "quantization=bf16,nvfp4 --variant 'quantization=nvfp4 nvfp4.rht=false' --parallel 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "3 runs, 0 finished before; 3 to train, 2 at a time")) << r.output;
  EXPECT_TRUE(fs::exists(work / "sweep" / "sweep.png"));
  EXPECT_TRUE(contains(r.output, "(base)")) << r.output;
  const auto metrics = cli_test::file_bytes(work / "sweep" / "quantization=nvfp4,nvfp4.rht=false" / "metrics.jsonl");

  r = run(sweep_args(work, "quantization=bf16,nvfp4 --variant 'quantization=nvfp4 nvfp4.rht=false' --baseline quantization=nvfp4"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "3 runs, 3 finished before; 0 to train")) << r.output;
  EXPECT_EQ(cli_test::file_bytes(work / "sweep" / "quantization=nvfp4,nvfp4.rht=false" / "metrics.jsonl"), metrics);
  EXPECT_TRUE(contains(r.output, "gap: against quantization=nvfp4")) << r.output;

  r = run(sweep_args(work, "quantization=bf16 --dry-run"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "finished")) << r.output;
  // Another --steps would continue these runs on another schedule: refused, naming both.
  r = run(sweep_args(work, "quantization=bf16 --steps 30"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "with --steps 0 (this one:")) << r.output;
}

// The table compares every run at the tokens the shortest reached.
TEST(Sweep, TheTableComparesAtTheTokensEveryRunReached) {
  using nibble::train::RunSummary;
  auto summary = [](const std::string& name, std::vector<std::pair<int64_t, double>> evals) {
    RunSummary s;
    s.name = name;
    for (auto [tokens, loss] : evals) {
      nibble::train::EvalRecord e;
      e.tokens = tokens;
      e.val_loss = loss;
      s.history.evals.push_back(e);
    }
    s.has_val = true;
    s.best_val_loss = 0.5;
    return s;
  };
  const std::string table =
      nibble::train::sweep_table({summary("base", {{100, 2.0}, {200, 1.0}}), summary("short", {{100, 2.2}})}, 0);
  EXPECT_TRUE(contains(table, "+10.00%")) << table;  // 2.2 against the base's 2.0 at 100 tokens, not its 1.0
  EXPECT_TRUE(contains(table, "+0.2000")) << table;
  EXPECT_TRUE(contains(table, "at or before 100 tokens")) << table;
}

// SIGTERM to the sweep: the running run writes a checkpoint and stops, the sweep exits 143; run
// again, the finished run is left alone and the stopped one resumes to bitwise the losses of the
// same run trained without a stop.
TEST(Sweep, AnInterruptedSweepResumesItsRuns) {
  const fs::path work = set_up("interrupted", 400);
  const std::string args = sweep_args(work, "quantization=bf16,nvfp4");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string cmd = std::string(NIBBLE_BINARY_DIR) + "/nibble " + args + " > " + (work / "first.out").string() + " 2>&1";
    ::execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), nullptr);
    ::_exit(127);
  }
  // Until the second run has a checkpoint (the first then has finished); then stop the sweep.
  const fs::path second = work / "sweep" / "quantization=nvfp4" / "checkpoints";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  while (std::chrono::steady_clock::now() < deadline && (!fs::exists(second) || fs::is_empty(second)))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  const std::string first = file_text(work / "first.out");
  ASSERT_TRUE(WIFEXITED(status)) << first;
  if (nibble::train::sweep_run_state(work / "sweep" / "quantization=nvfp4", 400) ==
      nibble::train::SweepRunState::finished)
    GTEST_SKIP() << "the second run finished before the stop reached it (a very fast machine): nothing to resume";
  EXPECT_EQ(WEXITSTATUS(status), 143) << first;
  EXPECT_TRUE(contains(first, "quantization=nvfp4 stopped after")) << first;

  const Result again = run(args);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_TRUE(contains(again.output, "2 runs, 1 finished before; 1 to train")) << again.output;
  EXPECT_TRUE(contains(again.output, "resuming quantization=nvfp4")) << again.output;

  const Result reference = run("train " + (work / "base.yaml").string() + " quantization=nvfp4 threads=2 run.dir=" +
                               (work / "reference").string());
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  EXPECT_EQ(cli_test::loss_curve(work / "sweep" / "quantization=nvfp4"), cli_test::loss_curve(work / "reference"));
}

}  // namespace
