// The nibble command with faults injected into `nibble train` (src/run/faults.h), for the tests of
// what a run does when a rank crashes, a step fails, the loss spikes or the process dies while
// writing a checkpoint:
//   nibble_with_faults [--fault NAME=VALUE]... COMMAND [ARGS...]
// with NAME=VALUE one of
//   rank_exits=RANK:STEP        that rank exits (status 17) before that step
//   rank_step_fails=RANK:STEP   that rank's step fails as on non-finite activations
//   loss_spike_from=STEP        the loss the driver sees is 10 higher from that step on
//   loss_nan_at=STEP            the loss the driver sees at that step is NaN
//   kill_during_checkpoint=STEP SIGKILL mid-way through writing that step's checkpoint (any: every step)
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli/app.h"
#include "common/wait_policy.h"

namespace {

using nibble::train::FaultPlan;

bool parse_rank_step(const std::string& text, FaultPlan::RankStep& out) {
  long rank = 0, step = 0;
  if (std::sscanf(text.c_str(), "%ld:%ld", &rank, &step) != 2) return false;
  out = {static_cast<int>(rank), static_cast<int64_t>(step)};
  return true;
}

bool parse_fault(const std::string& word, FaultPlan& plan) {
  const auto eq = word.find('=');
  if (eq == std::string::npos) return false;
  const std::string name = word.substr(0, eq), value = word.substr(eq + 1);
  if (name == "rank_exits") return parse_rank_step(value, plan.rank_exits);
  if (name == "rank_step_fails") return parse_rank_step(value, plan.rank_step_fails);
  if (name == "loss_spike_from") return (plan.loss_spike_from = std::atoll(value.c_str())) > 0;
  if (name == "loss_nan_at") return (plan.loss_nan_at = std::atoll(value.c_str())) > 0;
  if (name == "kill_during_checkpoint") {
    plan.kill_during_checkpoint = value == "any" ? FaultPlan::kAnyStep : std::atoll(value.c_str());
    return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  nibble::apply_default_wait_policy(argv);  // may start the program again
  FaultPlan plan;
  std::vector<char*> args{argv[0]};
  int i = 1;
  for (; i + 1 < argc && std::string(argv[i]) == "--fault"; i += 2) {
    if (!parse_fault(argv[i + 1], plan)) {
      std::fprintf(stderr, "nibble_with_faults: unknown or malformed fault '%s' (see the header of %s)\n", argv[i + 1],
                   __FILE__);
      return 2;
    }
  }
  for (; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  return nibble::cli::run_cli(static_cast<int>(args.size()) - 1, args.data(), plan);
}
