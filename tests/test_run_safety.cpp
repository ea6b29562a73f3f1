// What `nibble train` may write and delete, through the binary on tiny runs (issue #33): nothing
// outside the run directory (symlinked checkpoints/, abandoned/, tensorboard/), nothing of the
// user's (stray-temporary cleanup, run.dir set to a data, foreign or nested directory), no run lost
// to rotation (a damaged or fake newest checkpoint), a copied run continues where it is, and
// readers always read a complete checkpoint while training rotates them.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "io/checksum.h"
#include "io/directory_lock.h"
#include "model/transformer.h"
#include "ops/backend.h"
#include "run/checkpoint.h"
#include "support/cli.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"

namespace fs = std::filesystem;

namespace {

using cli_test::contains;
using cli_test::file_bytes;
using cli_test::Result;
using cli_test::run;

fs::path work_dir() { return nibble_test::process_dir("test_run_safety"); }

// Every entry under `dir` (symlinks not followed) with a checksum of its bytes (a regular file),
// "link" or "dir": what a refused command must leave exactly as it was.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> entries;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string name = fs::relative(e.path(), dir).string();
    if (e.is_symlink()) entries[name] = "link";
    else if (e.is_regular_file()) entries[name] = nibble::io::content_hash(file_bytes(e.path()));
    else entries[name] = "dir";
  }
  return entries;
}

std::vector<std::string> checkpoint_names(const fs::path& run_dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(run_dir / "checkpoints")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

void flip_bytes(const fs::path& file, size_t at) {
  auto bytes = file_bytes(file);
  ASSERT_LT(at, bytes.size()) << file;
  bytes[at] ^= 0x5A;
  std::ofstream(file, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(bytes.data()),
                                                                static_cast<std::streamsize>(bytes.size()));
}

void write_text(const fs::path& file, const std::string& text) { std::ofstream(file) << text; }

// A PID no process has: above the kernel's limit (pid_max is at most 2^22).
constexpr long kDeadPid = 999999999;

class RunSafety : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { cli_test::set_up_tiny_run(work_dir(), data(), config(), /*steps=*/12, /*layers=*/2); }
  static void TearDownTestSuite() {
    if (!::testing::Test::HasFailure()) fs::remove_all(work_dir());  // kept for inspection on failure
  }
  static fs::path data() { return work_dir() / "data"; }
  static fs::path config() { return work_dir() / "tiny.yaml"; }
  static std::string train(const fs::path& run_dir, const std::string& extra = "") {
    return "train " + config().string() + " run.dir=" + run_dir.string() + " " + extra;
  }
  // A run of 12 steps with checkpoints at 4, 8 and 12, trained once for the suite.
  static const fs::path& reference() {
    static const fs::path dir = [] {
      const fs::path d = work_dir() / "reference";
      const Result r = run(train(d));
      EXPECT_EQ(r.exit_code, 0) << r.output;
      return d;
    }();
    return dir;
  }
  // A copy of the reference run whose saved config names the copy itself, as a run trained there would.
  static fs::path run_of_its_own(const std::string& name) {
    const fs::path dir = work_dir() / name;
    fs::remove_all(dir);
    fs::copy(reference(), dir, fs::copy_options::recursive);
    const auto bytes = file_bytes(dir / "config.yaml");
    std::string yaml(bytes.begin(), bytes.end());
    const std::string from = "\"" + reference().string() + "\"", to = "\"" + dir.string() + "\"";
    const auto at = yaml.find(from);
    EXPECT_NE(at, std::string::npos) << yaml;
    if (at != std::string::npos) yaml.replace(at, from.size(), to);
    write_text(dir / "config.yaml", yaml);
    return dir;
  }
};

}  // namespace

// RUN/checkpoints a symlink to another run's checkpoints: resuming trained there and rotation
// (keep=1) deleted that run's checkpoints. Now refused before anything is written, naming the way
// to put a run on another disk; a symlinked run directory itself trains.
TEST_F(RunSafety, SymlinkedCheckpointsAbandonedOrTensorboardAreRefusedAndTheirTargetsUntouched) {
  const fs::path victim = run_of_its_own("victim"), linked = run_of_its_own("linked-checkpoints");
  fs::remove_all(linked / "checkpoints");
  fs::create_directory_symlink(victim / "checkpoints", linked / "checkpoints");
  const auto victim_before = snapshot(victim), linked_before = snapshot(linked);
  const Result resumed = run(train(linked, "resume=true steps=16 schedule.rewarm=true checkpoint.keep=1"));
  EXPECT_EQ(resumed.exit_code, 2) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, (linked / "checkpoints").string() + " is a symlink")) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "symlink the run directory itself")) << resumed.output;
  EXPECT_EQ(snapshot(victim), victim_before);
  EXPECT_EQ(snapshot(linked), linked_before);

  // A new run whose checkpoints/ points at a directory of the user's: its leftovers-looking entries stay.
  const fs::path elsewhere = work_dir() / "elsewhere", fresh = work_dir() / "fresh-linked";
  fs::create_directories(elsewhere / ".partial-step_00000002-1");
  write_text(elsewhere / "notes.txt", "mine");
  fs::create_directories(fresh);
  fs::create_directory_symlink(elsewhere, fresh / "checkpoints");
  const auto elsewhere_before = snapshot(elsewhere);
  const Result started = run(train(fresh));
  EXPECT_EQ(started.exit_code, 2) << started.output;
  EXPECT_EQ(snapshot(elsewhere), elsewhere_before);

  // RUN/abandoned a symlink: going back to step 4 would move steps 8 and 12 out of the run.
  const fs::path aside = work_dir() / "aside", going_back = run_of_its_own("linked-abandoned");
  fs::create_directories(aside);
  fs::create_directory_symlink(aside, going_back / "abandoned");
  const auto going_back_before = snapshot(going_back);
  const Result back = run(train(going_back) + " --checkpoint step_00000004");
  EXPECT_EQ(back.exit_code, 2) << back.output;
  EXPECT_TRUE(contains(back.output, (going_back / "abandoned").string() + " is a symlink")) << back.output;
  EXPECT_TRUE(fs::is_empty(aside));
  EXPECT_EQ(snapshot(going_back), going_back_before);

  // RUN/tensorboard a symlink, with log.tensorboard=true.
  const fs::path events = work_dir() / "events", logged = run_of_its_own("linked-tensorboard");
  fs::create_directories(events);
  fs::create_directory_symlink(events, logged / "tensorboard");
  const Result tb = run(train(logged, "resume=true steps=13 schedule.rewarm=true log.tensorboard=true"));
  EXPECT_EQ(tb.exit_code, 2) << tb.output;
  EXPECT_TRUE(fs::is_empty(events));

  // A file of the run a symlink: the file it names is never written through it nor replaced.
  const fs::path outside = work_dir() / "outside-metrics.jsonl", linked_file = run_of_its_own("linked-metrics");
  fs::copy_file(linked_file / "metrics.jsonl", outside);
  fs::remove(linked_file / "metrics.jsonl");
  fs::create_symlink(outside, linked_file / "metrics.jsonl");
  const auto outside_before = file_bytes(outside);
  const Result metrics = run(train(linked_file, "resume=true steps=13 schedule.rewarm=true"));
  EXPECT_EQ(metrics.exit_code, 2) << metrics.output;
  EXPECT_TRUE(contains(metrics.output, (linked_file / "metrics.jsonl").string() + " is a symlink")) << metrics.output;
  EXPECT_EQ(file_bytes(outside), outside_before);
  EXPECT_TRUE(fs::is_symlink(linked_file / "metrics.jsonl"));

  // What the message advises: the run directory itself a symlink, locked and followed.
  const fs::path moved = run_of_its_own("moved-to-another-disk"), link = work_dir() / "run-link";
  fs::create_directory_symlink(moved, link);
  const Result through_link = run(train(link, "resume=true steps=13 schedule.rewarm=true"));
  ASSERT_EQ(through_link.exit_code, 0) << through_link.output;
  EXPECT_TRUE(fs::exists(moved / "checkpoints" / "step_00000013" / "state.json"));
  EXPECT_TRUE(fs::is_symlink(link));
}

// The stray-temporary cleanup removed every *.tmp.<digits> in run.dir, a user's files included.
// Now only temporaries of the files nibble writes there, and only of processes that are gone; and
// a new run is refused in a directory of the user's (which it would have filled and cleaned).
TEST_F(RunSafety, StrayCleanupRemovesOnlyNibblesTemporariesOfProcessesThatAreGone) {
  const fs::path dir = run_of_its_own("stray");
  const std::string dead = std::to_string(kDeadPid), alive = std::to_string(::getpid());
  for (const std::string& name : std::vector<std::string>{"notes.txt.tmp.12345", "results.tmp." + dead, "config.yaml.tmp." + dead,
                                 "metrics.jsonl.tmp." + dead, "tokenizer.json.tmp." + dead,
                                 "metrics.jsonl.tmp." + alive, "config.yaml.tmp.x" + dead})
    write_text(dir / name, "some bytes");
  const Result r = run(train(dir, "resume=true steps=13 schedule.rewarm=true"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(dir / ("config.yaml.tmp." + dead)));  // nibble's, its writer gone
  EXPECT_FALSE(fs::exists(dir / ("metrics.jsonl.tmp." + dead)));
  EXPECT_FALSE(fs::exists(dir / ("tokenizer.json.tmp." + dead)));
  EXPECT_TRUE(fs::exists(dir / "notes.txt.tmp.12345"));  // the user's
  EXPECT_TRUE(fs::exists(dir / ("results.tmp." + dead)));
  EXPECT_TRUE(fs::exists(dir / ("config.yaml.tmp.x" + dead)));
  EXPECT_TRUE(fs::exists(dir / ("metrics.jsonl.tmp." + alive)));  // its writer (this test) is alive

  const fs::path mine = work_dir() / "mine";
  fs::create_directories(mine);
  write_text(mine / "photo.jpg.tmp.123", "a user's download in progress");
  write_text(mine / "config.yaml", "a user's own config");
  const auto before = snapshot(mine);
  const Result into_mine = run(train(mine));
  EXPECT_EQ(into_mine.exit_code, 2) << into_mine.output;
  EXPECT_TRUE(contains(into_mine.output, "is an existing directory that is not a run directory")) << into_mine.output;
  EXPECT_EQ(snapshot(mine), before);
}

// run.dir set to a prepared data directory replaced its files; inside a data or another run
// directory a run would be taken for a part of it. A new or empty directory, or what a run killed
// before its first step left, still starts a run.
TEST_F(RunSafety, RunDirInADataOrAnotherRunOrAUsersDirectoryIsRefused) {
  const fs::path nested = run_of_its_own("holds-nested");
  const auto data_before = snapshot(data()), nested_before = snapshot(nested);
  const std::vector<std::pair<fs::path, std::string>> cases = {
      {data(), "is a data directory"},
      {data() / "run", "lies inside the data directory"},
      {nested / "checkpoints" / "run", "lies inside the run directory"},
      {nested / "sub", "lies inside the run directory"},
  };
  for (const auto& [dir, expected] : cases) {
    const Result r = run(train(dir, "steps=4"));
    EXPECT_EQ(r.exit_code, 2) << dir << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, expected)) << dir << "\n" << r.output;
  }
  EXPECT_EQ(snapshot(data()), data_before);
  EXPECT_EQ(snapshot(nested), nested_before);

  const fs::path empty = work_dir() / "empty-run-dir", killed = work_dir() / "killed-at-start";
  fs::create_directories(empty);
  fs::create_directories(killed);
  fs::copy_file(reference() / "config.yaml", killed / "config.yaml");
  fs::copy_file(reference() / "nibble_tokenizer.json", killed / "nibble_tokenizer.json");
  for (const fs::path& dir : {empty, killed}) {
    const Result r = run(train(dir, "steps=4"));
    EXPECT_EQ(r.exit_code, 0) << dir << "\n" << r.output;
    EXPECT_TRUE(fs::exists(dir / "checkpoints" / "step_00000004" / "state.json")) << dir;
  }
}

// The newest checkpoint damaged, then keep=1: rotation counted it as the one kept and deleted every
// good checkpoint, the ones just written included. A fake newest checkpoint did the same.
TEST_F(RunSafety, RotationKeepsTheCheckpointsThatVerifyWhateverIsNewer) {
  const fs::path dir = run_of_its_own("damaged-newest");
  flip_bytes(dir / "checkpoints" / "step_00000012" / "model.safetensors", 2000);
  const Result first = run(train(dir, "resume=true steps=11 schedule.rewarm=true checkpoint.interval=1 checkpoint.keep=1"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_TRUE(contains(first.output, "falling back to " + (dir / "checkpoints" / "step_00000008").string()));
  EXPECT_EQ(checkpoint_names(dir), (std::vector<std::string>{"step_00000011", "step_00000012"}));
  const Result eval = run("eval " + dir.string() + " --checkpoint step_00000011 --max-windows 1");
  EXPECT_EQ(eval.exit_code, 0) << eval.output;
  const Result second = run(train(dir, "resume=true steps=16 schedule.rewarm=true checkpoint.keep=1"));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_TRUE(contains(second.output, "falling back to " + (dir / "checkpoints" / "step_00000011").string()));
  EXPECT_EQ(checkpoint_names(dir), std::vector<std::string>{"step_00000016"});  // the damaged one replaced, then rotated
  EXPECT_EQ(run("eval " + dir.string() + " --max-windows 1").exit_code, 0);

  const fs::path faked = run_of_its_own("fake-newest");
  fs::create_directories(faked / "checkpoints" / "step_99999999");
  write_text(faked / "checkpoints" / "step_99999999" / "state.json", "{\"step\": 99999999}");
  const Result resumed = run(train(faked, "resume=true steps=16 schedule.rewarm=true checkpoint.keep=1"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(checkpoint_names(faked), (std::vector<std::string>{"step_00000016", "step_99999999"}));
  EXPECT_EQ(run("eval " + faked.string() + " --checkpoint step_00000016 --max-windows 1").exit_code, 0);
  const Result again = run(train(faked, "resume=true steps=20 schedule.rewarm=true checkpoint.keep=1"));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_TRUE(fs::exists(faked / "checkpoints" / "step_00000020" / "state.json"));
}

// `cp -a runs/a runs/b; nibble train runs/b/config.yaml resume=true` trained in runs/a (the saved
// run.dir) and rotated its checkpoints away. The copy now continues in the copy, saying so; a
// run.dir= on the command line still chooses the directory.
TEST_F(RunSafety, ACopiedRunResumedThroughItsConfigContinuesInTheCopy) {
  const fs::path original = run_of_its_own("original"), copy = work_dir() / "copy";
  fs::remove_all(copy);
  fs::copy(original, copy, fs::copy_options::recursive);
  const auto original_before = snapshot(original);
  const Result r = run("train " + (copy / "config.yaml").string() + " resume=true steps=16 schedule.rewarm=true checkpoint.keep=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "continuing in " + copy.string())) << r.output;
  EXPECT_TRUE(contains(r.output, "resuming from " + (copy / "checkpoints" / "step_00000012").string())) << r.output;
  EXPECT_EQ(snapshot(original), original_before);
  EXPECT_EQ(checkpoint_names(copy), std::vector<std::string>{"step_00000016"});
  const auto saved = file_bytes(copy / "config.yaml");
  EXPECT_TRUE(contains(std::string(saved.begin(), saved.end()), "\"" + copy.string() + "\"")) << "run.dir of the copy";

  // Through its own config a run needs no note; run.dir= on the command line is followed.
  const Result own = run("train " + (copy / "config.yaml").string() + " resume=true steps=17 schedule.rewarm=true");
  ASSERT_EQ(own.exit_code, 0) << own.output;
  EXPECT_FALSE(contains(own.output, "note: " + (copy / "config.yaml").string())) << own.output;
  const fs::path other = work_dir() / "from-a-runs-config";
  const Result elsewhere = run("train " + (copy / "config.yaml").string() + " run.dir=" + other.string() + " steps=4");
  ASSERT_EQ(elsewhere.exit_code, 0) << elsewhere.output;
  EXPECT_TRUE(contains(elsewhere.output, "training in run.dir=" + other.string())) << elsewhere.output;
  EXPECT_TRUE(fs::exists(other / "checkpoints" / "step_00000004" / "state.json"));
  EXPECT_EQ(checkpoint_names(copy), std::vector<std::string>{"step_00000017"});
}

namespace {

// `nibble ARGS` started in the background, its output into `log`; killed (SIGKILL) and reaped when
// this goes out of scope.
class Background {
 public:
  Background(const std::string& args, const fs::path& log) {
    const std::string command = std::string(NIBBLE_BINARY_DIR) + "/nibble " + args + " > " + log.string() + " 2>&1";
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execl("/bin/sh", "sh", "-c", ("exec " + command).c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~Background() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  bool running() const {
    int status = 0;
    return pid_ > 0 && ::waitpid(pid_, &status, WNOHANG) == 0;
  }

 private:
  pid_t pid_ = -1;
};

std::string text_of(const fs::path& file) {
  const auto bytes = file_bytes(file);
  return {bytes.begin(), bytes.end()};
}

int64_t newest_step(const fs::path& run_dir) {
  int64_t newest = -1;
  for (const std::string& name : checkpoint_names(run_dir))
    if (name.starts_with("step_")) newest = std::max<int64_t>(newest, std::stoll(name.substr(5)));
  return newest;
}

}  // namespace

// eval, generate and export while training writes and rotates a checkpoint every step: 9-10 of 12
// failed ("is not a directory", "cannot open .../config.json"). Now each reads a whole checkpoint.
TEST_F(RunSafety, ReadersDuringRotationAlwaysReadACompleteCheckpoint) {
  const fs::path dir = run_of_its_own("rotating"), log = work_dir() / "rotating.log";
  Background trainer(train(dir, "resume=true steps=100000000 schedule.rewarm=true checkpoint.interval=1 checkpoint.keep=1 "
                                "eval.interval=100000000"),
                     log);
  for (int i = 0; i < 3000 && !contains(text_of(log), "checkpoint " + (dir / "checkpoints" / "step_00000020").string());
       ++i)
    ::usleep(10000);
  ASSERT_TRUE(contains(text_of(log), "checkpoint " + (dir / "checkpoints" / "step_00000020").string())) << text_of(log);
  const int64_t before = newest_step(dir);
  std::vector<std::string> failures;
  auto expect_success = [&](const std::string& args) {
    const Result r = run(args);
    if (r.exit_code != 0) failures.push_back(args + "\n" + r.output);
  };
  for (int i = 0; i < 40; ++i) expect_success("eval " + dir.string() + " --max-windows 1");
  for (int i = 0; i < 8; ++i) expect_success("generate " + dir.string() + " --max-tokens 3");
  for (int i = 0; i < 3; ++i)
    expect_success("export " + dir.string() + " --format hf -o " + (work_dir() / ("export-" + std::to_string(i))).string());
  EXPECT_TRUE(trainer.running()) << text_of(log);  // the readers overlapped the rotation throughout
  EXPECT_GT(newest_step(dir), before);
  EXPECT_TRUE(failures.empty()) << failures.size() << " readers failed; the first:\n" << failures.front();
}

// The start-up memory estimate was printed and ignored (258 GiB of activations at context 65536):
// the run then died in its first step. Refused before anything is written, naming the keys.
TEST_F(RunSafety, ARunBeyondTheMachinesMemoryIsRefusedNamingTheKeysToLower) {
  // About 1.3e5 GiB of activations for the tiny model: beyond any machine's MemTotal.
  const fs::path dir = work_dir() / "beyond-memory";
  const Result r = run(train(dir, "batch=1000000000"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "it would run out of memory")) << r.output;
  EXPECT_TRUE(contains(r.output, "batch=1000000000")) << r.output;
  EXPECT_TRUE(contains(r.output, "Lower batch")) << r.output;
  EXPECT_FALSE(fs::exists(dir));
  // A model whose weights alone cannot fit is refused before they are allocated (it used to page
  // for minutes first): the command returns at once, so this test finishes at all.
  const Result huge = run(train(dir, "model.layers=10000000"));
  EXPECT_EQ(huge.exit_code, 2) << huge.output;
  EXPECT_TRUE(contains(huge.output, "it would run out of memory")) << huge.output;
  EXPECT_FALSE(fs::exists(dir));
}

// --checkpoint naming a directory that is no checkpoint (`/etc`) says so; the advice for a damaged
// checkpoint (remove it) is for checkpoints only.
TEST_F(RunSafety, CheckpointOptionNamingANonCheckpointDirectoryIsNotCalledDamaged) {
  const fs::path elsewhere = work_dir() / "not-a-checkpoint";
  fs::create_directories(elsewhere);
  std::ofstream(elsewhere / "notes.txt") << "mine";
  for (const std::string command : {"eval", "generate"}) {
    const Result r = run(command + " " + reference().string() + " --checkpoint " + elsewhere.string() +
                         (command == "generate" ? " --prompt a --max-tokens 1" : ""));
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(contains(r.output, "is not a checkpoint directory")) << r.output;
    EXPECT_FALSE(contains(r.output, "remove")) << r.output;
  }
  EXPECT_TRUE(fs::exists(elsewhere / "notes.txt"));
}

namespace {

// Saves checkpoints of `steps` into `run_dir` with rotation keeping `keep`.
void save_steps(const fs::path& run_dir, const nibble::model::Transformer& model, std::vector<int64_t> steps, int64_t keep) {
  nibble::train::CheckpointOptions options;
  options.keep = keep;
  for (int64_t step : steps) {
    nibble::train::TrainingState s;
    s.step = step;
    nibble::train::save_checkpoint(run_dir, model, nullptr, s, options);
  }
}

}  // namespace

// Rotation counts only checkpoints whose files match their checksums: an older damaged one neither
// counts as kept nor is deleted before `keep` good ones are newer than it; one a reader holds stays
// until a save after the reader is done.
TEST(Rotation, CountsOnlyVerifyingCheckpointsAndSkipsOnesBeingRead) {
  const fs::path run_dir = nibble_test::fresh_dir("test_run_safety", "rotation");
  nibble::model::Transformer model(nibble_test::tiny_model({.vocab = 16, .layers = 1, .width = 32, .context = 16}),
                                   nibble::ops::cpu());
  save_steps(run_dir, model, {10, 20, 30}, 5);
  flip_bytes(nibble::train::checkpoint_path(run_dir, 30) / "model.safetensors", 100);
  save_steps(run_dir, model, {40}, 2);
  EXPECT_EQ(checkpoint_names(run_dir), (std::vector<std::string>{"step_00000020", "step_00000030", "step_00000040"}));

  {
    const auto reading = nibble::io::CheckpointLock::for_reading(nibble::train::checkpoint_path(run_dir, 40));
    ASSERT_TRUE(reading);
    save_steps(run_dir, model, {50}, 1);
    EXPECT_EQ(checkpoint_names(run_dir), (std::vector<std::string>{"step_00000040", "step_00000050"}));
  }
  save_steps(run_dir, model, {60}, 1);
  EXPECT_EQ(checkpoint_names(run_dir), std::vector<std::string>{"step_00000060"});
  // A lock on a checkpoint that was removed meanwhile says so: the reader lists again.
  EXPECT_FALSE(nibble::io::CheckpointLock::for_reading(nibble::train::checkpoint_path(run_dir, 50)));
}
