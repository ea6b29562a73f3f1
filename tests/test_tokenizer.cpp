// Tokenizers: round trips, saving and loading, and refusals.
#include <gtest/gtest.h>
#include <sentencepiece_trainer.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
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

// nibble's BPE converted to a Hugging Face tokenizer.json (what export writes so that transformers
// needs no sentencepiece): read back by nibble's Hugging Face loader (checked id for id against the
// `tokenizers` library by tests/tokenizers), it gives sentencepiece's ids on English, other scripts,
// emoji, digits, whitespace runs and characters the corpus never showed, and decodes them back.
TEST(Tokenizer, BpeConvertedToAHuggingFaceTokenizerJsonGivesTheSameIds) {
  const std::string corpus = shakespeare_prefix(150000) +
                             "\nÜber die Brücke 2024 — naïve café 12345\n日本語のテキストです。\nπάντα ῥεῖ 🎉🎉\n";
  auto tok = train_bpe_tokenizer(corpus, 900);
  const auto converted = tok->converted_to_huggingface();
  ASSERT_TRUE(converted.has_value());
  const fs::path dir = fresh_dir("bpe-converted");
  std::ofstream(dir / "tokenizer.json") << *converted;
  auto hf = load_tokenizer_file(dir / "tokenizer.json", "");
  EXPECT_EQ(hf->vocab_size(), tok->vocab_size());
  for (const std::string& text :
       {corpus.substr(5000, 4000), corpus.substr(corpus.size() - 120), std::string("  two  spaces\t\ttabs\n\n\nend  "),
        std::string("unseen: ЖЖЖ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \xF0\x9F\x98\x80 9876543210 x\u00a0y"), std::string("the the the thee thou")}) {
    const auto ids = tok->encode(text);
    EXPECT_EQ(hf->encode(text), ids) << text;
    EXPECT_EQ(hf->decode(ids), text) << text;
  }
}

// A given sentencepiece BPE model with Llama 2's settings (byte fallback, identity normalisation, a
// dummy prefix, whitespace kept, digits split) converts too: the tokenizer.json prepends "▁" and puts
// <s> in front as nibble's prompts have it, and gives sentencepiece's ids. A model that folds
// whitespace (sentencepiece's default) has no exact tokenizer.json: none is made.
TEST(Tokenizer, ALlama2StyleSentencePieceModelConvertsWithItsDummyPrefixAndBos) {
  const fs::path dir = fresh_dir("llama2-style");
  std::ofstream(dir / "corpus.txt") << shakespeare_prefix(120000) << "\nnaïve café 2024 — 日本語 🎉\n";
  const std::string common = "--input=" + (dir / "corpus.txt").string() +
                             " --model_type=bpe --vocab_size=700 --byte_fallback=true --normalization_rule_name=identity "
                             "--split_digits=true --character_coverage=1.0 --minloglevel=2 --model_prefix=";
  ASSERT_TRUE(sentencepiece::SentencePieceTrainer::Train(common + (dir / "llama").string() +
                                                         " --remove_extra_whitespaces=false").ok());
  ASSERT_TRUE(sentencepiece::SentencePieceTrainer::Train(common + (dir / "folding").string()).ok());
  EXPECT_FALSE(load_tokenizer_file(dir / "folding.model")->converted_to_huggingface().has_value());

  const auto given = load_tokenizer_file(dir / "llama.model");
  const auto converted = given->converted_to_huggingface();
  ASSERT_TRUE(converted.has_value());
  std::ofstream(dir / "tokenizer.json") << *converted;
  const auto hf = load_tokenizer_file(dir / "tokenizer.json");
  for (const std::string& text : {std::string("ROMEO: what light through yonder window breaks"),
                                 std::string(" leading space,  two spaces\tand a tab\n\nend "),
                                 std::string("unseen ЖЖ 𝔘 \xF0\x9F\x98\x80 31415 naïve 日本語"), shakespeare_prefix(3000)}) {
    const auto ids = given->encode_prompt(text);  // <s> + sentencepiece's ids
    ASSERT_EQ(ids.front(), 1);
    EXPECT_EQ(hf->encode(text), ids) << text;
    EXPECT_EQ(hf->decode(std::span<const int32_t>(ids).subspan(1)), text) << text;
  }
}

// char and bpe describe themselves in nibble_tokenizer.json (it is no Hugging Face file). A
// directory an earlier nibble wrote (tokenizer.json) loads with the same identity (checkpoints store
// it) and the same ids, and saving into it again (a resumed run) rewrites that file, adding none.
TEST(Tokenizer, CharAndBpeDescribeThemselvesInNibbleTokenizerJson) {
  const std::string corpus = shakespeare_prefix(20000);
  std::vector<std::unique_ptr<Tokenizer>> tokenizers;
  tokenizers.push_back(train_char_tokenizer(corpus));
  tokenizers.push_back(train_bpe_tokenizer(corpus, 400));
  for (const auto& tok : tokenizers) {
    const std::string kind(to_string(tok->kind()));
    const fs::path dir = fresh_dir("own-" + kind), earlier = fresh_dir("earlier-" + kind);
    tok->save(dir);
    EXPECT_TRUE(fs::exists(dir / kNibbleTokenizerFile)) << kind;
    EXPECT_FALSE(fs::exists(dir / kTokenizerFile)) << kind;
    tok->save(earlier);
    fs::rename(earlier / kNibbleTokenizerFile, earlier / kTokenizerFile);
    const auto loaded = load_tokenizer(earlier);
    EXPECT_EQ(loaded->identity(), tok->identity()) << kind;
    EXPECT_EQ(loaded->encode(corpus.substr(0, 500)), tok->encode(corpus.substr(0, 500))) << kind;
    loaded->save(earlier);
    EXPECT_TRUE(fs::exists(earlier / kTokenizerFile)) << kind;
    EXPECT_FALSE(fs::exists(earlier / kNibbleTokenizerFile)) << kind;
  }
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

TEST(Tokenizer, FirstInvalidUtf8FindsEveryMalformedSequence) {
  EXPECT_EQ(first_invalid_utf8(""), std::nullopt);
  EXPECT_EQ(first_invalid_utf8("plain \t\r\n ascii"), std::nullopt);
  EXPECT_EQ(first_invalid_utf8("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \xF4\x8F\xBF\xBF \xED\x9F\xBF"), std::nullopt);
  const std::pair<std::string, size_t> bad[] = {
      {"ab\xFF", 2},               // never a UTF-8 byte
      {"a\x80", 1},                // a continuation byte first
      {"\xC0\x80", 0},             // overlong NUL
      {"\xC1\xBF", 0},             // overlong
      {"x\xE0\x80\x80", 1},        // overlong 3-byte
      {"\xED\xA0\x80", 0},         // a surrogate, U+D800
      {"\xF0\x80\x80\x80", 0},     // overlong 4-byte
      {"\xF4\x90\x80\x80", 0},     // above U+10FFFF
      {"\xF5\x80\x80\x80", 0},     // lead byte beyond F4
      {"ok\xE2\x82", 2},           // cut short at the end
      {"ok\xE2\x82x", 2},          // cut short before ASCII
      {"\xC3\xA9\xC3", 2},         // a valid character, then a lone lead byte
  };
  for (const auto& [text, offset] : bad) EXPECT_EQ(first_invalid_utf8(text), offset) << text;
}

// Inputs sentencepiece's trainer crashed on (a word of 32770+ characters: SIGSEGV; 65537+: abort;
// invalid UTF-8) or refused with the wrong advice (a line over 1 MB; more characters than the
// vocabulary holds) are trained on, or refused naming the fix, before it sees them.
TEST(Tokenizer, BpeTrainsOnLongWordsAndLinesAndRefusesWhatItCannotHold) {
  std::string word(70000, 'a');
  for (size_t i = 0; i < word.size(); ++i) word[i] = "abcdefghi"[i % 9];
  auto tok = train_bpe_tokenizer(word, 400);
  EXPECT_EQ(tok->decode(tok->encode(word)), word);
  std::string cr_only;
  while (cr_only.size() < 1100000) cr_only += "to be or not to be\r";
  tok = train_bpe_tokenizer(cr_only, 400);
  // 259 fixed pieces + t o b e r n \r and U+2581: anything more is merges learned from the line.
  EXPECT_GT(tok->vocab_size(), 259 + 8) << "the line's words are learned, not skipped";
  EXPECT_EQ(tok->decode(tok->encode(cr_only)), cr_only);

  try {
    train_bpe_tokenizer("ok \xFF\n", 400);
    FAIL() << "invalid UTF-8 reached sentencepiece";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("the byte 0xFF at offset 3"), std::string::npos) << e.what();
  }
  // Characters, not bytes: 300 distinct two-byte characters need 300 pieces beside the 259 fixed ones.
  std::string wide;
  for (int i = 0; i < 600; ++i) {
    const int c = 0x100 + i % 300;
    wide += {static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F)), ' '};
  }
  try {
    train_bpe_tokenizer(wide, 512);
    FAIL() << "a vocabulary smaller than the corpus's characters was passed to sentencepiece";
  } catch (const UsageError& e) {
    // 300 characters and the space's U+2581: 256 + 3 + 301 + 1.
    EXPECT_NE(std::string(e.what()).find("301 distinct characters; pass --vocab-size 561 or more"), std::string::npos)
        << e.what();
  }
  const auto fitted = train_bpe_tokenizer(wide, 561);
  EXPECT_EQ(fitted->decode(fitted->encode(wide)), wide);
}

TEST(Tokenizer, ABpeModelIsAFileBesideItsTokenizerJson) {
  const fs::path dir = fresh_dir("model-path");
  for (const char* model : {"/dev/zero", "../tokenizer.model", "", ".", ".."}) {
    std::ofstream(dir / "tokenizer.json") << "{\"type\": \"bpe\", \"model\": \"" << model << "\", \"vocab_size\": 300}";
    try {
      load_tokenizer(dir);
      FAIL() << model;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("not the name of a file beside it"), std::string::npos) << e.what();
    }
  }
}

// A sentencepiece model given to `prepare --tokenizer x.model` (here one nibble trained): ids are
// sentencepiece's, a document is wrapped in the model's <s> and </s>, and it saves and loads back
// as that kind (nibble's own bpe kind, from the same bytes, marks no documents and hashes apart).
TEST(Tokenizer, AnExistingSentencePieceModelMarksDocuments) {
  const std::string corpus = shakespeare_prefix(20000);
  const fs::path trained = fresh_dir("spm-trained");
  train_bpe_tokenizer(corpus, 400)->save(trained);
  const auto own = load_tokenizer(trained);
  const auto given = load_tokenizer_file(trained / kSentencePieceFile);
  EXPECT_EQ(given->kind(), TokenizerKind::sentencepiece);
  const std::string text = "ROMEO: what light";
  std::vector<int32_t> expected = own->encode(text);
  EXPECT_EQ(given->encode(text), expected);
  expected.insert(expected.begin(), 1);  // <s>
  expected.push_back(2);                 // </s>
  EXPECT_EQ(given->encode_prompt(text), std::vector<int32_t>(expected.begin(), expected.end() - 1));
  EXPECT_EQ(given->encode_document(text), expected);
  EXPECT_EQ(own->encode_document(text), own->encode(text));
  EXPECT_EQ(own->encode_prompt(text), own->encode(text));
  EXPECT_EQ(given->token_text(2), "</s>");
  EXPECT_NE(given->identity(), own->identity());
  const fs::path saved = fresh_dir("spm-saved");
  given->save(saved);
  EXPECT_TRUE(fs::exists(saved / kNibbleTokenizerFile));  // not tokenizer.json: it is no Hugging Face file
  EXPECT_FALSE(fs::exists(saved / kTokenizerFile));
  const auto loaded = load_tokenizer(saved);
  EXPECT_EQ(loaded->kind(), TokenizerKind::sentencepiece);
  EXPECT_EQ(loaded->identity(), given->identity());
}
