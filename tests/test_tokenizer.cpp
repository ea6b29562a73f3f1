// Tokenizers: round trips, saving and loading, and refusals.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "data/data.h"
#include "data/tokenizer.h"
#include "support/temp_dir.h"

using namespace nibble;
using namespace nibble::train;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) { return nibble_test::fresh_dir("test_tokenizer", name); }

std::string shakespeare_prefix(size_t bytes) {
  std::string text = read_text_file(std::string(NIBBLE_SOURCE_DIR) + "/data/tinyshakespeare.txt");
  return text.substr(0, bytes);
}

}  // namespace

TEST(Tokenizer, CharRoundTripsAndSavesItsAlphabet) {
  const std::string corpus = "hello world\nHELLO!\n";
  auto tok = train_char_tokenizer(corpus);
  EXPECT_EQ(tok->kind(), TokenizerKind::character);
  EXPECT_EQ(tok->vocab_size(), 14);  // h e l o space w r d \n H E L O !
  const auto ids = tok->encode(corpus);
  EXPECT_EQ(ids.size(), corpus.size());
  EXPECT_EQ(tok->decode(ids), corpus);

  const fs::path dir = fresh_dir("char");
  tok->save(dir);
  auto loaded = load_tokenizer(dir);
  EXPECT_EQ(loaded->vocab_size(), tok->vocab_size());
  EXPECT_EQ(loaded->encode(corpus), ids);
  EXPECT_THROW(loaded->encode("xyz"), UsageError);  // 'x' is not in the vocabulary
  EXPECT_EQ(loaded->decode(std::vector<int32_t>{999}), "?");
}

TEST(Tokenizer, CharOnShakespeareHas65Tokens) {
  auto tok = train_char_tokenizer(shakespeare_prefix(1u << 30));
  EXPECT_EQ(tok->vocab_size(), 65);
}

TEST(Tokenizer, BpeRoundTripsAnyTextThroughByteFallback) {
  const std::string corpus = shakespeare_prefix(200000);
  auto tok = train_bpe_tokenizer(corpus, 800);
  EXPECT_EQ(tok->kind(), TokenizerKind::bpe);
  EXPECT_EQ(tok->vocab_size(), 800);
  const std::string sample = corpus.substr(1000, 3000);
  const auto ids = tok->encode(sample);
  EXPECT_LT(ids.size(), sample.size() * 2 / 3) << "BPE should compress English text";
  EXPECT_EQ(tok->decode(ids), sample);
  // Text the corpus never showed (non-ASCII, tabs, repeated spaces) still round-trips.
  const std::string unseen = "  caf\xC3\xA9\t\xE2\x82\xAC 42\n\nend  ";
  EXPECT_EQ(tok->decode(tok->encode(unseen)), unseen);

  const fs::path dir = fresh_dir("bpe");
  tok->save(dir);
  EXPECT_TRUE(fs::exists(dir / "tokenizer.model"));
  auto loaded = load_tokenizer(dir);
  EXPECT_EQ(loaded->encode(sample), ids);
}

TEST(Tokenizer, BadInputIsRefusedWithAReason) {
  EXPECT_THROW(train_char_tokenizer(""), UsageError);
  try {
    train_bpe_tokenizer("abc\n", 100);
    FAIL() << "a vocabulary smaller than the byte fallback must be refused";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--vocab-size"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_tokenizer_kind("wordpiece"), UsageError);

  const fs::path dir = fresh_dir("damaged");
  EXPECT_THROW(load_tokenizer(dir), UsageError);  // missing
  std::ofstream(dir / "tokenizer.json") << "{\"type\": \"char\", \"bytes\": [";
  EXPECT_THROW(load_tokenizer(dir), UsageError);  // truncated JSON
  std::ofstream(dir / "tokenizer.json") << "{\"type\": \"char\", \"bytes\": [66, 65]}";
  EXPECT_THROW(load_tokenizer(dir), UsageError);  // not increasing
  std::ofstream(dir / "tokenizer.json") << "{\"type\": \"bpe\", \"model\": \"tokenizer.model\", \"vocab_size\": 5}";
  std::ofstream(dir / "tokenizer.model") << "not a protobuf";
  EXPECT_THROW(load_tokenizer(dir), UsageError);
}
