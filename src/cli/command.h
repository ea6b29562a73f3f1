// The nibble command is a set of subcommands, each in its own cmd_*.cpp, registered at start-up
// through a static CommandRegistration so that main.cpp needs no list of them. Commands are thin:
// they parse options, call the library, and report UsageError as a clear message with exit code 2.
#pragma once
#include <CLI/CLI.hpp>
#include <charconv>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "ops/backend.h"

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

// The check of a --checkpoint option: an empty value (`--checkpoint ""`, typically an unset shell
// variable) would otherwise read as "not given" and pick the newest checkpoint silently.
inline CLI::Validator checkpoint_name() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        return value.empty() ? "is empty: give a checkpoint of the run, by name (step_00000100) or by path" : "";
      },
      "CHECKPOINT");
}

// An integer option's check: CLI11 reports "--NAME: MESSAGE" with exit code 2. Needed because an
// unsigned option silently wraps -1 to 18446744073709551615, and a count of 0 or less is nonsense.
inline CLI::Validator integer_at_least(long long minimum, const std::string& meaning) {
  return CLI::Validator(
      [minimum, meaning](std::string& text) -> std::string {
        long long v = 0;
        const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), v);
        // Above long long (a uint64 seed): CLI11 itself then checks the option's own range.
        if (error == std::errc::result_out_of_range && !text.empty() && text[0] != '-') return "";
        if (error != std::errc() || end != text.data() + text.size()) return "'" + text + "' is not an integer";
        if (v < minimum) return text + " is below " + std::to_string(minimum) + ": give " + meaning;
        return "";
      },
      "INT>=" + std::to_string(minimum));
}

// CLI11 reads an empty value of a number option (`--max-tokens ""`, typically an unset shell
// variable) as 0. run_cli gives every number option of every command this check once all are added.
inline void refuse_empty_numbers(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    const std::string type = option->get_type_name();
    if (type.starts_with("INT") || type.starts_with("UINT") || type.starts_with("FLOAT"))
      option->check(CLI::Validator(
          [](std::string& value) { return value.empty() ? std::string("is empty: give a number") : std::string(); }, ""));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) refuse_empty_numbers(*sub);
}

// The device of a command's --device flag, once its backend can run here. The backend layer words
// its refusals as the run config's key (device=cuda, "use device=cpu"); they are reworded to name
// the flag the user typed (--device cuda, --device cpu).
inline ops::Device device_from_flag(const std::string& flag_value) {
  const ops::Device device = ops::parse_device(flag_value);
  try {
    ops::backend(device);
  } catch (const UsageError& e) {
    std::string message = e.what();
    for (const auto& [key, flag] : {std::pair{"device=cuda", "--device cuda"}, std::pair{"device=cpu", "--device cpu"}})
      for (size_t at = message.find(key); at != std::string::npos; at = message.find(key, at + 1))
        message.replace(at, std::string_view(key).size(), flag);
    throw UsageError(message);
  }
  return device;
}

// Whether `a` and `b` name one file (the same path spelled differently, or a hard or symbolic link):
// a command that wrote its output there would destroy its own input.
inline bool same_file(const std::filesystem::path& a, const std::filesystem::path& b) {
  std::error_code ec;
  if (std::filesystem::equivalent(a, b, ec)) return true;
  const auto ca = std::filesystem::weakly_canonical(a, ec);
  if (ec) return false;
  const auto cb = std::filesystem::weakly_canonical(b, ec);
  return !ec && ca == cb;
}

}  // namespace nibble::cli
