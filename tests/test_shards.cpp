// Token shards: the binary format, its refusals, and `nibble prepare`'s data directory.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "data/data.h"
#include "data/shards.h"
#include "support/check.h"
#include "support/temp_dir.h"

using namespace nibble;
using namespace nibble::train;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) { return nibble_test::fresh_dir("test_shards", name); }

using nibble_test::error_of;

}  // namespace

TEST(Shards, RoundTripInTwoAndFourBytesPerToken) {
  const std::vector<int32_t> small = {0, 5, 64, 3, 64};
  auto bytes = serialize_token_shard(small, 65);
  EXPECT_EQ(bytes.size(), kShardHeaderBytes + 2 * small.size());
  EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 8), "NIBTOKNS");
  auto back = parse_token_shard(bytes, "mem");
  EXPECT_EQ(back.vocab_size, 65);
  EXPECT_EQ(back.tokens, small);

  const std::vector<int32_t> large = {0, 70000, 99999};
  bytes = serialize_token_shard(large, 100000);
  EXPECT_EQ(bytes.size(), kShardHeaderBytes + 4 * large.size());
  EXPECT_EQ(parse_token_shard(bytes, "mem").tokens, large);

  const fs::path dir = fresh_dir("roundtrip");
  write_token_shard(dir / "t.bin", small, 65);
  EXPECT_EQ(read_token_shard(dir / "t.bin").tokens, small);
}

TEST(Shards, DamagedFilesAreRefusedNamingTheProblem) {
  const auto good = serialize_token_shard(std::vector<int32_t>{1, 2, 3, 4}, 10);
  auto damaged = [&](auto edit) {
    auto b = good;
    edit(b);
    return error_of([&] { parse_token_shard(b, "shard.bin"); });
  };
  EXPECT_NE(damaged([](auto& b) { b.resize(10); }).find("shorter than"), std::string::npos);
  EXPECT_NE(damaged([](auto& b) { b[0] = 'X'; }).find("magic"), std::string::npos);
  EXPECT_NE(damaged([](auto& b) { b[8] = 9; }).find("version 9"), std::string::npos);
  EXPECT_NE(damaged([](auto& b) { b[12] = 4; }).find("bytes per token"), std::string::npos);
  EXPECT_NE(damaged([](auto& b) { b.pop_back(); }).find("header says 4 tokens"), std::string::npos);
  EXPECT_NE(damaged([](auto& b) { b.push_back(0); }).find("header says 4 tokens"), std::string::npos);
  EXPECT_NE(damaged([](auto& b) { b[31] = 0x7F; }).find("header says"), std::string::npos);  // absurd count
  EXPECT_NE(damaged([](auto& b) { b[kShardHeaderBytes] = 10; }).find("token 10 at position 0"), std::string::npos);
  EXPECT_NE(damaged([](auto& b) { for (int i = 16; i < 24; ++i) b[i] = 0; }).find("vocabulary size 0"), std::string::npos);
  EXPECT_NE(damaged([](auto&) {}).find("(no error)"), std::string::npos);
  EXPECT_THROW(serialize_token_shard(std::vector<int32_t>{10}, 10), UsageError);
  EXPECT_NE(error_of([] { read_token_shard("/nonexistent/x.bin"); }).find("/nonexistent/x.bin"), std::string::npos);
}

TEST(Shards, PrepareWritesANinetyTenSplitTheTrainerReadsBack) {
  const fs::path dir = fresh_dir("prepare");
  std::string text = read_text_file(std::string(NIBBLE_SOURCE_DIR) + "/data/tinyshakespeare.txt").substr(0, 20000);
  std::ofstream(dir / "corpus.txt") << text;
  PrepareOptions o;
  o.inputs = {dir / "corpus.txt"};
  o.output_dir = dir / "data";
  const auto r = prepare_dataset(o);
  EXPECT_EQ(r.train_tokens + r.val_tokens, 20000);
  EXPECT_EQ(r.train_tokens, 18000);
  Dataset d = load_dataset(o.output_dir);
  EXPECT_EQ(d.tokenizer->decode(d.corpus()), text);
  EXPECT_EQ(split_tokens(d.corpus()).train, d.train.to_vector());

  // Shards from different prepare runs do not mix.
  write_token_shard(o.output_dir / "val-00000.bin", std::vector<int32_t>{1, 2, 3}, 99);
  EXPECT_NE(error_of([&] { load_dataset(o.output_dir); }).find("different `nibble prepare` runs"), std::string::npos);
  EXPECT_NE(error_of([&] { load_dataset(dir / "missing"); }).find("nibble prepare"), std::string::npos);
  o.inputs = {dir / "nope.txt"};
  EXPECT_THROW(prepare_dataset(o), UsageError);
}

// prepare.json records every file's size and checksum; readers check each file against it, and a
// directory without the record (an earlier nibble's) is read unverified.
TEST(Shards, EveryFileIsCheckedAgainstPrepareJson) {
  const fs::path dir = fresh_dir("manifest");
  std::ofstream(dir / "corpus.txt") << read_text_file(std::string(NIBBLE_SOURCE_DIR) + "/data/tinyshakespeare.txt").substr(0, 5000);
  PrepareOptions o;
  o.inputs = {dir / "corpus.txt"};
  o.output_dir = dir / "data";
  prepare_dataset(o);
  const fs::path d = o.output_dir;
  const std::string record = read_text_file((d / "prepare.json").string());
  EXPECT_NE(record.find("\"train-00000.bin\""), std::string::npos) << record;
  EXPECT_NE(record.find("xxh3-64:"), std::string::npos) << record;
  EXPECT_EQ(load_dataset(d).train.size(), 4500u);

  const std::string shard = read_text_file((d / "val-00000.bin").string());
  std::string changed = shard;
  char& last_token = changed[changed.size() - 2];  // its low byte: still a token of the vocabulary
  last_token = static_cast<char>(last_token == 1 ? 2 : 1);
  std::ofstream(d / "val-00000.bin", std::ios::binary) << changed;
  EXPECT_NE(error_of([&] { load_dataset(d); }).find("val-00000.bin: 1032 bytes with checksum"), std::string::npos)
      << error_of([&] { load_dataset(d); });
  EXPECT_NE(error_of([&] { read_token_shard(d / "val-00000.bin"); }).find("prepare.json records 1032 bytes"), std::string::npos);
  std::ofstream(d / "val-00000.bin", std::ios::binary) << shard;
  std::ofstream(d / "tokenizer.model") << "a file prepare did not write";
  EXPECT_NE(error_of([&] { load_dataset(d); }).find("prepare.json does not list this file"), std::string::npos);
  fs::remove(d / "tokenizer.model");
  fs::remove(d / "train-00000.bin");
  EXPECT_NE(error_of([&] { load_dataset(d); }).find("missing, though prepare.json lists it"), std::string::npos);

  // An earlier nibble's directory: train.bin and val.bin, a record without "files" or "shards".
  prepare_dataset([&] { PrepareOptions f = o; f.force = true; return f; }());
  fs::rename(d / "train-00000.bin", d / "train.bin");
  fs::remove(d / "val-00000.bin");
  std::ofstream(d / "prepare.json") << "{\"tokenizer\": \"char\", \"vocab_size\": 60}\n";
  std::ofstream(d / "val.bin", std::ios::binary) << changed;
  EXPECT_EQ(load_dataset(d).val.to_vector().back(), static_cast<int32_t>(changed[changed.size() - 2]));
  EXPECT_EQ(load_dataset(d).train.size(), 4500u);
  DataSpec spec;
  spec.dir = d;
  EXPECT_EQ(list_token_files(spec).val, std::vector<fs::path>{d / "val.bin"});
  std::ofstream(d / "prepare.json") << "{\"files\": {\"../../etc/passwd\": {\"bytes\": 1, \"checksum\": \"x\"}}}\n";
  EXPECT_NE(error_of([&] { load_dataset(d); }).find("its \"files\" record is damaged"), std::string::npos);
  EXPECT_NE(error_of([&] { read_token_shard("/dev/zero"); }).find("/dev/zero is a device, not a token shard"),
            std::string::npos);
}
