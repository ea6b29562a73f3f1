// Token files read in place (data/token_files.h): llm.c's and nanoGPT's files written here exactly
// as their scripts write them, lying headers and foreign ids refused naming the file, many shards
// sampled as one stream; then `nibble train`/`eval`/`generate` on them through the binary, and a
// corpus larger than the process's address-space limit.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "data/data.h"
#include "data/shards.h"
#include "data/token_files.h"
#include "support/check.h"
#include "support/cli.h"
#include "support/temp_dir.h"

using namespace nibble;
using namespace nibble::train;
namespace fs = std::filesystem;
using cli_test::contains;
using nibble_test::error_of;

namespace {

fs::path fresh_dir(const std::string& name) { return nibble_test::fresh_dir("test_token_files", name); }

// llm.c's write_datafile (dev/data/data_common.py): 256 int32 of header (magic, version, count),
// then the tokens: uint16 for GPT-2 (magic 20240520, version 1), uint32 for Llama 3 (magic
// 20240801, version 7); version 2 under 20240520 holds uint32 too. `count`: a header that lies.
void write_llmc(const fs::path& path, int version, const std::vector<int32_t>& tokens,
                std::optional<int64_t> count = std::nullopt,
                int32_t magic = kLlmcMagic) {
  std::vector<int32_t> header(kLlmcHeaderInts, 0);
  header[0] = version == 7 && magic == kLlmcMagic ? kLlmcLlama3Magic : magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(count.value_or(static_cast<int64_t>(tokens.size())));
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), static_cast<std::streamsize>(header.size() * 4));
  for (int32_t t : tokens) {
    if (version == 1 || (version != 2 && version != 7)) {
      const uint16_t v = static_cast<uint16_t>(t);
      out.write(reinterpret_cast<const char*>(&v), 2);
    } else {
      const uint32_t v = static_cast<uint32_t>(t);
      out.write(reinterpret_cast<const char*>(&v), 4);
    }
  }
}

// nanoGPT's prepare.py: np.array(ids, dtype=np.uint16).tofile(path).
void write_nanogpt(const fs::path& path, const std::vector<int32_t>& tokens) {
  std::ofstream out(path, std::ios::binary);
  for (int32_t t : tokens) {
    const uint16_t v = static_cast<uint16_t>(t);
    out.write(reinterpret_cast<const char*>(&v), 2);
  }
}

std::vector<int32_t> ramp(size_t n, int32_t vocab, int32_t from = 0) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((static_cast<int64_t>(i) * 7 + from) % vocab);
  return t;
}

// The bytes of the shipped tinyshakespeare.txt as token ids (a 256-id vocabulary): text a tiny
// model learns from, in any of the formats.
std::vector<int32_t> shakespeare_ids(size_t from, size_t n) {
  const std::string text = read_text_file(std::string(NIBBLE_SOURCE_DIR) + "/data/tinyshakespeare.txt");
  std::vector<int32_t> ids;
  for (size_t i = from; i < from + n; ++i) ids.push_back(static_cast<unsigned char>(text[i]));
  return ids;
}

}  // namespace

TEST(TokenFiles, LlmcShardsOfEveryVersionReadAsWritten) {
  const fs::path d = fresh_dir("llmc");
  const std::vector<int32_t> small = ramp(1000, 50257), large = ramp(1000, 128256, 70000);
  write_llmc(d / "gpt2.bin", 1, small);
  write_llmc(d / "llama3.bin", 7, large);
  write_llmc(d / "v2.bin", 2, large);
  EXPECT_EQ(open_token_file(d / "gpt2.bin", TokenFormat::llmc, 50257).tokens.to_vector(), small);
  EXPECT_EQ(open_token_file(d / "llama3.bin", TokenFormat::llmc, 128256).tokens.to_vector(), large);
  EXPECT_EQ(open_token_file(d / "v2.bin", TokenFormat::llmc, 128256).tokens.to_vector(), large);
  EXPECT_EQ(fs::file_size(d / "llama3.bin"), 1024u + 4000u);
  EXPECT_EQ(cli_test::file_bytes(d / "llama3.bin")[0], 20240801 & 0xFF);
}

TEST(TokenFiles, NanogptFilesReadAsWrittenAndHeadedFilesAreNamed) {
  const fs::path d = fresh_dir("nanogpt");
  const std::vector<int32_t> t = ramp(999, 50257);
  write_nanogpt(d / "train.bin", t);
  EXPECT_EQ(open_token_file(d / "train.bin", TokenFormat::nanogpt, 50257).tokens.to_vector(), t);
  std::ofstream(d / "train.bin", std::ios::app) << 'x';  // an odd byte count
  EXPECT_NE(error_of([&] { open_token_file(d / "train.bin", TokenFormat::nanogpt, 50257); })
                .find("train.bin: 1999 bytes is not a whole number of 2-byte tokens"),
            std::string::npos);
  write_llmc(d / "shard.bin", 1, t);
  EXPECT_NE(error_of([&] { open_token_file(d / "shard.bin", TokenFormat::nanogpt, 50257); }).find("data.format=llmc"),
            std::string::npos);
}

TEST(TokenFiles, LyingLlmcHeadersAreRefusedNamingFileAndField) {
  const fs::path d = fresh_dir("lying");
  const std::vector<int32_t> t = ramp(100, 50257);
  auto refusal = [&](const std::string& name) {
    const std::string e = error_of([&] { open_token_file(d / name, TokenFormat::llmc, 50257); });
    EXPECT_TRUE(contains(e, (d / name).string())) << e;
    return e;
  };
  write_llmc(d / "magic.bin", 1, t, std::nullopt, 20240521);
  EXPECT_TRUE(contains(refusal("magic.bin"), "header[0] (magic) is 20240521, not 20240520 (GPT-2 shards) or 20240801"));
  write_llmc(d / "version.bin", 3, t);
  EXPECT_TRUE(contains(refusal("version.bin"), "header[1] (version) is 3, which magic 20240520 does not have"));
  write_llmc(d / "llama_v1.bin", 1, t, std::nullopt, kLlmcLlama3Magic);
  EXPECT_TRUE(contains(refusal("llama_v1.bin"), "header[1] (version) is 1, which magic 20240801 does not have"));
  write_llmc(d / "more.bin", 1, t, 101);
  EXPECT_TRUE(contains(refusal("more.bin"), "header[2] (token count) says 101 tokens (202 bytes"));
  write_llmc(d / "fewer.bin", 1, t, 99);
  EXPECT_TRUE(contains(refusal("fewer.bin"), "holds 200 bytes after the header"));
  write_llmc(d / "negative.bin", 2, t, -5);
  EXPECT_TRUE(contains(refusal("negative.bin"), "says -5 tokens"));
  write_llmc(d / "truncated.bin", 2, t);
  fs::resize_file(d / "truncated.bin", 1024 + 399);
  EXPECT_TRUE(contains(refusal("truncated.bin"), "holds 399 bytes after the header: it is truncated"));
  fs::resize_file(d / "truncated.bin", 1000);
  EXPECT_TRUE(contains(refusal("truncated.bin"), "1000 bytes are fewer than the 1024-byte header"));
}

TEST(TokenFiles, TokenBeyondTheVocabularyIsNamedWithItsOffset) {
  const fs::path d = fresh_dir("vocab");
  std::vector<int32_t> t = ramp(100, 256);
  t[37] = 300;
  write_llmc(d / "v1.bin", 1, t);
  write_llmc(d / "v2.bin", 2, t);
  write_nanogpt(d / "raw.bin", t);
  EXPECT_TRUE(contains(error_of([&] { open_token_file(d / "v1.bin", TokenFormat::llmc, 256, "model.vocab"); }),
                       (d / "v1.bin").string() + ": token 300 at position 37 (byte offset 1098) is >= the "
                                                 "vocabulary size 256: the file holds ids of a larger vocabulary than "
                                                 "model.vocab=256"));
  EXPECT_TRUE(contains(error_of([&] { open_token_file(d / "v2.bin", TokenFormat::llmc, 256); }),
                       "token 300 at position 37 (byte offset 1172)"));
  EXPECT_TRUE(contains(error_of([&] { open_token_file(d / "raw.bin", TokenFormat::nanogpt, 256); }),
                       "raw.bin: token 300 at position 37 (byte offset 74)"));
  EXPECT_EQ(open_token_file(d / "v1.bin", TokenFormat::llmc, 301).tokens.at(37), 300);
}

// Windows over several shards are those of one concatenated vector: the sampler reads across a
// shard's end as within one.
TEST(TokenFiles, ShardsAreSampledAsTheirConcatenation) {
  const fs::path d = fresh_dir("many");
  const std::vector<int32_t> a = ramp(300, 1000), b = ramp(5, 1000, 3), c = ramp(400, 1000, 11);
  write_llmc(d / "x_train_000001.bin", 1, a);
  write_llmc(d / "x_train_000002.bin", 2, b);
  write_llmc(d / "x_train_000003.bin", 1, c);
  write_llmc(d / "x_val_000000.bin", 1, c);
  DataSpec spec;
  spec.format = TokenFormat::llmc;
  spec.dir = d;
  spec.vocab = 1000;
  const Dataset data = load_dataset(spec);
  EXPECT_EQ(data.tokenizer, nullptr);
  EXPECT_EQ(data.tokenizer_identity, "pretokenized:llmc:vocab=1000");
  std::vector<int32_t> all = a;
  all.insert(all.end(), b.begin(), b.end());
  all.insert(all.end(), c.begin(), c.end());
  EXPECT_EQ(data.train.to_vector(), all);
  EXPECT_EQ(data.val.to_vector(), c);
  const BatchSampler mapped(data.train, 16, 7), vector(&all, 16, 7);
  for (int64_t k = 0; k < 20; ++k) {
    std::vector<int32_t> in1, t1, in2, t2;
    mapped.sample(k, 8, in1, t1);
    vector.sample(k, 8, in2, t2);
    ASSERT_EQ(in1, in2);
    ASSERT_EQ(t1, t2);
  }
}

TEST(TokenFiles, DirectoriesAndGlobsListFilesInNameOrder) {
  const fs::path d = fresh_dir("list");
  for (const char* name : {"f_train_000002.bin", "f_train_000001.bin", "f_val_000000.bin", "notes.txt"})
    write_llmc(d / name, 1, ramp(10, 100));
  DataSpec spec;
  spec.format = TokenFormat::llmc;
  spec.dir = d;
  TokenFileLists files = list_token_files(spec);
  EXPECT_EQ(files.train, (std::vector<fs::path>{d / "f_train_000001.bin", d / "f_train_000002.bin"}));
  EXPECT_EQ(files.val, (std::vector<fs::path>{d / "f_val_000000.bin"}));
  spec.train_files = "f_train_000002.bin,*_train_000001.bin";
  spec.val_files = (d / "*val*").string();
  files = list_token_files(spec);
  EXPECT_EQ(files.train, (std::vector<fs::path>{d / "f_train_000002.bin", d / "f_train_000001.bin"}));
  EXPECT_EQ(files.val, (std::vector<fs::path>{d / "f_val_000000.bin"}));
  spec.val_files = "nothing*.bin";
  EXPECT_TRUE(contains(error_of([&] { list_token_files(spec); }), "data.val_files: the pattern '" +
                                                                      (d / "nothing*.bin").string() + "' matches no file"));
  spec.train_files = spec.val_files = "";
  spec.dir = d / "notes.txt";
  EXPECT_TRUE(contains(error_of([&] { list_token_files(spec); }), "is not a directory"));
  fs::create_directories(d / "empty");
  spec.dir = d / "empty";
  EXPECT_TRUE(contains(error_of([&] { list_token_files(spec); }), "holds no llm.c train shard"));
}

TEST(TokenFiles, PretokenizedDataNeedsTheVocabularySize) {
  const fs::path d = fresh_dir("novocab");
  DataSpec spec;
  spec.format = TokenFormat::nanogpt;
  spec.dir = d;
  spec.vocab_key = "model.vocab";
  EXPECT_TRUE(contains(error_of([&] { load_dataset(spec); }),
                       "data.format=nanogpt files carry no vocabulary size: set model.vocab"));
  EXPECT_TRUE(contains(error_of([] { parse_token_format("parquet"); }), "use nibble"));
}

// `nibble prepare`'s own shards are mapped too, and read as read_token_shard reads them.
TEST(TokenFiles, MappedNibbleShardsEqualTheShardsRead) {
  const fs::path d = fresh_dir("nibble");
  const std::vector<int32_t> small = ramp(501, 65), large = ramp(77, 100000, 70000);
  write_token_shard(d / "small.bin", small, 65);
  write_token_shard(d / "large.bin", large, 100000);
  const TokenFile s = open_token_file(d / "small.bin", TokenFormat::nibble, 0);
  EXPECT_EQ(s.vocab_size, 65);
  EXPECT_EQ(s.tokens.to_vector(), read_token_shard(d / "small.bin").tokens);
  EXPECT_EQ(open_token_file(d / "large.bin", TokenFormat::nibble, 0).tokens.to_vector(), large);
  EXPECT_TRUE(contains(error_of([&] { open_token_file(d / "small.bin", TokenFormat::nibble, 64); }),
                       "holds ids of a vocabulary of 65, not 64"));
  fs::resize_file(d / "small.bin", fs::file_size(d / "small.bin") - 2);
  EXPECT_TRUE(contains(error_of([&] { open_token_file(d / "small.bin", TokenFormat::nibble, 0); }),
                       "the header says 501 tokens (1002 bytes) but the file holds 1000 bytes"));
  EXPECT_TRUE(contains(error_of([&] { open_token_file("/dev/zero", TokenFormat::llmc, 10); }),
                       "/dev/zero is a device, not a token shard"));
}

// ---- through the binary ----

namespace {

// A tiny model's run on token files of `format` (a 256-id vocabulary).
std::string tiny_config(const fs::path& work, const std::string& data_keys, int steps) {
  const fs::path config = work / "run.yaml";
  std::ofstream(config) << data_keys << "steps: " << steps << "\nbatch: 2\nquantization: nvfp4\n"
                        << "model:\n  layers: 1\n  heads: 2\n  width: 32\n  context: 32\n"
                        << "schedule:\n  lr: 0.003\n  warmup_steps: 2\n"
                           "eval:\n  interval: 4\n  batches: 2\n"
                           "checkpoint:\n  interval: 4\n  keep: 5\n"
                           "log:\n  interval: 1\nthreads: 2\n";
  return config.string();
}

}  // namespace

TEST(TokenFilesCli, LlmcShardsTrainEvaluateAndResumeBitwise) {
  const fs::path work = fresh_dir("cli_llmc"), data = work / "fineweb";
  fs::create_directories(data);
  write_llmc(data / "fw_train_000001.bin", 1, shakespeare_ids(0, 30000));
  write_llmc(data / "fw_train_000002.bin", 7, shakespeare_ids(30000, 20000));
  write_llmc(data / "fw_val_000000.bin", 1, shakespeare_ids(50000, 5000));
  const std::string config = tiny_config(work, "data:\n  format: llmc\n  dir: " + data.string() + "\n", 8);

  cli_test::Result r = cli_test::run("train " + config + " run.dir=" + (work / "run").string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "data.format=llmc files carry no vocabulary size: set model.vocab")) << r.output;
  EXPECT_FALSE(fs::exists(work / "run"));

  r = cli_test::run("train " + config + " data.format=nibble run.dir=" + (work / "run").string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "is not a `nibble prepare` directory (it has no prepare.json or tokenizer.json): for "
                                 "llm.c's .bin shards set data.format=llmc"))
      << r.output;

  r = cli_test::run("train " + config + " model.vocab=256 run.dir=" + (work / "run").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "vocab 256 (llmc token files, no tokenizer)")) << r.output;
  EXPECT_TRUE(contains(r.output, "50000 train tokens, 5000 validation tokens")) << r.output;
  EXPECT_TRUE(contains(r.output, "went to copying windows out of the token files")) << r.output;

  const fs::path run_dir = work / "run";
  r = cli_test::run("eval " + run_dir.string() + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "\"tokens_file\":\"" + (data / "fw_val_000000.bin").string())) << r.output;
  r = cli_test::run("eval " + run_dir.string() + " --tokens " + (data / "fw_train_000002.bin").string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = cli_test::run("generate " + run_dir.string() + " --max-tokens 4");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "which carry no tokenizer")) << r.output;
  r = cli_test::run("export " + run_dir.string() + " --format hf -o " + (work / "exported").string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "which carry no tokenizer, so there is none to export")) << r.output;
  EXPECT_FALSE(fs::exists(work / "exported"));

  // Stopped before step 5 (the step-4 checkpoint written), then resumed: the same run to the bit.
  const fs::path resumed = work / "resumed";
  r = cli_test::run_with_faults("--fault rank_exits=0:5", "train " + config + " model.vocab=256 run.dir=" + resumed.string());
  ASSERT_EQ(r.exit_code, 17) << r.output;
  r = cli_test::run("train " + config + " model.vocab=256 resume=true run.dir=" + resumed.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(cli_test::loss_curve(resumed), cli_test::loss_curve(run_dir));
  EXPECT_EQ(cli_test::file_bytes(resumed / "checkpoints" / "step_00000008" / "model.safetensors"),
            cli_test::file_bytes(run_dir / "checkpoints" / "step_00000008" / "model.safetensors"));
}

TEST(TokenFilesCli, LlmcUint32ShardsByGlobTrain) {
  const fs::path work = fresh_dir("cli_glob"), data = work / "llama";
  fs::create_directories(data);
  write_llmc(data / "a.bin", 7, shakespeare_ids(0, 20000));
  write_llmc(data / "b.bin", 2, shakespeare_ids(20000, 3000));
  const std::string config = tiny_config(work, "data:\n  format: llmc\n  train_files: " + (data / "a*").string() +
                                                   "\n  val_files: " + (data / "b.bin").string() + "\n",
                                         4);
  const cli_test::Result r = cli_test::run("train " + config + " model.vocab=256 run.dir=" + (work / "run").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "20000 train tokens, 3000 validation tokens")) << r.output;
  const std::string saved = cli_test::run_program("cat " + (work / "run" / "config.yaml").string()).output;
  EXPECT_TRUE(contains(saved, "format: \"llmc\"")) << saved;
  EXPECT_TRUE(contains(saved, "vocab: 256")) << saved;
  EXPECT_EQ(cli_test::run("eval " + (work / "run").string()).exit_code, 0);
}

TEST(TokenFilesCli, NanogptFilesTrain) {
  const fs::path work = fresh_dir("cli_nanogpt"), data = work / "shakespeare";
  fs::create_directories(data);
  write_nanogpt(data / "train.bin", shakespeare_ids(0, 20000));
  write_nanogpt(data / "val.bin", shakespeare_ids(20000, 3000));
  const std::string config = tiny_config(work, "data:\n  format: nanogpt\n  dir: " + data.string() + "\n", 4);
  const cli_test::Result r = cli_test::run("train " + config + " model.vocab=256 run.dir=" + (work / "run").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "vocab 256 (nanogpt token files, no tokenizer)")) << r.output;
}

namespace {

// A .tiktoken file whose 256 ranks are the bytes themselves (rank b = the byte b), so that the
// bytes of tinyshakespeare.txt as ids (shakespeare_ids) are its tokens; named r50k_base.tiktoken for
// r50k's pattern, it gets <|endoftext|> = 256: 257 tokens.
fs::path write_byte_ranks(const fs::path& dir) {
  static const char* kBase64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const fs::path file = dir / "r50k_base.tiktoken";
  std::ofstream out(file);
  for (int b = 0; b < 256; ++b) out << kBase64[b >> 2] << kBase64[(b & 3) << 4] << "== " << b << "\n";
  return file;
}

}  // namespace

// data.tokenizer gives llm.c files the tokenizer that wrote them: checked against model.vocab (which
// may be padded beyond it) at start, copied into the run directory, its identity in the checkpoints
// (a resume with another is refused), so generate and export work on the run. Refused with
// data.format=nibble, whose directory has its own.
TEST(TokenFilesCli, LlmcShardsWithTheirTokenizerGenerateAndExport) {
  const fs::path work = fresh_dir("cli_llmc_tokenizer"), data = work / "shards";
  fs::create_directories(data);
  write_llmc(data / "t_train_1.bin", 1, shakespeare_ids(0, 20000));
  write_llmc(data / "t_val_1.bin", 1, shakespeare_ids(20000, 3000));
  const fs::path ranks = write_byte_ranks(work);
  const std::string config = tiny_config(work, "data:\n  format: llmc\n  dir: " + data.string() + "\n  tokenizer: " +
                                                   ranks.string() + "\n", 4);
  const fs::path run_dir = work / "run";
  cli_test::Result r = cli_test::run("train " + config + " model.vocab=256 run.dir=" + run_dir.string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "data.tokenizer " + ranks.string() + " has 257 tokens, more than model.vocab=256"))
      << r.output;
  EXPECT_FALSE(fs::exists(run_dir));
  r = cli_test::run("train " + config + " data.format=nibble run.dir=" + run_dir.string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "data.tokenizer=" + ranks.string() + " is for data.format=llmc or nanogpt")) << r.output;

  r = cli_test::run("train " + config + " model.vocab=320 run.dir=" + run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "vocab 320 (llmc token files, tiktoken tokenizer)")) << r.output;
  EXPECT_EQ(cli_test::file_bytes(run_dir / "tokenizer.tiktoken"), cli_test::file_bytes(ranks));
  EXPECT_TRUE(fs::exists(run_dir / "nibble_tokenizer.json"));
  EXPECT_EQ(cli_test::run("eval " + run_dir.string()).exit_code, 0);
  r = cli_test::run("generate " + run_dir.string() + " --prompt 'To be' --max-tokens 4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "To be")) << r.output;
  r = cli_test::run("export " + run_dir.string() + " --format hf -o " + (work / "exported").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(work / "exported" / "tokenizer.json"));
  EXPECT_EQ(cli_test::file_bytes(work / "exported" / "tokenizer.tiktoken"), cli_test::file_bytes(ranks));

  // Another tokenizer of the same size (two ranks swapped) on resume: other ids, refused.
  std::string swapped = read_text_file(ranks.string());
  swapped.replace(swapped.find("QQ== 65"), 7, "QQ== 66").replace(swapped.find("Qg== 66"), 7, "Qg== 65");
  const fs::path other = work / "other" / "r50k_base.tiktoken";
  fs::create_directories(other.parent_path());
  std::ofstream(other) << swapped;
  r = cli_test::run("train " + config + " model.vocab=320 steps=8 resume=true schedule.rewarm=true data.tokenizer=" + other.string() +
                    " run.dir=" + run_dir.string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "was trained with another tokenizer")) << r.output;
  r = cli_test::run("train " + config + " model.vocab=320 steps=8 resume=true schedule.rewarm=true run.dir=" + run_dir.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(TokenFilesCli, BadFilesAreRefusedWithExit2NamingTheFile) {
  const fs::path work = fresh_dir("cli_bad"), data = work / "bad";
  fs::create_directories(data);
  std::vector<int32_t> ids = shakespeare_ids(0, 5000);
  write_llmc(data / "x_train_1.bin", 1, ids, std::nullopt, 12345);
  write_llmc(data / "x_val_1.bin", 1, ids);
  const std::string config = tiny_config(work, "data:\n  format: llmc\n  dir: " + data.string() + "\n", 4);
  auto refusal = [&](const std::string& expected) {
    const cli_test::Result r = cli_test::run("train " + config + " model.vocab=256 run.dir=" + (work / "run").string());
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(contains(r.output, expected)) << r.output;
    EXPECT_FALSE(fs::exists(work / "run"));
  };
  refusal((data / "x_train_1.bin").string() + ": not a usable llm.c token shard: header[0] (magic) is 12345");
  write_llmc(data / "x_train_1.bin", 3, ids);
  refusal("header[1] (version) is 3, which magic 20240520 does not have");
  write_llmc(data / "x_train_1.bin", 1, ids, 6000);
  refusal("header[2] (token count) says 6000 tokens");
  ids[4000] = 256;
  write_llmc(data / "x_train_1.bin", 2, ids);
  refusal((data / "x_train_1.bin").string() + ": token 256 at position 4000 (byte offset 17024)");
  const cli_test::Result keys = cli_test::run("train --keys");
  for (const char* key : {"data.format", "data.train_files", "data.val_files", "data.tokenizer", "model.vocab"})
    EXPECT_TRUE(contains(keys.output, key)) << keys.output;
}

// A 3 GB llm.c shard (1.5 billion tokens; sparse, so it takes little disk) trains under an address-
// space limit that leaves room for its mapping but not for a copy of it (the file's bytes plus its
// tokens as int32 would need 9 GB), and the process's resident memory stays far below the shard's size.
TEST(TokenFilesCli, CorpusBeyondTheAddressSpaceLimitTrains) {
  const fs::path work = fresh_dir("cli_large"), data = work / "large";
  fs::create_directories(data);
  const uint64_t tokens = 1500000000;  // < 2^31: llm.c's header holds an int32 count
  write_llmc(data / "big_val_000000.bin", 1, shakespeare_ids(0, 5000));
  write_llmc(data / "big_train_000001.bin", 1, {}, static_cast<int64_t>(tokens));
  {
    // Text every 256 MiB, zeros (token 0, a valid id) between: written in chunks, never whole.
    std::fstream f(data / "big_train_000001.bin", std::ios::in | std::ios::out | std::ios::binary);
    const std::vector<int32_t> text = shakespeare_ids(10000, 1 << 16);
    std::vector<uint16_t> chunk(text.begin(), text.end());
    for (uint64_t at = 1024; at + chunk.size() * 2 < 1024 + tokens * 2; at += uint64_t{256} << 20) {
      f.seekp(static_cast<std::streamoff>(at));
      f.write(reinterpret_cast<const char*>(chunk.data()), static_cast<std::streamsize>(chunk.size() * 2));
    }
  }
  fs::resize_file(data / "big_train_000001.bin", 1024 + tokens * 2);
  const std::string config = tiny_config(work, "data:\n  format: llmc\n  dir: " + data.string() + "\n", 4);
  // 3 GB of mapping + 2.5 GB for the process (its libraries, threads' arenas, the tiny model).
  const cli_test::Result r = cli_test::run("train " + config + " model.vocab=50257 run.dir=" + (work / "run").string(),
                                           "ulimit -v 5500000;");
  fs::remove(data / "big_train_000001.bin");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "1500000000 train tokens")) << r.output;
  rusage usage{};
  ASSERT_EQ(getrusage(RUSAGE_CHILDREN, &usage), 0);
  EXPECT_LT(usage.ru_maxrss, 1024 * 1024) << "peak RSS of a child in KiB";  // < 1 GiB for a 3 GB shard
}

// A shard truncated under a running trainer: the fault is named, exit 2, not a bare "Bus error".
TEST(TokenFilesCli, AShardTruncatedWhileTrainingIsNamed) {
  const fs::path work = fresh_dir("cli_truncated"), data = work / "data";
  fs::create_directories(data);
  write_llmc(data / "t_train_1.bin", 1, shakespeare_ids(0, 400000));
  write_llmc(data / "t_val_1.bin", 1, shakespeare_ids(400000, 5000));
  const std::string config = tiny_config(work, "data:\n  format: llmc\n  dir: " + data.string() + "\n", 100000000);
  const std::string log = (work / "log.txt").string();
  // Train in the background; once steps run, cut the shard to its header and wait for the trainer.
  const cli_test::Result r = cli_test::run_program(
      "bash -c '" + std::string(NIBBLE_BINARY_DIR) + "/nibble train " + config + " model.vocab=256 eval.interval=100000000 run.dir=" +
      (work / "run").string() + " > " + log + " 2>&1 & pid=$!; until grep -q \"step  *2/\" " + log +
      "; do kill -0 $pid || break; sleep 0.1; done; truncate -s 1024 " + (data / "t_train_1.bin").string() +
      "; wait $pid; echo exit=$?; cat " + log + "'");
  EXPECT_TRUE(contains(r.output, "exit=2")) << r.output;
  EXPECT_TRUE(contains(r.output, "a memory-mapped token file was truncated (or its disk failed) while nibble read it "
                                 "(SIGBUS)"))
      << r.output;
}
