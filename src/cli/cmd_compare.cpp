// `nibble compare RUN...`: a table of the runs' losses, speed and time, and a loss-curve PNG.
#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "common/error.h"
#include "io/write_rules.h"
#include "run/compare.h"

namespace nibble::cli {
namespace {

struct CompareOptions {
  std::vector<std::string> runs;
  std::string output;
};

CommandRegistration compare_command("compare", [](CLI::App& app, int& exit_code) {
  auto o = std::make_shared<CompareOptions>();
  CLI::App* cmd = app.add_subcommand("compare", "Compare runs: loss/speed table and a loss-vs-tokens PNG");
  cmd->add_option("runs", o->runs, "run directories; the first is the reference of the gap column")->required();
  cmd->add_option("-o,--output", o->output, "PNG path (default: compare.png next to the first run)");
  cmd->callback([o, &exit_code] {
    std::vector<train::RunSummary> runs;
    for (const auto& r : o->runs) runs.push_back(train::summarize_run(r));
    fmt::print("{}", train::comparison_table(runs));
    std::filesystem::path png = o->output;
    if (png.empty()) {
      std::filesystem::path first = std::filesystem::path(o->runs[0]).lexically_normal();
      if (first.filename().empty()) first = first.parent_path();
      png = first.parent_path() / "compare.png";
    }
    // The plot goes outside every run (only the trainer writes into one) and replaces no input.
    io::refuse_output_in_owned_directory(png, "compare");
    const std::vector<std::filesystem::path> inputs(o->runs.begin(), o->runs.end());
    io::refuse_output_overlapping_inputs(png, inputs, "compare");
    train::plot_loss_curves(runs, png);
    fmt::print("plot: {}\n", png.string());
    exit_code = 0;
  });
});

}  // namespace
}  // namespace nibble::cli
