// `nibble prepare TEXT... -o DIR [--force]`: tokenizer + train/val token shards for `nibble train`,
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
  std::vector<std::string> inputs;
  std::string output;
  std::string tokenizer = "char";
  int64_t vocab_size = 1024;
  std::string tiktoken_encoding;
  int threads = 0;
  bool force = false;
};

CommandRegistration prepare_command("prepare", [](CLI::App& app, int& exit_code) {
  auto o = std::make_shared<PrepareCliOptions>();
  CLI::App* cmd = app.add_subcommand("prepare", "Tokenize text files into train/val token shards and a tokenizer");
  cmd->add_option("text", o->inputs, "text files, concatenated in order")->required();
  cmd->add_option("-o,--output", o->output, "output directory (train.bin, val.bin, tokenizer.json)")->required();
  cmd->add_option("--tokenizer", o->tokenizer,
                  "char (one token per byte), bpe (sentencepiece, trained on the text), or the path of an existing "
                  "Hugging Face tokenizer.json (byte-level BPE: GPT-2, Llama 3) or sentencepiece .model (Llama 2, Gemma) "
                  "or tiktoken NAME.tiktoken file to encode with")
      ->capture_default_str();
  cmd->add_option("--tiktoken-encoding", o->tiktoken_encoding,
                  "for a .tiktoken file: r50k_base, p50k_base, cl100k_base or o200k_base, whose pattern and special "
                  "tokens it uses (default: the file's name)");
  cmd->add_option("--threads", o->threads, "threads encoding with a tokenizer file (0: every core)")->capture_default_str();
  cmd->add_option("--vocab-size", o->vocab_size, "BPE vocabulary size")->capture_default_str();
  cmd->add_flag("--force", o->force, "replace the output if it is already a data directory (runs trained on it then read the new data)");
  cmd->callback([o, cmd, &exit_code] {
    train::PrepareOptions p;
    for (const auto& i : o->inputs) p.inputs.emplace_back(i);
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
      fmt::print("{}: {} documents, each followed by {}\n", o->tokenizer, p.inputs.size(),
                 r.end_of_text ? fmt::format("the end-of-text token {} (id {}){}", r.end_of_text_token, *r.end_of_text,
                                             r.begin_of_text ? fmt::format(", preceded by {}", r.begin_of_text_token) : "")
                               : std::string("nothing (the tokenizer has no end-of-text token)"));
    fmt::print("{} characters -> {} tokens with a {} tokenizer of {} ids: {} train + {} validation tokens\n"
               "{} {}/{{train.bin, val.bin, {}, prepare.json}}; train with data.dir={}\n",
               r.characters, r.train_tokens + r.val_tokens, o->tokenizer, r.vocab_size, r.train_tokens, r.val_tokens,
               r.replaced ? "replaced the data directory with" : "wrote", o->output, r.tokenizer_files, o->output);
    exit_code = 0;
  });
});

}  // namespace
}  // namespace nibble::cli
