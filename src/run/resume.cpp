#include "run/resume.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "data/data.h"

namespace nibble::train {

namespace fs = std::filesystem;

namespace {

// Keys whose change makes a resumed run differ from the run it continues.
bool changes_the_math(const std::string& key) {
  // distributed.shard: a checkpoint is one whole state whichever mode wrote it, and every mode adds
  // in the same order (train/distributed.h).
  static const std::set<std::string> harmless = {"resume",           "threads",      "eval.interval",
                                                 "checkpoint.interval", "checkpoint.keep", "log.interval",
                                                 "run.dir",          "data.dir",     "distributed.shard",
                                                 "distributed.fp4_param_gather"};
  return !harmless.contains(key);
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

// The checkpoint --checkpoint names, or nothing: falling back to another would continue a run
// nobody chose.
ResumePoint load_chosen(const RunConfig& config, const std::vector<fs::path>& all, Trainer& trainer,
                        const std::string& tokenizer_identity) {
  const fs::path chosen = requested_checkpoint(config.run_dir, config.resume_checkpoint, all);
  ResumePoint point;
  point.checkpoint = chosen;
  try {
    point.state = load_checkpoint_state(chosen, trainer.model(), &point.optimizer, tokenizer_identity);
  } catch (const DamagedCheckpoint& e) {
    throw UsageError(fmt::format("--checkpoint '{}' does not verify: {}\nchoose another of the run's checkpoints "
                                 "({}), or leave out --checkpoint to resume from the newest that verifies",
                                 config.resume_checkpoint, e.what(), checkpoint_names(all)));
  }
  // Going back to a checkpoint at or past the last step trains nothing, yet would set the newer
  // checkpoints aside: refused before anything moves.
  const auto newer = std::count_if(all.begin(), all.end(), [&](const fs::path& c) { return c > chosen; });
  if (point.state.step >= config.train.schedule.total_steps && newer > 0)
    throw UsageError(fmt::format("--checkpoint '{}' is at step {}, and steps={} ends the run there: nothing would be "
                                 "trained, yet its {} newer checkpoint(s) would be set aside. Pass a larger steps= "
                                 "to continue from it",
                                 config.resume_checkpoint, point.state.step, config.train.schedule.total_steps, newer));
  const fs::path aside = abandoned_dir(config.run_dir);
  std::error_code ec;
  if (newer > 0 && fs::exists(aside, ec) && !fs::is_directory(aside, ec))
    throw UsageError(fmt::format("--checkpoint '{}': the {} newer checkpoint(s) are set aside in {}, which is not a "
                                 "directory: move that file out of the way and run again",
                                 config.resume_checkpoint, newer, aside.string()));
  return point;
}

// Newest first; a damaged checkpoint (flipped bytes, NaN weights) is named and passed over for the
// newest one that verifies. A shape or tokenizer mismatch is not: every checkpoint shares it.
ResumePoint load_newest_verifying(const fs::path& run_dir, const std::vector<fs::path>& all, Trainer& trainer,
                                  const std::string& tokenizer_identity, const Console& console) {
  std::vector<std::string> damaged;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      ResumePoint point;
      point.state = load_checkpoint_state(*it, trainer.model(), &point.optimizer, tokenizer_identity);
      point.checkpoint = *it;
      point.newer_damaged = damaged.size();
      return point;
    } catch (const DamagedCheckpoint& e) {
      damaged.push_back(e.what());
      console.print(fmt::format("warning: not resuming from {}: {}\n", it->string(), e.what()));
    }
  }
  throw UsageError(fmt::format("no checkpoint in '{}' verifies ({} damaged, named above): the run cannot be "
                               "continued; start a new run.dir",
                               run_dir.string(), damaged.size()));
}

}  // namespace

ResumePoint load_resume_point(const RunConfig& config, Trainer& trainer, const std::string& tokenizer_identity,
                              const Console& console) {
  const auto all = list_checkpoints(config.run_dir);
  ResumePoint point = config.resume_checkpoint.empty()
                          ? load_newest_verifying(config.run_dir, all, trainer, tokenizer_identity, console)
                          : load_chosen(config, all, trainer, tokenizer_identity);
  if (point.state.micro_batches != point.state.step * config.train.grad_accum)
    throw UsageError(fmt::format("{}: the checkpoint drew {} micro-batches in {} steps, which grad_accum={} cannot "
                                 "continue: resume with the run's grad_accum",
                                 point.checkpoint.string(), point.state.micro_batches, point.state.step,
                                 config.train.grad_accum));
  if (point.newer_damaged > 0)
    console.print(fmt::format("warning: falling back to {} (step {}), the newest checkpoint that verifies; the {} newer "
                              "damaged one(s) will be replaced as training passes their steps\n",
                              point.checkpoint.string(), point.state.step, point.newer_damaged));
  if (point.state.seed != config.train.seed)
    console.print(fmt::format("note: the checkpoint was trained with seed={}, this config has seed={}: data order and "
                              "rounding continue with the new seed\n",
                              point.state.seed, config.train.seed));
  point.state.seed = config.train.seed;
  return point;
}

namespace {

// A continuation of the schedule without a jump: the newest checkpoint at or before `step` at which
// the new schedule's rate is not above the one the run trained at there (for a WSD run, one from
// its stable phase: the stable phase extends and the decay moves to the new end). 0 when none.
int64_t newest_step_without_rewarm(const RunConfig& before, const RunConfig& config, int64_t step) {
  int64_t best = 0;
  for (const fs::path& c : list_checkpoints(config.run_dir)) {
    const int64_t s = checkpoint_step(c.filename().string());
    if (s > 0 && s < step && s > best &&
        !(learning_rate(config.train.schedule, s) > learning_rate(before.train.schedule, s) * 1.0001f))
      best = s;
  }
  return best;
}

// The re-warm of a changed schedule (resume.h): refused unless schedule.rewarm=true, so that no
// run re-warms silently; with it, a warning naming both rates.
void refuse_rewarm(const RunConfig& before, const RunConfig& config, int64_t step, const Console& console) {
  const ScheduleConfig &was = before.train.schedule, &now = config.train.schedule;
  const float lr_was = learning_rate(was, step), lr_now = learning_rate(now, step);
  if (!(lr_now > lr_was * 1.0001f)) return;
  const std::string jump = fmt::format(
      "resuming at step {} with this schedule raises the learning rate from {:.3g} (the run's {} schedule over "
      "steps={}) to {:.3g} ({} over steps={})",
      step, lr_was, schedule_name(was.kind), was.total_steps, lr_now, schedule_name(now.kind), now.total_steps);
  if (config.schedule_rewarm) {
    console.print("warning: " + jump + ": the run re-warms (schedule.rewarm=true), and its loss may rise before it falls\n");
    return;
  }
  const int64_t calm = newest_step_without_rewarm(before, config, step);
  throw UsageError(fmt::format(
      "{}: the run would re-warm. Choose: keep steps={} and the run's schedule.*; hold the rate it has with "
      "schedule.kind=constant schedule.lr={:.3g}; {}or accept the re-warm with schedule.rewarm=true",
      jump, was.total_steps, lr_was,
      calm > 0 ? fmt::format("continue from --checkpoint step_{:08d}, where the new schedule takes over without a jump "
                             "(a WSD run's stable phase: it extends, and the decay moves to the new end); ",
                             calm)
               : std::string()));
}

}  // namespace

void note_config_changes(const RunConfig& config, const fs::path& saved_config, int64_t step, const Console& console) {
  if (!fs::exists(saved_config)) return;
  RunConfig before;
  apply_config_yaml(before, read_text_file(saved_config.string()), saved_config.string());
  refuse_rewarm(before, config, step, console);
  const auto old_values = config_values(before), new_values = config_values(config);
  if (before.train.device != config.train.device)  // (device=cpu is not written to config.yaml)
    console.print(fmt::format("note: resuming on device={} (the run was started on {}): the checkpoint carries over, "
                              "but the GEMMs sum in another order, so the continuation differs from an uninterrupted "
                              "run\n",
                              ops::to_string(config.train.device), ops::to_string(before.train.device)));
  for (const auto& [key, value] : new_values) {
    const std::string& name = key;  // C++20 lambdas cannot capture structured bindings in clang 14
    auto it = std::find_if(old_values.begin(), old_values.end(), [&](const auto& kv) { return kv.first == name; });
    const std::string old_value = it == old_values.end() ? "(unset)" : it->second;
    if (old_value != value && changes_the_math(key))
      console.print(fmt::format("note: resuming with {}={} (the run was started with {}): the continuation differs "
                                "from an uninterrupted run\n",
                                key, value, old_value));
  }
}

}  // namespace nibble::train
