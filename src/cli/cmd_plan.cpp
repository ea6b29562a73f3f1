// `nibble plan CONFIG.yaml [key=value ...] --ranks N [--device-memory 141GB]`: the memory each rank
// of a training job would hold, per shard mode, and which modes fit, without training or
// allocating the model. All logic lives in run/memory_plan.h.
#include <fmt/format.h>

#include <filesystem>
#include <memory>

#include "cli/command.h"
#include "data/sources.h"
#include "run/config.h"
#include "run/memory_plan.h"

namespace nibble::cli {
namespace {

struct PlanOptions {
  std::string config;
  std::vector<std::string> overrides;
  int ranks = 1;
  std::string device_memory;
};

CommandRegistration plan_command("plan", [](CLI::App& app, int& exit_code) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Memory per rank of a training config for each distributed.shard mode, and which fit, without training");
  cmd->add_option("config", o->config, "YAML config, e.g. configs/gpt2-small.yaml")->required();
  cmd->add_option("overrides", o->overrides, "dotted key=value overrides, as for train");
  cmd->add_option("--ranks", o->ranks, "MPI ranks of the job (default 1)")->check(integer_at_least(1, "a rank count"));
  cmd->add_option("--device-memory", o->device_memory, "memory of one rank's device, e.g. 141GB or 80GiB");
  cmd->callback([o, &exit_code] {
    if (!std::filesystem::is_regular_file(o->config))
      throw UsageError(fmt::format("config file '{}' does not exist or is not a file: nibble plan CONFIG.yaml --ranks N",
                                   o->config));
    const int64_t device_memory = o->device_memory.empty() ? 0 : train::parse_memory_size(o->device_memory);
    train::RunConfig config = train::load_run_config(o->config, o->overrides);
    // The vocabulary is model.vocab, or the tokenizer's of the data (read, not trained on).
    if (config.vocab > 0) {
      config.train.model.vocab = config.vocab;
    } else {
      try {
        const auto sources = train::load_sources(config.data_sources());
        config.train.model.vocab = sources.front().data.vocab_size;
      } catch (const UsageError& e) {
        throw UsageError(fmt::format("{} (nibble plan reads the vocabulary size from the data; without the data, give "
                                     "it as model.vocab=N)",
                                     e.what()));
      }
    }
    config.validate();
    train::MemoryPlanInput in;
    in.train = config.train;
    in.ranks = o->ranks;
    // This program before training: the process term of every rank (nibble train measures its own,
    // after MPI_Init), with MPI's share where the job has several ranks.
    in.process_bytes = train::resident_bytes_now() + (o->ranks > 1 ? train::kMpiLibraryBytes : 0);
    fmt::print("{}", train::memory_plan_report(in, device_memory));
    exit_code = 0;
  });
});

}  // namespace
}  // namespace nibble::cli
