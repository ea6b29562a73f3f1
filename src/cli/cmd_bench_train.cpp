// `nibble bench train`: the same model trained under each precision recipe, side by side in one
// run. Default: speed (tokens/s, step time, share of GEMMs / quantization / the rest, MFU against
// the peaks measured here). --quality: trains nanoGPT's CPU configuration on tinyshakespeare for
// each recipe and prints the validation losses. The benchmark, its model and its options are
// src/bench/'s (one table, which nibble_bench_train reads too); this is its CLI11 front end.
#include <memory>
#include <variant>

#include "bench/train_bench_report.h"
#include "cli/command.h"

namespace nibble::cli {

namespace {

// One option of bench::train_bench_options() on the subcommand, bound to its field of `o`.
void add_option(CLI::App& cmd, const bench::OptionSpec& spec, bench::TrainBenchOptions& o) {
  if (const auto flag = std::get_if<bool bench::TrainBenchOptions::*>(&spec.target)) {
    cmd.add_flag(spec.flag, o.**flag, spec.help);
    return;
  }
  CLI::Option* option = std::visit(
      [&](auto member) -> CLI::Option* {
        if constexpr (std::is_same_v<decltype(member), bool bench::TrainBenchOptions::*>) return nullptr;
        else return cmd.add_option(spec.flag, o.*member, spec.help);
      },
      spec.target);
  if (spec.show_default) option->capture_default_str();
  if (!spec.meaning.empty()) option->check(integer_at_least(spec.min, spec.meaning));
  if (!spec.choices.empty()) option->check(CLI::IsMember(spec.choices));
}

const CommandRegistration registration{"bench train", [](CLI::App& app, int& exit_code) {
  CLI::App* bench = subcommand_group(app, "bench", "Measure nibble's kernels against libraries");
  CLI::App* cmd = bench->add_subcommand("train", "Training tokens/s (or --quality: val loss) of one model under each recipe");
  auto o = std::make_shared<bench::TrainBenchOptions>();
  for (const auto& spec : bench::train_bench_options())
    if (spec.in_nibble) add_option(*cmd, spec, *o);
  cmd->callback([o, &exit_code] {
    device_from_flag(o->device);  // no usable GPU: refused naming --device, before anything runs
    exit_code = bench::run_train_bench(*o);
  });
}};

}  // namespace

}  // namespace nibble::cli
