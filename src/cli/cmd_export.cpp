// `nibble export RUN --format hf|modelopt-nvfp4|compressed-tensors-nvfp4 -o DIR`: a trained run as a
// Hugging Face model directory that vLLM, TensorRT-LLM, SGLang and transformers serve without
// re-quantizing (train/export.h says what each format holds and why the NVFP4 codes are exact).
#include <fmt/format.h>

#include <memory>

#include "cli/command.h"
#include "export/export.h"

namespace nibble::cli {
namespace {

struct ExportArgs {
  std::string run, checkpoint, format, output, dtype = "bf16";
  bool force = false;
  int64_t calibrate = 8;
};

CommandRegistration export_command("export", [](CLI::App& app, int& exit_code) {
  auto a = std::make_shared<ExportArgs>();
  CLI::App* cmd = app.add_subcommand("export", "Write a trained run as a Hugging Face model (dense, ModelOpt NVFP4 or "
                                               "compressed-tensors NVFP4) for vLLM / TensorRT-LLM / SGLang / transformers");
  cmd->add_option("run", a->run, "run directory (written by nibble train)")->required();
  cmd->add_option("--checkpoint", a->checkpoint, "checkpoint directory (default: the newest of the run)");
  cmd->add_option("--format", a->format, "hf, modelopt-nvfp4 or compressed-tensors-nvfp4")->required();
  cmd->add_option("-o,--output", a->output, "output directory (refused if it exists, unless --force)")->required();
  cmd->add_option("--dtype", a->dtype, "dtype of the dense tensors (all of them for hf): bf16 (default) or fp32");
  cmd->add_option("--calibrate", a->calibrate,
                  "NVFP4 formats: batches of validation windows run through the recipe to set the static activation "
                  "scales (default 8; 0: weight-only, no activation scales)")
      ->check(integer_at_least(0, "a batch count, or 0 for weight-only scales"));
  cmd->add_flag("--force", a->force, "replace an existing output directory");
  cmd->callback([a, &exit_code] {
    train::ExportOptions o;
    o.run_dir = a->run;
    if (!a->checkpoint.empty()) o.checkpoint = std::filesystem::path(a->checkpoint);
    o.format = train::parse_export_format(a->format);
    o.output = a->output;
    if (a->dtype != "bf16" && a->dtype != "fp32")
      throw UsageError(fmt::format("--dtype {} is unknown: use bf16 or fp32", a->dtype));
    o.bf16 = a->dtype == "bf16";
    o.force = a->force;
    o.calibrate_batches = a->calibrate;
    fmt::print("{}", train::export_run(o));
    exit_code = 0;
  });
});

}  // namespace
}  // namespace nibble::cli
