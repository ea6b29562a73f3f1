// `nibble prepare` on the files people have (data/prepare_inputs.h, data/prepare.cpp): JSON lines
// plain, .gz and .zst read as the same documents as text files; directories and glob patterns;
// many shards read back in order; the per-source validation split and --val; every bad input
// refused with its file and line or offset, exit 2 and nothing written; and memory bounded by the
// batch, not the corpus (the child's peak RSS).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.h"
#include "data/data.h"
#include "data/shards.h"
#include "support/check.h"
#include "support/cli.h"
#include "support/temp_dir.h"

using namespace nibble;
using namespace nibble::train;
namespace fs = std::filesystem;
using nibble_test::error_of;

namespace {

fs::path fresh(const std::string& name) { return nibble_test::fresh_dir("test_prepare_inputs", name); }

void write(const fs::path& file, const std::string& bytes) { std::ofstream(file, std::ios::binary) << bytes; }

std::string gzip(const std::string& text) {
  z_stream z{};
  deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);  // +16: a gzip header
  std::string out(deflateBound(&z, text.size()) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = static_cast<uInt>(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string zstd(const std::string& text) {
  std::string out(ZSTD_compressBound(text.size()), '\0');
  out.resize(ZSTD_compress(out.data(), out.size(), text.data(), text.size(), 3));
  return out;
}

// The tiny byte-level BPE of test_huggingface_tokenizer.cpp: h e l o Ġ w r d, merges up to
// "hello" and "Ġw", <|endoftext|> = 14.
std::string tokenizer_json() {
  return R"({"version":"1.0","truncation":null,"padding":null,"added_tokens":[{"id":14,"content":"<|endoftext|>",)"
         R"("single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],"normalizer":null,)"
         R"("pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},)"
         R"("post_processor":null,"decoder":null,"model":{"type":"BPE","dropout":null,"unk_token":null,)"
         R"("fuse_unk":false,"byte_fallback":false,"vocab":{"h":0,"e":1,"l":2,"o":3,"Ġ":4,"w":5,"r":6,"d":7,)"
         R"("he":8,"ll":9,"llo":10,"hello":11,"Ġw":12,"or":13},"merges":["h e","l l","ll o","he llo","Ġ w","o r"]}})";
}

std::string shakespeare(size_t characters) {
  return read_text_file(std::string(NIBBLE_SOURCE_DIR) + "/data/tinyshakespeare.txt").substr(0, characters);
}

std::string jsonl(const std::vector<std::string>& documents) {
  std::string out;
  for (const auto& d : documents) out += nlohmann::json{{"id", out.size()}, {"text", d}}.dump() + "\n";
  return out;
}

PrepareOptions options(const std::vector<fs::path>& inputs, const fs::path& out) {
  PrepareOptions o;
  o.inputs = inputs;
  o.output_dir = out;
  o.progress = false;
  return o;
}

nlohmann::json record_of(const fs::path& dir) { return nlohmann::json::parse(read_text_file((dir / "prepare.json").string())); }

std::vector<std::string> source_paths(const fs::path& dir) {
  std::vector<std::string> paths;
  const nlohmann::json record = record_of(dir);
  for (const auto& s : record["sources"]) paths.push_back(s["path"].get<std::string>());
  return paths;
}

}  // namespace

// With a tokenizer file each JSON line is a document, as each text file is: the same documents
// give the same shards whether they come as text files or as JSON lines, plain, gzip or zstd.
TEST(PrepareInputs, JsonLinesPlainGzipAndZstdGiveTheShardsOfTheSameTextFiles) {
  const fs::path dir = fresh("jsonl");
  write(dir / "tokenizer.json", tokenizer_json());
  const std::vector<std::string> docs = {"hello world", "world hello hello\nhello", "held word", "hello hello world"};
  std::vector<fs::path> texts;
  for (size_t i = 0; i < docs.size(); ++i) write(texts.emplace_back(dir / fmt::format("doc{}.txt", i)), docs[i]);
  write(dir / "val.txt", "hello world hello world");
  write(dir / "docs.jsonl", jsonl(docs));
  write(dir / "docs.jsonl.gz", gzip(jsonl(docs)));
  write(dir / "docs.ndjson.zst", zstd(jsonl(docs)));
  auto prepared = [&](std::vector<fs::path> inputs, const std::string& name) {
    PrepareOptions o = options(inputs, dir / name);
    o.tokenizer_file = dir / "tokenizer.json";
    o.val_inputs = {dir / "val.txt"};
    const auto r = prepare_dataset(o);
    EXPECT_EQ(r.documents, 5) << name;  // four and the validation one
    return load_dataset(dir / name).train.to_vector();
  };
  const std::vector<int32_t> from_text = prepared(texts, "text");
  EXPECT_EQ(std::count(from_text.begin(), from_text.end(), 14), 4);  // each document ends with <|endoftext|>
  EXPECT_EQ(from_text.back(), 14);
  EXPECT_EQ(prepared({dir / "docs.jsonl"}, "jsonl"), from_text);
  EXPECT_EQ(prepared({dir / "docs.jsonl.gz"}, "gz"), from_text);
  EXPECT_EQ(prepared({dir / "docs.ndjson.zst"}, "zst"), from_text);
  // A .gz of several members (files concatenated with cat) reads as their concatenation.
  write(dir / "two.jsonl.gz", gzip(jsonl({docs[0], docs[1]})) + gzip(jsonl({docs[2], docs[3]})));
  EXPECT_EQ(prepared({dir / "two.jsonl.gz"}, "members"), from_text);
  // --field picks another field; text .txt.zst is text.
  write(dir / "other.jsonl", "{\"body\": \"hello world\"}\n\n{\"body\": \"held\"}\n");
  PrepareOptions o = options({dir / "other.jsonl"}, dir / "field");
  o.tokenizer_file = dir / "tokenizer.json";
  o.val_inputs = {dir / "val.txt"};
  o.field = "body";
  EXPECT_EQ(prepare_dataset(o).documents, 3);
  write(dir / "doc0.txt.zst", zstd(docs[0]));
  o = options({dir / "doc0.txt.zst", texts[1], texts[2], texts[3]}, dir / "txt-zst");
  o.tokenizer_file = dir / "tokenizer.json";
  o.val_inputs = {dir / "val.txt"};
  prepare_dataset(o);
  EXPECT_EQ(load_dataset(dir / "txt-zst").train.to_vector(), from_text);
}

// char and bpe: a JSON line's text followed by a line break, as the line of a text file.
TEST(PrepareInputs, JsonLinesForTrainedTokenizersAreTheirTextsEachFollowedByALineBreak) {
  const fs::path dir = fresh("jsonl-char");
  const std::string text = shakespeare(6000);
  std::vector<std::string> docs;
  std::string joined;
  for (size_t at = 0; at < text.size(); at += 500) docs.push_back(text.substr(at, 500)), joined += docs.back() + "\n";
  write(dir / "docs.jsonl.zst", zstd(jsonl(docs)));
  write(dir / "joined.txt", joined);
  for (const char* kind : {"char", "bpe"}) {
    PrepareOptions a = options({dir / "docs.jsonl.zst"}, dir / (std::string(kind) + "-jsonl"));
    PrepareOptions b = options({dir / "joined.txt"}, dir / (std::string(kind) + "-text"));
    a.tokenizer = b.tokenizer = parse_tokenizer_kind(kind);
    a.bpe_vocab_size = b.bpe_vocab_size = 400;
    prepare_dataset(a);
    prepare_dataset(b);
    EXPECT_EQ(load_dataset(a.output_dir).corpus(), load_dataset(b.output_dir).corpus()) << kind;
    EXPECT_EQ(load_dataset(a.output_dir).tokenizer->decode(load_dataset(a.output_dir).corpus()), joined) << kind;
  }
}

// BPE encodes a text in pieces cut after a line break or before a space (batches): the ids are
// those of encoding the whole text at once, as prepare always did.
TEST(PrepareInputs, BpeInPiecesGivesTheIdsOfTheWholeText) {
  const fs::path dir = fresh("bpe-pieces");
  const std::string text = shakespeare(60000);
  write(dir / "corpus.txt", text);
  PrepareOptions o = options({dir / "corpus.txt"}, dir / "data");
  o.tokenizer = TokenizerKind::bpe;
  o.bpe_vocab_size = 600;
  o.batch_bytes = 16 * 1024;  // pieces of 4 KiB
  prepare_dataset(o);
  const Dataset d = load_dataset(o.output_dir);
  EXPECT_EQ(d.corpus(), d.tokenizer->encode(text));
  EXPECT_EQ(split_tokens(d.corpus()).train, d.train.to_vector());
}

TEST(PrepareInputs, DirectoriesAndGlobPatterns) {
  const fs::path dir = fresh("dirs");
  const fs::path in = dir / "in";
  fs::create_directories(in / "sub");
  fs::create_directories(in / ".hidden");
  const std::string text = shakespeare(8000);
  write(in / "b.txt", text.substr(0, 2000));
  write(in / "a.jsonl", jsonl({text.substr(2000, 2000)}));
  write(in / "sub" / "c.txt.gz", gzip(text.substr(4000, 2000)));
  write(in / "sub" / "d.md", text.substr(6000, 2000));
  write(in / ".skip.txt", "hidden");
  write(in / ".hidden" / "e.txt", "hidden");
  write(in / "notes.bin", "not text");
  prepare_dataset(options({in}, dir / "from-dir"));
  EXPECT_EQ(source_paths(dir / "from-dir"),
            (std::vector<std::string>{(in / "a.jsonl").string(), (in / "b.txt").string(),
                                      (in / "sub" / "c.txt.gz").string(), (in / "sub" / "d.md").string()}));
  prepare_dataset(options({in / "sub" / "*.*", in / "?.txt"}, dir / "from-glob"));
  EXPECT_EQ(source_paths(dir / "from-glob"),
            (std::vector<std::string>{(in / "sub" / "c.txt.gz").string(), (in / "sub" / "d.md").string(),
                                      (in / "b.txt").string()}));
  EXPECT_EQ(record_of(dir / "from-glob")["characters"], 6000);
  fs::create_directories(dir / "empty" / "sub");
  write(dir / "empty" / "x.bin", "x");
  EXPECT_TRUE(cli_test::contains(error_of([&] { prepare_dataset(options({dir / "empty"}, dir / "o1")); }),
                                 "holds no file prepare reads"));
  EXPECT_TRUE(cli_test::contains(error_of([&] { prepare_dataset(options({in / "*.nothing"}, dir / "o2")); }),
                                 "*.nothing' matches no file"));
  // A data directory's files are no corpus (nor a run's metrics.jsonl: test_train_cli).
  EXPECT_TRUE(cli_test::contains(error_of([&] { prepare_dataset(options({dir / "from-dir"}, dir / "o3")); }),
                                 "from-dir' is the data directory"));
  EXPECT_FALSE(fs::exists(dir / "o1"));
  EXPECT_FALSE(fs::exists(dir / "o2"));
}

// Shards of at most --shard-tokens tokens, listed in order in prepare.json, are read back as one
// stream: the same tokens as one shard each.
TEST(PrepareInputs, ManyShardsAreReadInOrderAsOne) {
  const fs::path dir = fresh("shards");
  write(dir / "corpus.txt", shakespeare(20000));
  prepare_dataset(options({dir / "corpus.txt"}, dir / "one"));
  PrepareOptions o = options({dir / "corpus.txt"}, dir / "many");
  o.shard_tokens = 1000;
  const auto r = prepare_dataset(o);
  ASSERT_EQ(r.train_shards.size(), 18u);
  ASSERT_EQ(r.val_shards.size(), 2u);
  EXPECT_EQ(r.train_shards[17].file, "train-00017.bin");
  const auto shards = record_of(dir / "many")["shards"];
  EXPECT_EQ(shards["train"][3]["file"], "train-00003.bin");
  EXPECT_EQ(shards["train"][3]["tokens"], 1000);
  EXPECT_TRUE(record_of(dir / "many")["files"].contains("val-00001.bin"));
  const Dataset one = load_dataset(dir / "one"), many = load_dataset(dir / "many");
  EXPECT_EQ(many.train.to_vector(), one.train.to_vector());
  EXPECT_EQ(many.val.to_vector(), one.val.to_vector());
  const std::vector<int32_t> all = one.train.to_vector();
  EXPECT_EQ(read_token_shard(dir / "many" / "train-00001.bin").tokens, std::vector<int32_t>(all.begin() + 1000, all.begin() + 2000));
  // A shard swapped with another of the same size is caught by the checksums; one not listed is refused.
  fs::copy_file(dir / "many" / "train-00000.bin", dir / "many" / "train-00018.bin");
  EXPECT_TRUE(cli_test::contains(error_of([&] { load_dataset(dir / "many"); }), "prepare.json does not list this file"));
  fs::remove(dir / "many" / "train-00018.bin");
  fs::copy_file(dir / "many" / "train-00000.bin", dir / "many" / "train-00001.bin", fs::copy_options::overwrite_existing);
  EXPECT_TRUE(cli_test::contains(error_of([&] { load_dataset(dir / "many"); }), "train-00001.bin: 2032 bytes with checksum"));
}

// --val-fraction F: the last F of each source's tokens validate; --val FILE: those files validate
// and no input is split.
TEST(PrepareInputs, ValidationIsTheEndOfEachSourceOrTheValFiles) {
  const fs::path dir = fresh("split");
  const std::string text = shakespeare(4000);
  write(dir / "a.txt", text.substr(0, 1000));
  write(dir / "b.txt", text.substr(1000, 3000));
  PrepareOptions o = options({dir / "a.txt", dir / "b.txt"}, dir / "fraction");
  o.val_fraction = 0.25;
  const auto r = prepare_dataset(o);
  EXPECT_EQ(r.train_tokens, 750 + 2250);
  const Dataset d = load_dataset(o.output_dir);
  const std::string train = text.substr(0, 750) + text.substr(1000, 2250), val = text.substr(750, 250) + text.substr(3250);
  EXPECT_EQ(d.tokenizer->decode(d.train.to_vector()), train);
  EXPECT_EQ(d.tokenizer->decode(d.val.to_vector()), val);
  EXPECT_EQ(record_of(o.output_dir)["sources"][1]["val_tokens"], 750);

  write(dir / "v.txt", text.substr(0, 300));
  o = options({dir / "a.txt", dir / "b.txt"}, dir / "val-files");
  o.val_inputs = {dir / "v.txt"};
  prepare_dataset(o);
  const Dataset v = load_dataset(o.output_dir);
  EXPECT_EQ(v.tokenizer->decode(v.train.to_vector()), text);
  EXPECT_EQ(v.tokenizer->decode(v.val.to_vector()), text.substr(0, 300));

  o = options({dir / "a.txt"}, dir / "none");
  o.val_fraction = 0;
  EXPECT_TRUE(cli_test::contains(error_of([&] { prepare_dataset(o); }), "leaves no validation data"));
  EXPECT_FALSE(fs::exists(dir / "none"));
}

namespace {

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

// `nibble prepare ARGS -o DIR/out`: exit 2, the message holding each of `parts`, and nothing
// left in DIR but what was there.
void expect_refused(const fs::path& dir, const std::string& args, const std::vector<std::string>& parts) {
  const auto before = std::distance(fs::directory_iterator(dir), fs::directory_iterator());
  const cli_test::Result r = cli_test::run("prepare " + args + " -o " + q(dir / "out") + " --quiet");
  EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
  for (const auto& part : parts) EXPECT_TRUE(cli_test::contains(r.output, part)) << args << ": " << part << "\n" << r.output;
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), before) << args << "\n" << r.output;
}

}  // namespace

TEST(PrepareInputsCli, EveryBadInputIsNamedWithItsLineOrOffsetAndNothingIsWritten) {
  const fs::path dir = fresh("bad");
  write(dir / "tokenizer.json", tokenizer_json());
  const std::string tok = " --tokenizer " + q(dir / "tokenizer.json");
  const std::string good = jsonl({"hello world", "world hello"});
  write(dir / "latin1.txt", "hello w\xE9rld hello");
  expect_refused(dir, q(dir / "latin1.txt") + " --tokenizer bpe --vocab-size 300", {"latin1.txt", "0xE9 at offset 7", "iconv"});
  expect_refused(dir, q(dir / "latin1.txt") + tok, {"latin1.txt", "0xE9 at offset 7", "iconv"});
  write(dir / "broken.jsonl", good + "{\"text\": \"hello\n");
  expect_refused(dir, q(dir / "broken.jsonl") + tok, {"broken.jsonl: line 3: not a JSON object"});
  write(dir / "nofield.jsonl", good + "{\"body\": \"hello\"}\n");
  expect_refused(dir, q(dir / "nofield.jsonl") + tok, {"nofield.jsonl: line 3", "no \"text\" field", "--field", "body"});
  write(dir / "number.jsonl", "{\"text\": 12}\n");
  expect_refused(dir, q(dir / "number.jsonl") + tok, {"number.jsonl: line 1", "is number, not a string"});
  write(dir / "badutf8.jsonl", good + "{\"text\": \"h\xFFllo\"}\n");
  expect_refused(dir, q(dir / "badutf8.jsonl") + tok, {"badutf8.jsonl: line 3", "0xFF", "UTF-8"});
  std::string big;
  for (int i = 0; i < 2000; ++i) big += "{\"text\": \"hello world " + std::to_string(i) + "\"}\n";
  const std::string gz = gzip(big), zs = zstd(big);
  write(dir / "cut.jsonl.gz", gz.substr(0, gz.size() / 2));
  expect_refused(dir, q(dir / "cut.jsonl.gz") + tok, {"cut.jsonl.gz: the gzip data is truncated", "gzip -t"});
  write(dir / "cut.jsonl.zst", zs.substr(0, zs.size() / 2));
  expect_refused(dir, q(dir / "cut.jsonl.zst") + tok, {"cut.jsonl.zst: the zstd data is truncated", "zstd -t"});
  std::string damaged = gz;
  for (size_t i = 20; i < 60; ++i) damaged[i] = static_cast<char>(~damaged[i]);
  write(dir / "bad.jsonl.gz", damaged);
  expect_refused(dir, q(dir / "bad.jsonl.gz") + tok, {"bad.jsonl.gz: corrupt gzip data near byte"});
  damaged = zs;
  for (size_t i = 10; i < damaged.size(); i += 7) damaged[i] = static_cast<char>(~damaged[i]);
  write(dir / "bad.jsonl.zst", damaged);
  expect_refused(dir, q(dir / "bad.jsonl.zst") + tok, {"bad.jsonl.zst: corrupt zstd data"});
  write(dir / "plain.txt.gz", "this is not gzip at all");
  expect_refused(dir, q(dir / "plain.txt.gz"), {"plain.txt.gz: corrupt gzip data"});
  fs::create_directories(dir / "nothing");
  expect_refused(dir, q(dir / "nothing"), {"nothing' holds no file prepare reads"});
  expect_refused(dir, q(dir / "*.none"), {"*.none' matches no file"});
  write(dir / "empty.txt", "");
  expect_refused(dir, q(dir / "empty.txt"), {"the input text is empty"});
  write(dir / "blank.jsonl", "\n\n");
  expect_refused(dir, q(dir / "blank.jsonl") + tok, {"the input text is empty"});
  ASSERT_EQ(::mkfifo((dir / "pipe").c_str(), 0600), 0);
  expect_refused(dir, q(dir / "pipe"), {"pipe' is a pipe, not a file", "reads the corpus twice"});
  expect_refused(dir, q(dir / "latin1.txt") + " --val-fraction 0", {"--val-fraction 0 leaves no validation data", "--val"});
}

// `nibble ARGS`'s exit status and peak RSS in MiB, measured in a child process of its own (the
// largest RSS of the children it waited for: only this command's).
std::pair<int, double> exit_and_peak_mb(const std::string& args) {
  int fds[2];
  if (::pipe(fds) != 0) return {-1, 0};
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int code = cli_test::run(args).exit_code;
    rusage usage{};
    getrusage(RUSAGE_CHILDREN, &usage);
    const double result[2] = {static_cast<double>(code), static_cast<double>(usage.ru_maxrss) / 1024};  // KiB -> MiB
    (void)!::write(fds[1], result, sizeof result);
    ::_exit(0);
  }
  ::close(fds[1]);
  double result[2] = {-1, 0};
  (void)!::read(fds[0], result, sizeof result);
  ::close(fds[0]);
  ::waitpid(pid, nullptr, 0);
  return {static_cast<int>(result[0]), result[1]};
}

// Memory is bounded by the batch, not the corpus: 160 MiB of text (many times the batch) prepare
// with a peak RSS within a bound of the same command's on 1 MiB (what the program itself takes:
// its libraries, a CUDA build's among them, are not the corpus's).
TEST(PrepareInputsCli, MemoryStaysBoundedWhateverTheCorpusSize) {
  const fs::path dir = fresh("memory");
  const std::string text = shakespeare(1 << 20);
  {
    std::ofstream out(dir / "big.txt", std::ios::binary);
    for (int i = 0; i < 160; ++i) out << text;  // 160 MiB
    std::ofstream(dir / "small.txt", std::ios::binary) << text;
  }
  const std::string options = " --batch-mb 2 --shard-tokens 50000000";
  const auto [small_code, small_mb] = exit_and_peak_mb("prepare " + q(dir / "small.txt") + " -o " + q(dir / "small") + options);
  ASSERT_EQ(small_code, 0);
  const auto [code, peak_mb] = exit_and_peak_mb("prepare " + q(dir / "big.txt") + " -o " + q(dir / "data") + options);
  ASSERT_EQ(code, 0);
  std::printf("peak RSS of prepare: %.1f MiB on a 160 MiB corpus, %.1f MiB on 1 MiB\n", peak_mb, small_mb);
  EXPECT_LT(peak_mb - small_mb, 48) << "peak RSS of prepare: " << peak_mb << " MiB on a 160 MiB corpus, " << small_mb
                                    << " MiB on 1 MiB";
  const auto record = record_of(dir / "data");
  EXPECT_EQ(record["train_tokens"].get<int64_t>() + record["val_tokens"].get<int64_t>(), int64_t{160} << 20);
  EXPECT_EQ(record["shards"]["train"].size(), 4u);  // 151 M tokens in shards of 50 M
  fs::remove(dir / "big.txt");
}

// A run trained on a directory of many shards evaluates, by default, on all its validation shards
// in order: the loss of the single shard of the same tokens.
TEST(PrepareInputsCli, TrainAndEvalReadEveryShardInOrder) {
  const fs::path dir = fresh("train-eval");
  write(dir / "corpus.txt", shakespeare(60000));
  ASSERT_EQ(cli_test::run("prepare " + q(dir / "corpus.txt") + " -o " + q(dir / "one") + " --quiet").exit_code, 0);
  const cli_test::Result p =
      cli_test::run("prepare " + q(dir / "corpus.txt") + " -o " + q(dir / "many") + " --quiet --shard-tokens 2500");
  ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_TRUE(cli_test::contains(p.output, "train-00000.bin ... train-00021.bin (22 shards), val-00000.bin ... "
                                           "val-00002.bin (3 shards)"))
      << p.output;
  std::ofstream(dir / "tiny.yaml") << "steps: 4\nbatch: 2\nquantization: nvfp4\n"
                                   << "model:\n  layers: 1\n  heads: 2\n  width: 32\n  context: 32\n"
                                   << "schedule:\n  warmup_steps: 2\neval:\n  interval: 4\n  batches: 2\ncheckpoint:\n  interval: 4\nthreads: 2\n";
  const cli_test::Result t = cli_test::run("train " + q(dir / "tiny.yaml") + " data.dir=" + q(dir / "many") +
                                           " run.dir=" + q(dir / "run"));
  ASSERT_EQ(t.exit_code, 0) << t.output;
  const cli_test::Result all = cli_test::run("eval " + q(dir / "run") + " --json");
  const cli_test::Result single = cli_test::run("eval " + q(dir / "run") + " --json --tokens " + q(dir / "one" / "val-00000.bin"));
  ASSERT_EQ(all.exit_code, 0) << all.output;
  ASSERT_EQ(single.exit_code, 0) << single.output;
  const auto loss = [](const std::string& out) { return nlohmann::json::parse(out.substr(out.find('{')))["loss"].dump(); };
  EXPECT_EQ(loss(all.output), loss(single.output));
}
