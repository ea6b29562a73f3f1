// `nibble generate RUN --prompt TEXT`: samples text from a run's checkpoint with a KV cache.
#include <fmt/format.h>

#include <memory>

#include "cli/command.h"
#include "run/generate.h"
#include "run/open_run.h"

namespace nibble::cli {
namespace {

struct GenerateOptions {
  std::string run, prompt = "\n", checkpoint, device = "cpu";
  train::SamplingOptions sampling;
};

CommandRegistration generate_command("generate", [](CLI::App& app, int& exit_code) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* cmd = app.add_subcommand("generate", "Sample text from a trained run");
  cmd->add_option("run", o->run, "run directory (written by nibble train)")->required();
  cmd->add_option("--prompt", o->prompt, "text to continue (default: a newline)");
  cmd->add_option("--max-tokens", o->sampling.max_tokens, "tokens to sample")->capture_default_str();
  cmd->add_option("--temperature", o->sampling.temperature, "softmax temperature (0: greedy)")->capture_default_str();
  cmd->add_option("--top-k", o->sampling.top_k, "sample among the k likeliest tokens (0: all)")->capture_default_str();
  cmd->add_option("--seed", o->sampling.seed, "random seed of the sampler")->capture_default_str()->check(integer_at_least(0, "a seed >= 0"));
  cmd->add_option("--checkpoint", o->checkpoint, "checkpoint of the run, by name (step_00000100) or path (default: the newest)")
      ->check(checkpoint_name());
  cmd->add_option("--device", o->device, "cpu, or cuda (one NVIDIA GPU), whichever trained the run")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->callback([o, &exit_code] {
    o->sampling.validate();
    auto run = train::load_run(o->run,
                               o->checkpoint.empty() ? std::nullopt : std::optional<std::filesystem::path>(o->checkpoint),
                               device_from_flag(o->device));
    if (!run.tokenizer)
      throw UsageError(fmt::format("{} was trained on data.format={} token files, which carry no tokenizer: generate "
                                   "cannot encode the prompt nor decode what it samples (`nibble eval` works on this "
                                   "run; a run trained with data.tokenizer=FILE, the tokenizer that wrote the files, has one)",
                                   o->run, to_string(run.config.data_format)));
    std::vector<int32_t> prompt;
    try {
      prompt = run.tokenizer->encode_prompt(o->prompt);
    } catch (const UsageError& e) {
      throw UsageError(fmt::format("the prompt cannot be encoded by this run's tokenizer: {}", e.what()));
    }
    std::fputs(o->prompt.c_str(), stdout);
    // Print what each new token adds to the decoded text (BPE pieces only decode well in context).
    std::vector<int32_t> produced;
    std::string shown;
    train::generate_tokens(*run.model, prompt, o->sampling, [&](int32_t id) {
      produced.push_back(id);
      const std::string text = run.tokenizer->decode(produced);
      if (text.size() > shown.size() && text.starts_with(shown)) std::fputs(text.c_str() + shown.size(), stdout);
      else if (text != shown) std::fputs(text.c_str(), stdout);
      std::fflush(stdout);
      shown = text;
    });
    std::fputs("\n", stdout);
    exit_code = 0;
  });
});

}  // namespace
}  // namespace nibble::cli
