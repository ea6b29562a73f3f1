// `nibble prepare INPUT... -o DIR [--force]`: tokenizer + train/val token shards for `nibble train`,
// written as a whole directory; an existing data directory is replaced only with --force.
#include <fmt/format.h>

#include <memory>

#include "cli/command.h"
#include "common/error.h"
#include "data/bpe.h"
#include "data/shards.h"

namespace nibble::cli {
namespace {

struct PrepareCliOptions {
  std::vector<std::string> inputs, val_inputs;
  std::string output, field = "text";
  double val_fraction = 0.1;
  uint64_t shard_tokens = 100'000'000;
  uint64_t batch_mb = 16;
  bool quiet = false;
  std::string tokenizer = "char";
  int64_t vocab_size = 1024;
  std::string tiktoken_encoding;
  int threads = 0;
  bool force = false;
};

// "train-00000.bin" or "train-00000.bin ... train-00011.bin (12 shards)".
std::string shard_range(const std::vector<train::ShardSeries::Shard>& shards) {
  if (shards.size() == 1) return shards[0].file;
  return fmt::format("{} ... {} ({} shards)", shards.front().file, shards.back().file, shards.size());
}

CommandRegistration prepare_command("prepare", [](CLI::App& app, int& exit_code) {
  auto o = std::make_shared<PrepareCliOptions>();
  CLI::App* cmd = app.add_subcommand("prepare", "Tokenize text or JSON-lines files into train/val token shards and a tokenizer");
  cmd->add_option("inputs", o->inputs,
                  "text files (.txt, or any name), JSON-lines files (.jsonl, .ndjson: one object a line, the text under "
                  "--field), either also .gz or .zst; directories (their such files, recursively, in name order, hidden "
                  "ones skipped); quoted glob patterns ('web/*.jsonl.zst'). Read in order, streamed in batches: memory "
                  "stays bounded whatever their size")
      ->required();
  cmd->add_option("-o,--output", o->output,
                  "output directory (train-00000.bin ..., val-00000.bin ..., the tokenizer, prepare.json)")
      ->required();
  cmd->add_option("--field", o->field, "the field of each JSON line that holds its text")->capture_default_str();
  cmd->add_option("--val-fraction", o->val_fraction,
                  "the last this fraction of each input file's tokens validate (one file: the last tenth, as always)")
      ->capture_default_str();
  cmd->add_option("--val", o->val_inputs,
                  "validation inputs (same kinds as the inputs; give them after the inputs, as --val takes every "
                  "argument up to the next option); then the inputs all train, none is split")
      ->expected(1, -1);
  cmd->add_option("--shard-tokens", o->shard_tokens, "at most this many tokens a shard file")->capture_default_str();
  cmd->add_option("--batch-mb", o->batch_mb,
                  "megabytes of text read and encoded at a time: memory is about 7 times this (char: its text and "
                  "4-byte ids), besides the largest single document (docs/data-directory.md)")
      ->capture_default_str();
  cmd->add_flag("--quiet", o->quiet, "no progress line on stderr");
  cmd->add_option("--tokenizer", o->tokenizer,
                  "char (one token per byte), bpe (sentencepiece, trained on the text), or the path of an existing "
                  "Hugging Face tokenizer.json (byte-level BPE: GPT-2, Llama 3) or sentencepiece .model (Llama 2, Gemma) "
                  "or tiktoken NAME.tiktoken file to encode with")
      ->capture_default_str();
  cmd->add_option("--tiktoken-encoding", o->tiktoken_encoding,
                  "for a .tiktoken file: r50k_base, p50k_base, cl100k_base or o200k_base, whose pattern and special "
                  "tokens it uses (default: the file's name)");
  cmd->add_option("--threads", o->threads, "threads encoding (0: every core)")->capture_default_str();
  cmd->add_option("--vocab-size", o->vocab_size, "BPE vocabulary size")->capture_default_str();
  cmd->add_flag("--force", o->force, "replace the output if it is already a data directory (runs trained on it then read the new data)");
  cmd->callback([o, cmd, &exit_code] {
    train::PrepareOptions p;
    for (const auto& i : o->inputs) p.inputs.emplace_back(i);
    for (const auto& i : o->val_inputs) p.val_inputs.emplace_back(i);
    if (!p.val_inputs.empty() && cmd->count("--val-fraction") > 0)
      throw UsageError("--val and --val-fraction both say what validates: give --val FILE... (the inputs are then not "
                       "split) or --val-fraction F (the last F of each input validates), not both");
    p.val_fraction = o->val_fraction;
    p.field = o->field;
    p.shard_tokens = o->shard_tokens;
    if (o->batch_mb == 0 || o->batch_mb > 65536)
      throw UsageError(fmt::format("--batch-mb {} is outside [1, 65536]: give the megabytes of text to encode at a time",
                                   o->batch_mb));
    p.batch_bytes = static_cast<size_t>(o->batch_mb) << 20;
    p.progress = !o->quiet;
    p.output_dir = o->output;
    if (o->tokenizer == "char" || o->tokenizer == "bpe")
      p.tokenizer = train::parse_tokenizer_kind(o->tokenizer);
    else if (std::filesystem::exists(o->tokenizer))
      p.tokenizer_file = o->tokenizer;
    else
      train::parse_tokenizer_kind(o->tokenizer);  // refused there, naming the choices
    if (!p.tokenizer_file.empty() && cmd->count("--vocab-size") > 0)
      throw UsageError(fmt::format("--vocab-size {} is for a tokenizer prepare trains (bpe); {} has its own "
                                   "vocabulary: leave --vocab-size out",
                                   o->vocab_size, o->tokenizer));
    if (p.tokenizer_file.empty() && !o->tiktoken_encoding.empty())
      throw UsageError(fmt::format("--tiktoken-encoding {} names the pattern of a .tiktoken file: give the file "
                                   "with --tokenizer FILE.tiktoken",
                                   o->tiktoken_encoding));
    if (o->threads < 0) throw UsageError(fmt::format("--threads {} is negative: give a count, or 0 for every core", o->threads));
    train::bpe::set_threads(o->threads);
    p.tiktoken_encoding = o->tiktoken_encoding;
    p.bpe_vocab_size = o->vocab_size;
    p.force = o->force;
    const auto r = train::prepare_dataset(p);
    if (!p.tokenizer_file.empty())
      fmt::print("{}: {} documents, each followed by {}\n", o->tokenizer, r.documents,
                 r.end_of_text ? fmt::format("the end-of-text token {} (id {}){}", r.end_of_text_token, *r.end_of_text,
                                             r.begin_of_text ? fmt::format(", preceded by {}", r.begin_of_text_token) : "")
                               : std::string("nothing (the tokenizer has no end-of-text token)"));
    fmt::print("{} characters of {} files -> {} tokens with a {} tokenizer of {} ids: {} train + {} validation tokens\n"
               "{} {}/{{{}, {}, {}, prepare.json}}; train with data.dir={}\n",
               r.characters, r.sources, r.train_tokens + r.val_tokens, o->tokenizer, r.vocab_size, r.train_tokens,
               r.val_tokens, r.replaced ? "replaced the data directory with" : "wrote", o->output,
               shard_range(r.train_shards), shard_range(r.val_shards), r.tokenizer_files, o->output);
    exit_code = 0;
  });
});

}  // namespace
}  // namespace nibble::cli
