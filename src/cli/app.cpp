#include <cstdio>
#include <exception>
#include <new>
#include <string>

#include "cli/command.h"
#include "cli/app.h"
#include "common/error.h"

namespace nibble::cli {

namespace {
const train::FaultPlan* current_faults = nullptr;
}  // namespace

std::vector<Command>& command_registry() {
  static std::vector<Command> commands;
  return commands;
}

const train::FaultPlan& injected_faults() {
  static const train::FaultPlan none;
  return current_faults ? *current_faults : none;
}

int run_cli(int argc, char** argv, const train::FaultPlan& faults) {
  current_faults = &faults;
  CLI::App app{"nibble: pretrain language models in NVFP4 (and compare with BF16, FP8, MXFP4)", "nibble"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "nibble 0.1.0");
  int exit_code = 0;
  for (auto& c : nibble::cli::command_registry()) c.add(app, exit_code);
  refuse_empty_numbers(app);
  // CLI11 reports an unknown first word only as "a subcommand is required": name it instead.
  if (argc > 1 && argv[1][0] != '-') {
    std::string word = argv[1], known;
    bool found = false;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
      found |= sub->get_name() == word;
      known += (known.empty() ? "" : ", ") + sub->get_name();
    }
    if (!found) {
      std::fprintf(stderr, "nibble: error: unknown command '%s': the commands are %s (see nibble --help)\n",
                   word.c_str(), known.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const nibble::UsageError& e) {
    std::fprintf(stderr, "nibble: error: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "nibble: error: out of memory: this request needs more memory than the process may use (RAM or "
                 "ulimit -v); lower batch, model.context, the model's width or layers (train), or the sizes asked "
                 "for\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nibble: error: %s\n", e.what());
    return 1;
  }
  return exit_code;
}

}  // namespace nibble::cli
