// `nibble prepare TEXT... -o DIR [--force]`: tokenizer + train/val token shards for `nibble train`,
// written as a whole directory; an existing data directory is replaced only with --force.
#include <fmt/format.h>

#include <memory>

#include "cli/command.h"
#include "data/shards.h"

namespace nibble::cli {
namespace {

struct PrepareCliOptions {
  std::vector<std::string> inputs;
  std::string output;
  std::string tokenizer = "char";
  int64_t vocab_size = 1024;
  bool force = false;
};

CommandRegistration prepare_command("prepare", [](CLI::App& app, int& exit_code) {
  auto o = std::make_shared<PrepareCliOptions>();
  CLI::App* cmd = app.add_subcommand("prepare", "Tokenize text files into train/val token shards and a tokenizer");
  cmd->add_option("text", o->inputs, "text files, concatenated in order")->required();
  cmd->add_option("-o,--output", o->output, "output directory (train.bin, val.bin, tokenizer.json)")->required();
  cmd->add_option("--tokenizer", o->tokenizer, "char (one token per byte) or bpe (sentencepiece)")->capture_default_str();
  cmd->add_option("--vocab-size", o->vocab_size, "BPE vocabulary size")->capture_default_str();
  cmd->add_flag("--force", o->force, "replace the output if it is already a data directory (runs trained on it then read the new data)");
  cmd->callback([o, &exit_code] {
    train::PrepareOptions p;
    for (const auto& i : o->inputs) p.inputs.emplace_back(i);
    p.output_dir = o->output;
    p.tokenizer = train::parse_tokenizer_kind(o->tokenizer);
    p.bpe_vocab_size = o->vocab_size;
    p.force = o->force;
    const auto r = train::prepare_dataset(p);
    fmt::print("{} characters -> {} tokens with a {} tokenizer of {} ids: {} train + {} validation tokens\n"
               "{} {}/{{train.bin, val.bin, tokenizer.json, prepare.json}}; train with data.dir={}\n",
               r.characters, r.train_tokens + r.val_tokens, o->tokenizer, r.vocab_size, r.train_tokens, r.val_tokens,
               r.replaced ? "replaced the data directory with" : "wrote", o->output, o->output);
    exit_code = 0;
  });
});

}  // namespace
}  // namespace nibble::cli
