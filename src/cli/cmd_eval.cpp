// `nibble eval RUN`: validation loss and perplexity of a run's checkpoint on a token file.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <algorithm>
#include <memory>
#include <vector>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "export/export.h"
#include "run/open_run.h"
#include "data/shards.h"

namespace nibble::cli {
namespace {

struct EvalOptions {
  std::string run, tokens, checkpoint, device = "cpu";
  std::string precision = "recipe";  // the forward's precision: the run's recipe, or another (post-training)
  // The table form: every run of `runs` under every precision of `precisions` (more than one of either).
  std::vector<std::string> runs, precisions = {"recipe"};
  int64_t max_windows = 0;
  bool fp32 = false;
  bool weights_only_quantized = false;
  bool json = false;
};

// A `nibble prepare` shard, memory-mapped, checked to hold ids of the run's vocabulary size.
train::TokenStream prepared_shard(const train::LoadedRun& run, const std::filesystem::path& tokens_path) {
  auto shard = train::open_token_file(tokens_path, train::TokenFormat::nibble, 0);
  if (shard.vocab_size != run.tokenizer->vocab_size())
    throw UsageError(fmt::format("{} was written for a vocabulary of {} ids, the run's tokenizer has {}: use a token "
                                 "file prepared with the run's tokenizer",
                                 tokens_path.string(), shard.vocab_size, run.tokenizer->vocab_size()));
  return shard.tokens;
}

// A shard does not name its tokenizer, but `nibble prepare` writes one next to it: another
// tokenizer of the same vocabulary size would give a loss of other text, silently. Checked once per
// directory (loading a tokenizer is the costly part), naming `shard`, the first shard read from it.
void refuse_another_tokenizer(const train::LoadedRun& run, const std::filesystem::path& shard) {
  const std::filesystem::path dir = shard.parent_path().empty() ? "." : shard.parent_path();
  if (train::has_tokenizer(dir) && train::load_tokenizer(dir)->identity() != run.tokenizer->identity())
    throw UsageError(fmt::format("{} was prepared with another tokenizer ({}) than the run's, although the "
                                 "vocabulary size ({}) is the same: its token ids mean other text. Use a token file "
                                 "prepared with the run's tokenizer",
                                 shard.string(), dir.string(), run.tokenizer->vocab_size()));
}

// --tokens FILE, else the validation shards of data directory `dir` in order (val-00000.bin ..., or an
// earlier nibble's val.bin).
train::TokenStream prepared_tokens(const train::LoadedRun& run, const std::filesystem::path& dir, const std::string& tokens,
                                   std::string& label) {
  if (!tokens.empty()) {
    label = tokens;
    train::TokenStream shard = prepared_shard(run, tokens);
    refuse_another_tokenizer(run, tokens);
    return shard;
  }
  const auto files = train::prepared_shards(dir).val;
  train::TokenStream all;
  for (const auto& f : files) all.append(prepared_shard(run, dir / f.file));
  refuse_another_tokenizer(run, dir / files[0].file);
  label = files.size() == 1 ? (dir / files[0].file).string()
                            : fmt::format("{} validation shards ({} ...)", files.size(), (dir / files[0].file).string());
  return all;
}

// The tokens to evaluate on: --tokens (in the run's data.format), else the run's validation files
// (data.dir's val-*.bin, or the llm.c/nanoGPT val files its data.* keys name), memory-mapped.
train::TokenStream evaluation_tokens(const train::LoadedRun& run, const train::DataSpec& spec, const std::string& tokens,
                                     std::string& label) {
  if (spec.format == train::TokenFormat::nibble) return prepared_tokens(run, spec.dir, tokens, label);
  const int64_t vocab = run.config.train.model.vocab;
  if (!tokens.empty()) {
    label = tokens;
    return train::open_token_file(tokens, spec.format, vocab, "the run's model.vocab").tokens;
  }
  train::TokenStream all;
  const auto files = train::list_token_files(spec).val;
  for (const auto& f : files) all.append(train::open_token_file(f, spec.format, vocab, "the run's model.vocab").tokens);
  label = files.size() == 1 ? files[0].string() : fmt::format("{} validation files ({} ...)", files.size(), files[0].string());
  return all;
}

std::string mode_of(const EvalOptions& o, int replaced) {
  const std::string ptq = o.precision == "recipe" ? "" : fmt::format(" of --precision {} (post-training quantization of the run's weights)", o.precision);
  if (o.weights_only_quantized)
    return fmt::format("FP32 GEMMs on the dequantized NVFP4 weights of {} linears{}", replaced, ptq);
  if (o.fp32) return "FP32 GEMMs";
  return o.precision == "recipe" ? "the run's recipe"
                                 : fmt::format("the forward of quantization={} with its default knobs, on the run's "
                                               "weights (post-training quantization)",
                                               o.precision == "fp32" ? "none" : o.precision);
}

std::string mode_key(const EvalOptions& o) {
  return o.weights_only_quantized ? "weights-only-quantized" : o.fp32 ? "fp32" : o.precision == "recipe" ? "recipe" : "precision=" + o.precision;
}

// --precision P: the run's weights evaluated under P's forward (its default knobs, no precision
// switch), whatever the run trained with; a BF16 run so gets its post-training NVFP4 loss.
void apply_precision(train::LoadedRun& run, const std::string& precision) {
  if (precision == "recipe") return;
  RecipeConfig rc;
  rc.quantization = parse_quantization(precision == "fp32" ? "none" : precision);
  run.config.train.recipe = rc;
}

// One source of a mixture run on its validation tokens; `weight` its share of the mixture.
struct SourceLoss {
  std::string name, label;
  double weight = 0;
  train::EvalResult result;
};

// Each source of a mixture run on its own validation tokens, and the weight-averaged mean of their
// losses (what training reports as val_loss; each source's loss is the mean over its own windows).
std::vector<SourceLoss> evaluate_each_source(train::LoadedRun& run, const EvalOptions& o, double& overall) {
  const auto sources = run.config.data_sources();
  double total_weight = 0;
  for (const auto& s : sources) total_weight += s.weight;
  std::vector<SourceLoss> out;
  overall = 0;
  for (const auto& s : sources) {
    SourceLoss l{s.name, "", s.weight / total_weight, {}};
    const train::TokenStream tokens = evaluation_tokens(run, s.spec, "", l.label);
    l.result = train::evaluate_token_stream(run, tokens, o.max_windows, !o.fp32 && !o.weights_only_quantized);
    overall += l.weight * l.result.loss;
    out.push_back(std::move(l));
  }
  return out;
}

// A mixture run without --tokens: the per-source table, then the weight-averaged loss.
void evaluate_sources(train::LoadedRun& run, const EvalOptions& o, int replaced) {
  double overall = 0;
  nlohmann::json rows = nlohmann::json::array();
  std::string table = fmt::format("  {:<16} {:>7} {:>8} {:>11} {:>10} {:>8}\n", "source", "weight", "loss",
                                  "perplexity", "tokens", "windows");
  for (const SourceLoss& l : evaluate_each_source(run, o, overall)) {
    const auto& r = l.result;
    table += fmt::format("  {:<16} {:>7.4f} {:>8.4f} {:>11.3f} {:>10} {:>8}  {}\n", l.name, l.weight, r.loss,
                         r.perplexity(), r.tokens, r.windows, l.label);
    rows.push_back({{"name", l.name}, {"weight", l.weight}, {"loss", r.loss}, {"tokens", r.tokens},
                    {"windows", r.windows}, {"tokens_file", l.label}});
  }
  if (o.json) {
    fmt::print("{}\n", nlohmann::json{{"checkpoint", run.checkpoint.string()}, {"step", run.state.step},
                                      {"loss", overall}, {"sources", rows},
                                      {"mode", mode_key(o)}}
                           .dump());
    return;
  }
  fmt::print("{} (step {}), {}: each source's loss is the mean over its validation windows\n{}overall loss {:.4f}, "
             "perplexity {:.3f}: the weight-averaged mean of the per-source losses (as training's val_loss)\n",
             run.checkpoint.string(), run.state.step, mode_of(o, replaced), table, overall, std::exp(overall));
}

// What a run trained with, in a table cell: "nvfp4", "bf16 + precision_map".
std::string trained_as(const train::LoadedRun& run) {
  const RecipeConfig& rc = run.config.train.recipe;
  std::string s(rc.quantization == Quantization::none ? "fp32" : to_string(rc.quantization));
  if (!rc.precision_map.empty()) s += " + precision_map";
  if (rc.precision_switch_at < 1) s += fmt::format(" (switch at {:g})", rc.precision_switch_at);
  return s;
}

// `nibble eval RUN [RUN ...] --precision P,Q,...`: every run under every precision on its validation
// tokens (or --tokens), one row each, with the gap to the first row. A run evaluated in its own
// recipe is quantization-aware training's result; in another precision, post-training quantization
// of its weights: so a QAT run and the PTQ of its BF16 twin sit in one table.
void evaluate_table(const EvalOptions& o) {
  if (o.fp32) throw UsageError("--fp32 with several runs or precisions: give fp32 among the --precision values");
  if (o.weights_only_quantized)
    throw UsageError("--weights-only-quantized evaluates one run in one mode: evaluate each run with nibble eval RUN "
                     "--weights-only-quantized");
  if (!o.checkpoint.empty() && o.runs.size() > 1)
    throw UsageError("--checkpoint names one run's checkpoint, but " + std::to_string(o.runs.size()) +
                     " runs were given: evaluate runs at other checkpoints one at a time");
  struct Row {
    std::string run, trained, evaluated, tokens_label;
    int64_t step = 0, tokens = 0, windows = 0;
    double loss = 0;
  };
  std::vector<Row> rows;
  for (const std::string& dir : o.runs) {
    auto run = train::load_run(dir, o.checkpoint.empty() ? std::nullopt : std::optional<std::filesystem::path>(o.checkpoint),
                               device_from_flag(o.device));
    const RecipeConfig trained = run.config.train.recipe;
    const std::string trained_text = trained_as(run);
    for (const std::string& precision : o.precisions) {
      run.config.train.recipe = trained;
      apply_precision(run, precision);
      // The precision the run trained in is its own (quantization-aware) forward, not a PTQ.
      const bool own = precision == "recipe" || (trained.precision_map.empty() && trained.precision_switch_at >= 1 &&
                                                 precision == (trained.quantization == Quantization::none
                                                                   ? std::string("fp32")
                                                                   : std::string(to_string(trained.quantization))));
      Row row{dir, trained_text, precision == "recipe" ? "its recipe" : precision + (own || !is_quantized(parse_quantization(precision == "fp32" ? "none" : precision)) ? "" : " (PTQ)"), "",
              run.state.step};
      if (!run.config.sources.empty() && o.tokens.empty()) {
        for (const SourceLoss& l : evaluate_each_source(run, o, row.loss)) {
          row.tokens += l.result.tokens;
          row.windows += l.result.windows;
        }
        row.tokens_label = "its sources' validation files, weight-averaged";
      } else {
        const auto r = train::evaluate_token_stream(run, evaluation_tokens(run, run.config.data_spec(), o.tokens, row.tokens_label),
                                                    o.max_windows, true);
        row.loss = r.loss;
        row.tokens = r.tokens;
        row.windows = r.windows;
      }
      rows.push_back(row);
    }
  }
  if (o.json) {
    nlohmann::json j = nlohmann::json::array();
    for (const Row& r : rows)
      j.push_back({{"run", r.run}, {"step", r.step}, {"trained", r.trained}, {"evaluated", r.evaluated},
                   {"loss", r.loss}, {"tokens", r.tokens}, {"windows", r.windows}, {"tokens_file", r.tokens_label}});
    fmt::print("{}\n", nlohmann::json{{"rows", j}}.dump());
    return;
  }
  size_t run_width = 3;
  for (const Row& r : rows) run_width = std::max(run_width, r.run.size());
  fmt::print("{:<{}} {:>7}  {:<28} {:<13} {:>8}  {:>18}\n", "run", run_width, "step", "trained", "evaluated", "loss",
             "vs the first row");
  for (const Row& r : rows) {
    const double gap = r.loss - rows.front().loss;
    fmt::print("{:<{}} {:>7}  {:<28} {:<13} {:>8.4f}  {:>+8.4f} ({:>+6.2f}%)\n", r.run, run_width, r.step, r.trained,
               r.evaluated, r.loss, gap, 100.0 * gap / rows.front().loss);
  }
  fmt::print("each loss is the mean over {} consecutive windows of {}; \"its recipe\" is the forward the run trained "
             "with (quantization-aware), as is its own quantization's; any other is the forward of quantization=P with "
             "its default knobs on the run's weights, \"(PTQ)\" where that quantizes them after training\n",
             o.max_windows > 0 ? fmt::format("the first {}", o.max_windows) : std::string("all"), rows.front().tokens_label);
}

CommandRegistration eval_command("eval", [](CLI::App& app, int& exit_code) {
  auto o = std::make_shared<EvalOptions>();
  CLI::App* cmd = app.add_subcommand("eval", "Validation loss and perplexity of a trained run on a token file");
  cmd->add_option("runs", o->runs, "run directory (written by nibble train); several give a table of every run under "
                  "every --precision")->required();
  cmd->add_option("--tokens", o->tokens, "token shard to evaluate on (default: the run's validation shards, data.dir/val-*.bin; for a data.sources run, each source's validation files, with a per-source table)");
  cmd->add_option("--checkpoint", o->checkpoint, "checkpoint of the run, by name (step_00000100) or path (default: the newest)")
      ->check(checkpoint_name());
  cmd->add_option("--device", o->device, "cpu, or cuda (one NVIDIA GPU), whichever trained the run")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--max-windows", o->max_windows, "evaluate at most this many windows (0: the whole file)");
  cmd->add_flag("--fp32", o->fp32, "evaluate with FP32 GEMMs instead of the run's recipe");
  cmd->add_option("--precision", o->precisions,
                  "the forward's precision: recipe (the run's own), or fp32, bf16, fp8, mxfp8, mxfp4, nvfp4 with that "
                  "recipe's default knobs on the run's weights (post-training quantization, e.g. of a BF16 run); "
                  "several, comma-separated (recipe,bf16,nvfp4), give a table")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::IsMember({"recipe", "fp32", "bf16", "fp8", "mxfp8", "mxfp4", "nvfp4"}));
  cmd->add_flag("--weights-only-quantized", o->weights_only_quantized,
                "FP32 GEMMs and activations with the NVFP4 layers' weights replaced by their dequantized forward "
                "quantization (the model `nibble export` serves, in FP32)");
  cmd->add_flag("--json", o->json, "print one JSON object with the loss at full precision (for scripts)");
  cmd->callback([o, &exit_code] {
    if (o->max_windows < 0)
      throw UsageError(fmt::format("--max-windows {} is negative: give a window count, or 0 for the whole file",
                                   o->max_windows));
    for (size_t i = 0; i < o->precisions.size(); ++i)
      for (size_t j = 0; j < i; ++j)
        if (o->precisions[i] == o->precisions[j])
          throw UsageError(fmt::format("--precision gives {} twice: give each precision once", o->precisions[i]));
    if (o->runs.size() > 1 || o->precisions.size() > 1) {
      evaluate_table(*o);
      exit_code = 0;
      return;
    }
    o->run = o->runs.front();
    o->precision = o->precisions.front();
    if (o->fp32 && o->weights_only_quantized)
      throw UsageError("--fp32 and --weights-only-quantized exclude each other: --weights-only-quantized already "
                       "runs FP32 GEMMs (on the dequantized 4-bit weights)");
    if (o->fp32 && o->precision != "recipe")
      throw UsageError(fmt::format("--fp32 and --precision {} exclude each other: --precision fp32 is --fp32", o->precision));
    auto run = train::load_run(o->run,
                               o->checkpoint.empty() ? std::nullopt : std::optional<std::filesystem::path>(o->checkpoint),
                               device_from_flag(o->device));
    int replaced = 0;
    apply_precision(run, o->precision);
    if (o->weights_only_quantized) {
      replaced = train::apply_weight_only_quantization(run);
      if (replaced == 0)
        throw UsageError(fmt::format(
            "--weights-only-quantized: {} multiplies no NVFP4 weights (quantization={}{}): add --precision nvfp4 to "
            "quantize its weights after training",
            o->precision == "recipe" ? "this run's recipe" : "--precision " + o->precision,
            to_string(run.config.train.recipe.quantization),
            run.config.train.recipe.precision_switch_at < 1 ? ", switched to BF16 at this step" : ""));
    }
    if (!run.config.sources.empty() && o->tokens.empty()) {
      evaluate_sources(run, *o, replaced);
      exit_code = 0;
      return;
    }
    std::string tokens_label;
    const train::TokenStream tokens = evaluation_tokens(run, run.config.data_spec(), o->tokens, tokens_label);
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = train::evaluate_token_stream(run, tokens, o->max_windows, !o->fp32 && !o->weights_only_quantized);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (o->json) {
      nlohmann::json j = {{"checkpoint", run.checkpoint.string()}, {"step", run.state.step},
                          {"tokens_file", tokens_label}, {"loss", r.loss}, {"tokens", r.tokens},
                          {"windows", r.windows},
                          {"mode", mode_key(*o)}};
      fmt::print("{}\n", j.dump());
      exit_code = 0;
      return;
    }
    fmt::print("{} (step {}) on {}: loss {:.4f}, perplexity {:.3f} over {} tokens in {} windows ({}; {:.1f}s)\n"
               "(the mean over {} {} consecutive windows of the file; training's val loss averages eval.batches={} "
               "batches of windows at fixed places, so the two differ a little)\n",
               run.checkpoint.string(), run.state.step, tokens_label, r.loss, r.perplexity(), r.tokens,
               r.windows, mode_of(*o, replaced), s, o->max_windows > 0 ? "the first" : "all", r.windows,
               run.config.train.eval_batches);
    exit_code = 0;
  });
});

}  // namespace
}  // namespace nibble::cli
