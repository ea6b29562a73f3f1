// Issue #33's prepare, data-directory and parser cases through the nibble command: an existing
// data directory is replaced only with --force and only whole (a prepare killed mid-write leaves the
// old one, which train still accepts, and its temporary is removed by the next prepare); a data
// directory changed afterwards is refused by train and eval; prepare's outputs never land in a run
// or over an input; inputs sentencepiece crashed on are prepared or refused with the right fix;
// devices are not read as files; out-of-range config values, empty number options and a run.dir
// holding a newline are handled.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "data/data.h"
#include "data/shards.h"
#include "run/config.h"
#include "support/check.h"
#include "support/cli.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;
using namespace nibble;

namespace {

using cli_test::contains;
using cli_test::file_bytes;
using cli_test::Result;
using cli_test::run;

fs::path fresh(const std::string& name) { return nibble_test::fresh_dir("test_data_safety", name); }

std::string quoted(const fs::path& p) { return "'" + p.string() + "'"; }

void write_text(const fs::path& file, const std::string& text) {
  std::ofstream(file, std::ios::binary) << text;
}

std::string shakespeare(size_t characters) {
  return train::read_text_file(std::string(NIBBLE_SOURCE_DIR) + "/data/tinyshakespeare.txt").substr(0, characters);
}

std::map<std::string, std::vector<uint8_t>> snapshot(const fs::path& dir) {
  std::map<std::string, std::vector<uint8_t>> files;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    files[fs::relative(e.path(), dir).string()] = e.is_regular_file() ? file_bytes(e.path()) : std::vector<uint8_t>{};
  return files;
}

// Entries of `dir` whose names start with `prefix`.
std::vector<std::string> entries_starting(const fs::path& dir, const std::string& prefix) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().starts_with(prefix)) names.push_back(e.path().filename().string());
  return names;
}

// A pid no process has: a child's, after it exited and was reaped.
long dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  return child;
}

// WORK/corpus.txt prepared into WORK/data and a 2-step run of a 1-block model trained on it into
// WORK/run; CONFIG (WORK/tiny.yaml) names both.
void train_tiny_run(const fs::path& work) {
  cli_test::set_up_tiny_run(work, work / "data", work / "tiny.yaml", /*steps=*/2, /*layers=*/1);
  const Result r = run("train " + (work / "tiny.yaml").string() + " run.dir=" + (work / "run").string() +
                       " eval.interval=2 checkpoint.interval=2 threads=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
}

}  // namespace

TEST(PrepareOutput, AnExistingDataDirectoryIsReplacedOnlyWithForce) {
  const fs::path work = fresh("force");
  write_text(work / "a.txt", shakespeare(20000));
  write_text(work / "b.txt", shakespeare(30000) + "~");
  const fs::path d = work / "data";
  ASSERT_EQ(run("prepare " + quoted(work / "a.txt") + " -o " + quoted(d)).exit_code, 0);
  const auto before = snapshot(d);

  const Result again = run("prepare " + quoted(work / "b.txt") + " -o " + quoted(d));
  EXPECT_EQ(again.exit_code, 2) << again.output;
  EXPECT_TRUE(contains(again.output, "already holds prepared data; pass --force")) << again.output;
  EXPECT_EQ(snapshot(d), before);

  const Result forced = run("prepare " + quoted(work / "b.txt") + " -o " + quoted(d) + " --force");
  ASSERT_EQ(forced.exit_code, 0) << forced.output;
  EXPECT_TRUE(contains(forced.output, "replaced the data directory")) << forced.output;
  EXPECT_EQ(train::load_dataset(d).tokenizer->decode(train::load_dataset(d).corpus()), shakespeare(30000) + "~");
  EXPECT_TRUE(entries_starting(work, "data.").empty());  // no temporary or old copy left beside it

  // A file the directory holds that prepare did not write would go with it: refused.
  write_text(d / "notes.txt", "mine");
  const Result foreign = run("prepare " + quoted(work / "a.txt") + " -o " + quoted(d) + " --force");
  EXPECT_EQ(foreign.exit_code, 2) << foreign.output;
  EXPECT_TRUE(contains(foreign.output, (d / "notes.txt").string() + ", which nibble prepare did not write"))
      << foreign.output;
  EXPECT_TRUE(fs::exists(d / "notes.txt"));
}

TEST(PrepareOutput, ARefusedPrepareCreatesNothing) {
  const fs::path work = fresh("refused");
  write_text(work / "a.txt", shakespeare(5000));
  fs::create_directories(work / "texts");
  write_text(work / "texts" / "b.txt", "more text\n");
  fs::create_directories(work / "nothing");
  write_text(work / "nothing" / "notes.bin", "no text file prepare reads");
  fs::create_directory_symlink(work / "nothing", work / "nothing-link");
  const auto texts = snapshot(work / "texts");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"prepare " + quoted(work / "missing.txt") + " -o " + quoted(work / "out" / "new"), "missing.txt"},
      {"prepare " + quoted(work / "a.txt") + " " + quoted(work / "nothing") + " -o " + quoted(work / "out" / "new"),
       "nothing' holds no file prepare reads"},
      {"prepare " + quoted(work / "a.txt") + " " + quoted(work / "nothing") + "/ -o " + quoted(work / "out" / "new"),
       "holds no file prepare reads"},
      {"prepare " + quoted(work / "nothing-link") + " -o " + quoted(work / "out" / "new"), "holds no file prepare reads"},
      {"prepare " + quoted(work / "a.txt") + " --val-fraction 1 -o " + quoted(work / "out" / "new"), "no training data"},
      {"prepare /dev/zero -o " + quoted(work / "out" / "new"), "'/dev/zero' is a device"},
      {"prepare " + quoted(work / "a.txt") + " --tokenizer bpe --vocab-size 100 -o " + quoted(work / "out" / "new"),
       "--vocab-size"},
      {"prepare " + quoted(work / "a.txt") + " -o " + quoted(work / "texts"), "holds other files and no prepare.json"},
      {"prepare " + quoted(work / "a.txt") + " -o " + quoted(work / "a.txt"), "the output is the input"},
  };
  for (const auto& [args, expected] : cases) {
    const Result r = run(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, expected)) << args << "\n" << r.output;
    EXPECT_FALSE(fs::exists(work / "out")) << args;
  }
  EXPECT_EQ(snapshot(work / "texts"), texts);
  EXPECT_EQ(fs::file_size(work / "a.txt"), 5000u);
}

// A prepare over an existing data directory that dies while writing (SIGXFSZ from a file-size limit,
// as deterministic as a kill -9 mid-write) or fails to write (the same limit with the signal
// ignored: EFBIG, as on a full disk) leaves the old directory as it was, which train accepts.
TEST(PrepareOutput, APrepareThatDiesMidWriteLeavesTheOldDirectoryWhole) {
  const fs::path work = fresh("midwrite");
  write_text(work / "small.txt", shakespeare(20000));
  write_text(work / "big.txt", shakespeare(1000000) + "~");  // another alphabet: another tokenizer.json
  const fs::path d = work / "data";
  ASSERT_EQ(run("prepare " + quoted(work / "small.txt") + " -o " + quoted(d)).exit_code, 0);
  const auto before = snapshot(d);
  const std::string big = "prepare " + quoted(work / "big.txt") + " -o " + quoted(d) + " --force";

  const Result killed = run(big, "ulimit -f 400;");
  EXPECT_NE(killed.exit_code, 0) << killed.output;
  EXPECT_EQ(snapshot(d), before);
  EXPECT_NO_THROW(train::load_dataset(d));
  const auto left = entries_starting(work, "data.tmp.");
  EXPECT_EQ(left.size(), 1u) << "the killed prepare's directory is expected beside the data";

  const Result full = run(big, "trap '' XFSZ; ulimit -f 400;");
  EXPECT_EQ(full.exit_code, 2) << full.output;
  EXPECT_TRUE(contains(full.output, "File too large")) << full.output;
  EXPECT_TRUE(contains(full.output, "removed " + (work / left.at(0)).string())) << full.output;
  EXPECT_EQ(snapshot(d), before);
  EXPECT_TRUE(entries_starting(work, "data.").empty());

  ASSERT_EQ(run(big).exit_code, 0);
  EXPECT_EQ(train::load_dataset(d).tokenizer->decode(train::load_dataset(d).val.to_vector()).back(), '~');
}

TEST(PrepareOutput, OnlyAKilledPreparesOwnTemporariesAreRemoved) {
  const fs::path work = fresh("stale");
  write_text(work / "a.txt", shakespeare(5000));
  const std::string dead = std::to_string(dead_pid()), alive = std::to_string(::getpid());
  auto staged = [&](const std::string& name, const std::string& file) {
    fs::create_directories(work / name);
    write_text(work / name / file, "partial");
  };
  staged("data.tmp." + dead, "train.bin.tmp." + dead);  // a killed prepare's: removed
  write_text(work / ("data.tmp." + dead) / "train-00003.bin", "partial");   // with its shards
  write_text(work / ("data.tmp." + dead) / "source-tokens.spool", "partial");  // and spool
  staged("data.old.tmp." + dead, "val.bin");             // a killed replacement's old copy: removed
  staged("data.tmp." + alive, "train.bin");              // a live process's: kept
  staged("data.tmp.1" + dead, "notes.txt");              // holds a file prepare never writes: kept
  staged("other.tmp." + dead, "train.bin");              // another destination's: kept
  write_text(work / ("data.tmp.2" + dead), "a file, not a directory");
  const Result r = run("prepare " + quoted(work / "a.txt") + " -o " + quoted(work / "data"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(work / ("data.tmp." + dead)));
  EXPECT_FALSE(fs::exists(work / ("data.old.tmp." + dead)));
  for (const std::string& kept : {"data.tmp." + alive, "data.tmp.1" + dead, "other.tmp." + dead, "data.tmp.2" + dead})
    EXPECT_TRUE(fs::exists(work / kept)) << kept;
}

TEST(PrepareOutput, OutputsInARunOrOverAnInputAreRefused) {
  const fs::path work = fresh("owned");
  train_tiny_run(work);
  const fs::path run_dir = work / "run", d = work / "data";
  const auto run_before = snapshot(run_dir), data_before = snapshot(d);
  const std::string corpus = quoted(work / "corpus.txt");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"prepare " + corpus + " -o " + quoted(run_dir), "is the run directory " + run_dir.string()},
      {"prepare " + corpus + " -o " + quoted(run_dir) + " --force", "is the run directory"},
      {"prepare " + corpus + " -o " + quoted(run_dir / "data"), "lies inside the run directory " + run_dir.string()},
      {"prepare " + quoted(d / "train-00000.bin") + " -o " + quoted(d) + " --force", "the output holds the input"},
      {"prepare " + quoted(d / "nibble_tokenizer.json") + " -o " + quoted(d) + " --force", "the output holds the input"},
      {"prepare " + corpus + " -o " + quoted(d / "sub"), "lies inside the data directory " + d.string()},
  };
  for (const auto& [args, expected] : cases) {
    const Result r = run(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, expected)) << args << "\n" << r.output;
  }
  EXPECT_EQ(snapshot(run_dir), run_before);
  EXPECT_EQ(snapshot(d), data_before);
}

// A data directory whose files come from two prepares (same vocabulary size, other characters)
// is refused by train and eval, naming the file; one from an earlier nibble (no checksums) is
// read with a warning.
TEST(DataDirectory, FilesChangedAfterPrepareAreRefused) {
  const fs::path work = fresh("mixed");
  train_tiny_run(work);
  std::string other = shakespeare(60000);
  std::replace(other.begin(), other.end(), 'a', '~');  // as many characters, one of them another
  write_text(work / "other.txt", other);
  ASSERT_EQ(run("prepare " + quoted(work / "other.txt") + " -o " + quoted(work / "other")).exit_code, 0);
  const fs::path d = work / "data";
  const std::string train = "train " + quoted(work / "tiny.yaml") + " run.dir=" + quoted(work / "new-run");

  fs::copy_file(work / "other" / "nibble_tokenizer.json", d / "nibble_tokenizer.json", fs::copy_options::overwrite_existing);
  Result r = run(train);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, (d / "nibble_tokenizer.json").string() + ": ")) << r.output;
  EXPECT_TRUE(contains(r.output, "different `nibble prepare` runs")) << r.output;
  EXPECT_FALSE(fs::exists(work / "new-run"));
  fs::copy_file(work / "run" / "nibble_tokenizer.json", d / "nibble_tokenizer.json", fs::copy_options::overwrite_existing);
  fs::copy_file(work / "other" / "val-00000.bin", d / "val-00000.bin", fs::copy_options::overwrite_existing);
  r = run("eval " + quoted(work / "run") + " --tokens " + quoted(d / "val-00000.bin"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, (d / "val-00000.bin").string() + ": ")) << r.output;

  ASSERT_EQ(run("prepare " + quoted(work / "corpus.txt") + " -o " + quoted(d) + " --force").exit_code, 0);
  nlohmann::json record = nlohmann::json::parse(std::ifstream(d / "prepare.json"));
  record.erase("files");  // as an earlier nibble wrote it
  std::ofstream(d / "prepare.json") << record.dump(2);
  r = run(train);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "warning: " + d.string() + " has no record of its files' checksums")) << r.output;
}

TEST(PrepareBpe, InputsSentencepieceCrashedOnArePreparedOrRefusedWithTheFix) {
  const fs::path work = fresh("bpe");
  std::mt19937 random(5);
  std::string acgt(100000, 'A');
  for (char& c : acgt) c = "ACGT"[random() % 4];
  std::string cr_only;
  while (cr_only.size() < 1100000) cr_only += "the quick brown fox jumps over the lazy dog\r";
  std::string long_line;
  for (int i = 0; i < 5000; ++i) long_line += "abcdefghi";
  const std::vector<std::pair<std::string, std::string>> prepared = {
      {"long-line", long_line}, {"acgt", acgt}, {"cr-only", cr_only}};
  for (const auto& [name, text] : prepared) {
    write_text(work / (name + ".txt"), text);
    const Result r = run("prepare " + quoted(work / (name + ".txt")) + " --tokenizer bpe -o " + quoted(work / name));
    ASSERT_EQ(r.exit_code, 0) << name << "\n" << r.output;
    const train::Dataset d = train::load_dataset(work / name);
    EXPECT_EQ(d.tokenizer->decode(d.corpus()), text) << name;
  }

  write_text(work / "latin1.txt", "caf\xE9 au lait\n");
  Result r = run("prepare " + quoted(work / "latin1.txt") + " --tokenizer bpe -o " + quoted(work / "latin1"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, (work / "latin1.txt").string() + ": the byte 0xE9 at offset 3")) << r.output;
  EXPECT_TRUE(contains(r.output, "--tokenizer char")) << r.output;

  // 1500 distinct CJK characters need 1500 pieces of their own: the fix is a larger vocabulary.
  std::string cjk;
  for (int i = 0; i < 3000; ++i) {
    const char32_t c = 0x4E00 + static_cast<char32_t>(i % 1500);
    cjk += {static_cast<char>(0xE0 | (c >> 12)), static_cast<char>(0x80 | ((c >> 6) & 0x3F)),
            static_cast<char>(0x80 | (c & 0x3F))};
    if (i % 40 == 39) cjk += '\n';
  }
  write_text(work / "cjk.txt", cjk);
  r = run("prepare " + quoted(work / "cjk.txt") + " --tokenizer bpe -o " + quoted(work / "cjk"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "1500 distinct characters; pass --vocab-size 1760 or more")) << r.output;
  EXPECT_FALSE(contains(r.output, "smaller --vocab-size")) << r.output;
  EXPECT_FALSE(fs::exists(work / "cjk"));
}

TEST(Readers, DevicesAndPathsOutsideTheRunAreNotRead) {
  const fs::path work = fresh("devices");
  train_tiny_run(work);
  Result r = run("eval " + quoted(work / "run") + " --tokens /dev/zero");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "/dev/zero is a device, not a token shard")) << r.output;

  // A BPE description whose model is a path, or a model file that is a device.
  const fs::path copy = work / "copy";
  fs::copy(work / "run", copy, fs::copy_options::recursive);
  for (const std::string model : {"/dev/zero", "../data/train-00000.bin"}) {
    std::ofstream(copy / "nibble_tokenizer.json") << nlohmann::json{{"type", "bpe"}, {"model", model}, {"vocab_size", 65}}.dump();
    r = run("eval " + quoted(copy));
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(contains(r.output, "\"model\" is '" + model + "', not the name of a file beside it")) << r.output;
  }
  fs::create_symlink("/dev/zero", copy / "tokenizer.model");
  std::ofstream(copy / "nibble_tokenizer.json") << nlohmann::json{{"type", "bpe"}, {"model", "tokenizer.model"}, {"vocab_size", 65}}.dump();
  r = run("eval " + quoted(copy));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "is a device, not a sentencepiece model")) << r.output;

  // A safetensors file with bytes after its last tensor.
  const fs::path weights = work / "run" / "checkpoints" / "step_00000002" / "model.safetensors";
  ASSERT_TRUE(fs::exists(weights));
  std::ofstream(work / "trailing.safetensors", std::ios::binary)
      .write(reinterpret_cast<const char*>(file_bytes(weights).data()), static_cast<std::streamsize>(fs::file_size(weights)));
  std::ofstream(work / "trailing.safetensors", std::ios::binary | std::ios::app) << "junk";
  r = run("dequantize " + quoted(work / "trailing.safetensors") + " -o " + quoted(work / "x.npy"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "4 unexpected bytes after the last tensor's data")) << r.output;
}

TEST(Parsers, EmptyNumbersAndOutOfRangeKeysAreRefused) {
  const fs::path work = fresh("parsers");
  train_tiny_run(work);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"generate " + quoted(work / "run") + " --max-tokens ''", "--max-tokens: is empty: give a number"},
      {"generate " + quoted(work / "run") + " --temperature ''", "--temperature: is empty"},
      {"eval " + quoted(work / "run") + " --max-windows ''", "--max-windows: is empty"},
      {"prepare " + quoted(work / "corpus.txt") + " --vocab-size '' -o " + quoted(work / "p"), "--vocab-size: is empty"},
      {"train " + quoted(work / "tiny.yaml") + " run.dir=" + quoted(work / "r") + " model.width=4611686018427387904",
       "model.width=4611686018427387904 is out of range: give a value in [1, 1048576]"},
      {"train " + quoted(work / "tiny.yaml") + " run.dir=" + quoted(work / "r") + " batch=4611686018427387904",
       "batch=4611686018427387904 is out of range"},
      {"train " + quoted(work / "tiny.yaml") + " run.dir=" + quoted(work / "r") + " model.mlp_hidden=99999999999999999999",
       "model.mlp_hidden=99999999999999999999 is out of range"},
      {"train " + quoted(work / "tiny.yaml") + " run.dir=" + quoted(work / "r") + " batch=1073741824 model.context=16777216",
       "bytes of memory"},
  };
  for (const auto& [args, expected] : cases) {
    const Result r = run(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, expected)) << args << "\n" << r.output;
  }
  EXPECT_FALSE(fs::exists(work / "r"));
  EXPECT_FALSE(fs::exists(work / "p"));
}

// The saved config.yaml names run.dir exactly, a newline included, so resuming through it
// continues this run instead of starting one in "run x".
TEST(Parsers, ARunDirWithANewlineResumesWhereItIs) {
  const fs::path work = fresh("newline");
  cli_test::set_up_tiny_run(work, work / "data", work / "tiny.yaml", /*steps=*/2, /*layers=*/1);
  const fs::path run_dir = work / "run\nx";
  std::ofstream(work / "tiny.yaml", std::ios::app) << "run:\n  dir: \"" << work.string() << "/run\\nx\"\n";
  Result r = run("train " + quoted(work / "tiny.yaml") + " checkpoint.interval=2 eval.interval=2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(fs::exists(run_dir / "checkpoints" / "step_00000002")) << r.output;
  train::RunConfig saved;
  train::apply_config_yaml(saved, train::read_text_file((run_dir / "config.yaml").string()), "config.yaml");
  EXPECT_EQ(saved.run_dir, run_dir.string());
  r = run("train " + quoted(run_dir / "config.yaml") + " resume=true steps=4 schedule.rewarm=true");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(run_dir / "checkpoints" / "step_00000004")) << r.output;
  EXPECT_FALSE(fs::exists(work / "run x"));
}

// A tokenizer file of a kind nibble does not read is refused before anything is written, with exit
// 2 and a message naming the file and the kind (a WordPiece tokenizer.json, a BERT's); so is a
// --tokenizer that is neither char, bpe nor an existing file.
TEST(PrepareTokenizerFile, AnUnsupportedKindIsRefusedNamingFileAndKind) {
  const fs::path dir = fresh("unsupported-tokenizer");
  write_text(dir / "corpus.txt", shakespeare(2000));
  write_text(dir / "wordpiece.json",
             R"({"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,)"
             R"("pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,)"
             R"("model":{"type":"WordPiece","unk_token":"[UNK]","vocab":{"[UNK]":0}}})");
  const Result r = run("prepare " + (dir / "corpus.txt").string() + " -o " + (dir / "data").string() +
                       " --tokenizer " + (dir / "wordpiece.json").string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, (dir / "wordpiece.json").string())) << r.output;
  EXPECT_TRUE(contains(r.output, "WordPiece")) << r.output;
  EXPECT_FALSE(fs::exists(dir / "data"));
  const Result missing = run("prepare " + (dir / "corpus.txt").string() + " -o " + (dir / "data").string() +
                             " --tokenizer " + (dir / "gpt2.json").string());
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_TRUE(contains(missing.output, "is unknown: use char, bpe, or the path of a tokenizer file")) << missing.output;
  EXPECT_FALSE(fs::exists(dir / "data"));
  // --vocab-size is for a tokenizer prepare trains: with a file it would be silently ignored.
  const Result sized = run("prepare " + (dir / "corpus.txt").string() + " -o " + (dir / "data").string() +
                           " --tokenizer " + (dir / "wordpiece.json").string() + " --vocab-size 4096");
  EXPECT_EQ(sized.exit_code, 2) << sized.output;
  EXPECT_TRUE(contains(sized.output, "has its own vocabulary")) << sized.output;
  EXPECT_FALSE(fs::exists(dir / "data"));
}
