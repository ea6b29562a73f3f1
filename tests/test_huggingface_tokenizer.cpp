// Hugging Face tokenizer.json files (data/huggingface_tokenizer.h) on a tiny hand-written byte-level
// BPE whose ids were worked out by hand (and agree with `tokenizers` 0.2x: Tokenizer.from_file gives
// the same ids), and the files nibble refuses. The comparison with the reference library on real
// text is tests/tokenizers (ctest tokenizer_reference_ids, needs PyPI).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "data/tokenizer.h"
#include "support/temp_dir.h"

using namespace nibble;
using namespace nibble::train;
namespace fs = std::filesystem;

namespace {

// h e l o Ġ(space) w r d, merged into he, ll, llo, hello, Ġw, or; <|endoftext|> added as id 14.
const std::string kModel = R"("model":{"type":"BPE","dropout":null,"unk_token":null,"fuse_unk":false,"byte_fallback":false,
  "vocab":{"h":0,"e":1,"l":2,"o":3,"Ġ":4,"w":5,"r":6,"d":7,"he":8,"ll":9,"llo":10,"hello":11,"Ġw":12,"or":13},
  "merges":["h e","l l","ll o","he llo","Ġ w","o r"]})";
const std::string kAdded =
    R"("added_tokens":[{"id":14,"content":"<|endoftext|>","single_word":false,"lstrip":false,"rstrip":false,)"
    R"("normalized":false,"special":true}])";
const std::string kByteLevel = R"({"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true})";

std::string tokenizer_json(const std::string& pre_tokenizer = kByteLevel, const std::string& model = kModel,
                           const std::string& normalizer = "null", const std::string& post = "null") {
  return R"({"version":"1.0","truncation":null,"padding":null,)" + kAdded + R"(,"normalizer":)" + normalizer +
         R"(,"pre_tokenizer":)" + pre_tokenizer + R"(,"post_processor":)" + post + R"(,"decoder":null,)" + model + "}";
}

fs::path write_file(const std::string& test, const std::string& text) {
  const fs::path dir = nibble_test::fresh_dir("test_huggingface_tokenizer", test);
  std::ofstream(dir / "tokenizer.json", std::ios::binary) << text;
  return dir / "tokenizer.json";
}

std::vector<int32_t> ids(std::initializer_list<int32_t> list) { return list; }

// The message of the UsageError loading `text` throws ("" when it loads).
std::string refusal(const std::string& test, const std::string& text) {
  const fs::path file = write_file(test, text);
  try {
    load_tokenizer_file(file);
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << "the message names the file: " << e.what();
    return e.what();
  }
  return "";
}

}  // namespace

// Merges apply lowest rank first and leftmost among equal ranks ("lll" -> ll l); the ByteLevel regex
// splits " world" off with its space (Ġ); a byte without a token is dropped (no unk_token, as HF).
TEST(HuggingFaceTokenizer, EncodesAsTheMergeListSays) {
  const auto t = load_tokenizer_file(write_file("encode", tokenizer_json()));
  EXPECT_EQ(t->kind(), TokenizerKind::huggingface);
  EXPECT_EQ(t->vocab_size(), 15);
  EXPECT_EQ(t->encode("hello world"), ids({11, 12, 13, 2, 7}));
  EXPECT_EQ(t->encode("lll"), ids({9, 2}));
  EXPECT_EQ(t->encode("hz l"), ids({0, 4, 2}));
  EXPECT_EQ(t->encode(""), ids({}));
}

// Added tokens are cut out before pre-tokenization; a document ends with <|endoftext|>; decoding
// gives the bytes back, added tokens as their text.
TEST(HuggingFaceTokenizer, AddedTokensDocumentsAndDecoding) {
  const auto t = load_tokenizer_file(write_file("added", tokenizer_json()));
  EXPECT_EQ(t->encode("hello<|endoftext|>hello"), ids({11, 14, 11}));
  ASSERT_TRUE(t->end_of_text().has_value());
  EXPECT_EQ(*t->end_of_text(), 14);
  EXPECT_EQ(t->encode_document("hello"), ids({11, 14}));
  const std::string text = "hello world<|endoftext|>he";
  EXPECT_EQ(t->decode(t->encode(text)), text);
  EXPECT_EQ(t->decode(ids({11, 99, -1})), "hello??");
}

// A Split regex + ByteLevel(use_regex=false) sequence (Llama 3's shape) and a BOS template: the
// pattern here splits before every 'w', so "hellow" is "hello" + "w".
TEST(HuggingFaceTokenizer, SplitSequenceAndTemplate) {
  const std::string pre = R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"w|[^w]+"},)"
                          R"("behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,)"
                          R"("trim_offsets":true,"use_regex":false}]})";
  const std::string post = R"({"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<|endoftext|>","type_id":0}},)"
                           R"({"Sequence":{"id":"A","type_id":0}}],"pair":[],"special_tokens":{"<|endoftext|>":)"
                           R"({"id":"<|endoftext|>","ids":[14],"tokens":["<|endoftext|>"]}}})";
  const auto t = load_tokenizer_file(write_file("split", tokenizer_json(pre, kModel, "null", post)));
  EXPECT_EQ(t->encode("hellow"), ids({14, 11, 5}));
  EXPECT_EQ(t->encode("hello world"), ids({14, 11, 4, 5, 13, 2, 7}));  // " " and "w" apart: no Ġw
  ASSERT_TRUE(t->begin_of_text().has_value());
  EXPECT_EQ(*t->begin_of_text(), 14);
}

// A Unicode normalizer runs before pre-tokenization: NFD splits the precomposed é into e + U+0301,
// so "hé" merges to "he" (the combining mark has no token and is dropped, as without unk_token).
TEST(HuggingFaceTokenizer, NormalizesFirst) {
  const auto plain = load_tokenizer_file(write_file("plain", tokenizer_json()));
  const auto nfd = load_tokenizer_file(write_file("nfd", tokenizer_json(kByteLevel, kModel, R"({"type":"NFD"})")));
  EXPECT_EQ(plain->encode("h\u00e9"), ids({0}));
  EXPECT_EQ(nfd->encode("h\u00e9"), ids({8}));
  EXPECT_EQ(nfd->encode("<|endoftext|>h\u00e9"), ids({14, 8}));  // an added token is no normalized text
}

// Saved as the very file it was given; its identity covers the contents (one merge less, another id).
TEST(HuggingFaceTokenizer, SavesTheFileAndHashesItsContents) {
  const std::string text = tokenizer_json();
  const auto t = load_tokenizer_file(write_file("save", text));
  const fs::path dir = nibble_test::fresh_dir("test_huggingface_tokenizer", "save-dir");
  t->save(dir);
  std::ifstream in(dir / kTokenizerFile, std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), text);
  const auto loaded = load_tokenizer(dir);
  EXPECT_EQ(loaded->kind(), TokenizerKind::huggingface);
  EXPECT_EQ(loaded->identity(), t->identity());
  std::string other = text;
  other.replace(other.find(",\"o r\""), 6, "");
  const auto without_or = load_tokenizer_file(write_file("save-other", other));
  EXPECT_NE(without_or->identity(), t->identity());
  // Merged pieces are cached per thread across calls, but per tokenizer: " world" again, without
  // the "o r" merge, is not the first tokenizer's cached result.
  EXPECT_EQ(t->encode("hello world"), ids({11, 12, 13, 2, 7}));
  EXPECT_EQ(without_or->encode("hello world"), ids({11, 12, 3, 6, 2, 7}));
}

// What nibble does not implement is refused, naming the file and the kind, never encoded otherwise.
TEST(HuggingFaceTokenizer, RefusesKindsItDoesNotImplement) {
  std::string wordpiece = kModel;
  wordpiece.replace(wordpiece.find("\"BPE\""), 5, "\"WordPiece\"");
  EXPECT_NE(refusal("wordpiece", tokenizer_json(kByteLevel, wordpiece)).find("WordPiece"), std::string::npos);
  EXPECT_NE(refusal("whitespace", tokenizer_json(R"({"type":"Whitespace"})")).find("Whitespace"), std::string::npos);
  EXPECT_NE(refusal("lowercase", tokenizer_json(kByteLevel, kModel, R"({"type":"Lowercase"})")).find("Lowercase"),
            std::string::npos);
  std::string fallback = kModel;
  fallback.replace(fallback.find("\"byte_fallback\":false"), 21, "\"byte_fallback\":true");
  EXPECT_NE(refusal("fallback", tokenizer_json(kByteLevel, fallback)).find("byte_fallback"), std::string::npos);
  std::string bad_merge = kModel;
  bad_merge.replace(bad_merge.find("\"o r\""), 5, "\"o q\"");
  EXPECT_NE(refusal("merge", tokenizer_json(kByteLevel, bad_merge)).find("'o' 'q'"), std::string::npos);
  EXPECT_NE(refusal("not-json", "{\"model\":").find("neither JSON"), std::string::npos);
  EXPECT_NE(refusal("other-json", "{\"type\":\"char\"}").find("not a Hugging Face tokenizer.json"), std::string::npos);
  EXPECT_NE(refusal("regex", tokenizer_json(R"({"type":"Split","pattern":{"Regex":"(["},"behavior":"Isolated"})"))
                .find("does not compile"),
            std::string::npos);
  EXPECT_NE(refusal("interval-plus",
                    tokenizer_json(R"({"type":"Split","pattern":{"Regex":"\\p{N}{1,3}+"},"behavior":"Isolated"})"))
                .find("X{n,m}+"),
            std::string::npos);
}
