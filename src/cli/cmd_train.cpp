// `nibble train CONFIG.yaml [key=value ...] [--checkpoint STEP]`: trains per a YAML config with
// dotted overrides.
// All logic lives in train/run.h; this file only parses the command line.
#include <fmt/format.h>

#include <filesystem>
#include <memory>

#include "cli/app.h"
#include "cli/command.h"
#include "run/config.h"
#include "train/distributed.h"
#include "run/run.h"
#include "run/run_directory.h"

namespace nibble::cli {
namespace {

struct TrainOptions {
  std::string config;
  std::vector<std::string> overrides;
  std::string checkpoint;
  bool list_keys = false;
};

CommandRegistration train_command("train", [](CLI::App& app, int& exit_code) {
  auto o = std::make_shared<TrainOptions>();
  CLI::App* cmd = app.add_subcommand(
      "train", "Train a model from a YAML config; key=value words override it (e.g. quantization=nvfp4 steps=2000)");
  cmd->add_option("config", o->config, "YAML config, e.g. configs/shakespeare.yaml");
  cmd->add_option("overrides", o->overrides, "dotted key=value overrides, e.g. model.layers=6 resume=true");
  cmd->add_flag("--keys", o->list_keys, "list every config key with its type and meaning, then exit");
  cmd->add_option("--checkpoint", o->checkpoint,
                  "resume from this checkpoint of run.dir instead of the newest (its name, e.g. step_00000100, or "
                  "its path; implies resume=true); the run's newer checkpoints are moved to RUN/abandoned")
      ->check(checkpoint_name());
  cmd->callback([o, &exit_code] {
    if (o->list_keys) {
      for (const auto& k : train::config_keys()) {
        const char* type = k.kind == train::ConfigValueKind::integer ? "integer"
                           : k.kind == train::ConfigValueKind::real  ? "number"
                           : k.kind == train::ConfigValueKind::boolean ? "true|false"
                                                                       : "text";
        fmt::print("{:<28} {:<10} {}\n", k.name, type, k.help);
      }
      exit_code = 0;
      return;
    }
    if (o->config.empty()) throw UsageError("train needs a config file: nibble train configs/shakespeare.yaml [key=value ...]");
    // A first word with '=' is an override given without a config file.
    if (o->config.find('=') != std::string::npos && !o->config.ends_with(".yaml") && !o->config.ends_with(".yml"))
      throw UsageError(fmt::format("'{}' looks like an override, not a config file: nibble train CONFIG.yaml {}",
                                   o->config, o->config));
    if (std::filesystem::is_directory(o->config))
      throw UsageError(fmt::format("'{}' is a directory, not a config file: nibble train CONFIG.yaml [key=value ...] "
                                   "(e.g. configs/shakespeare.yaml); to continue a run: nibble train {}/config.yaml "
                                   "resume=true",
                                   o->config, o->config));
    if (!std::filesystem::exists(o->config))
      throw UsageError(fmt::format("config file '{}' does not exist: check the path (configs/ holds examples, e.g. "
                                   "configs/shakespeare.yaml)",
                                   o->config));
    // Under mpirun this process is one rank of a data-parallel job (train/distributed.h).
    std::unique_ptr<train::Communicator> comm = train::connect_processes();
    try {
      train::RunConfig config = train::load_run_config(o->config, o->overrides);
      const std::string note = train::settle_run_dir(config, o->config, o->overrides);
      if (comm->rank() == 0) fmt::print("{}", note);
      if (!o->checkpoint.empty()) {
        // A resume=false in the config file is what a saved RUN/config.yaml says; on the command
        // line it contradicts --checkpoint.
        for (const std::string& word : o->overrides) {
          if (!word.starts_with("resume=")) continue;
          train::RunConfig said;
          train::set_config_value(said, "resume", std::string_view(word).substr(7), "command line");
          if (!said.resume)
            throw UsageError(fmt::format("--checkpoint {} resumes the run from that checkpoint, but the command line "
                                         "also says {}: drop {} (or drop --checkpoint to start a new run)",
                                         o->checkpoint, word, word));
        }
        config.resume_checkpoint = o->checkpoint;
        config.resume = true;
      }
      exit_code = train::run_training(config, stdout, *comm, injected_faults());
    } catch (const std::exception& e) {
      // One rank alone may fail (a missing data directory on one host): end every rank rather than
      // leave the others waiting in a collective. One process reports as every command does.
      if (comm->size() > 1) comm->abort(e.what(), dynamic_cast<const UsageError*>(&e) ? 2 : 1);
      throw;
    }
  });
});

}  // namespace
}  // namespace nibble::cli
