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

}  // namespace nibble::cli
