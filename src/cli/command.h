// The nibble command is a set of subcommands, each in its own cmd_*.cpp, registered at start-up
// through a static CommandRegistration so that main.cpp needs no list of them. Commands are thin:
// they parse options, call the library, and report UsageError as a clear message with exit code 2.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace nibble::cli {

struct Command {
  std::string name;
  // Adds the subcommand (and its options) to `app`; the callback returns the process exit code
  // through `exit_code`.
  std::function<void(CLI::App& app, int& exit_code)> add;
};

std::vector<Command>& command_registry();

struct CommandRegistration {
  CommandRegistration(std::string name, std::function<void(CLI::App&, int&)> add) {
    command_registry().push_back({std::move(name), std::move(add)});
  }
};

// Subcommand groups such as `nibble bench <what>`: returns the group `name` of `app`, creating it
// (with `description`, requiring one of its own subcommands) if no other cmd_*.cpp has yet, so
// that each file can add its member (`bench gemm`, `bench quantize`, ...) independently.
inline CLI::App* subcommand_group(CLI::App& app, const std::string& name, const std::string& description) {
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    if (sub->get_name() == name) return sub;
  CLI::App* group = app.add_subcommand(name, description);
  group->require_subcommand(1);
  return group;
}

}  // namespace nibble::cli
