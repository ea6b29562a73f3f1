// Hugging Face tokenizer.json files (data/huggingface_tokenizer.h) on a tiny hand-written byte-level
// BPE whose ids were worked out by hand (and agree with `tokenizers` 0.2x: Tokenizer.from_file gives
// the same ids), and the files nibble refuses. The comparison with the reference library on real
// text is tests/tokenizers (ctest tokenizer_reference_ids, needs PyPI).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <array>
#include <span>

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
  // byte_fallback without the <0xNN> tokens: a character outside the vocabulary would have no bytes.
  EXPECT_NE(refusal("fallback", tokenizer_json(kByteLevel, fallback)).find("lacks the byte token <0x00>"), std::string::npos);
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

// A sentencepiece-style tokenizer.json (Llama 2, Mistral, TinyLlama): model BPE with byte_fallback,
// <unk> <s> </s> then the 256 byte tokens <0x00>..<0xFF> (ids 3..258), then ▁ h e l o w r d (259..266)
// merged into ▁h ll ▁he llo ▁hello ▁w or (267..273). The expected ids and texts below were worked out
// by hand and are what `tokenizers` 0.23.3 gives for this very file (Tokenizer.from_str(...).encode(s).ids
// and .decode(ids, skip_special_tokens=False)), computed once and pinned.
namespace {

std::string byte_fallback_json(const std::string& normalizer, const std::string& pre_tokenizer, const std::string& decoder,
                               int omit_byte = -1) {
  std::string vocab = R"("<unk>":0,"<s>":1,"</s>":2)";
  for (int b = 0; b < 256; ++b)
    if (b != omit_byte) vocab += fmt::format(R"(,"<0x{:02X}>":{})", b, 3 + b);
  int id = 259;
  for (const char* t : {"▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "ll", "▁he", "llo", "▁hello", "▁w", "or"})
    vocab += fmt::format(R"(,"{}":{})", t, id++);
  std::string added = R"("added_tokens":[)";
  for (int i = 0; i < 3; ++i)
    added += fmt::format(R"({}{{"id":{},"content":"{}","single_word":false,"lstrip":false,"rstrip":false,)"
                         R"("normalized":false,"special":true}})",
                         i ? "," : "", i, std::array{"<unk>", "<s>", "</s>"}[i]);
  const std::string post = R"({"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}},)"
                           R"({"Sequence":{"id":"A","type_id":0}}],"pair":[],"special_tokens":{"<s>":)"
                           R"({"id":"<s>","ids":[1],"tokens":["<s>"]}}})";
  return R"({"version":"1.0","truncation":null,"padding":null,)" + added + R"(],"normalizer":)" + normalizer +
         R"(,"pre_tokenizer":)" + pre_tokenizer + R"(,"post_processor":)" + post + R"(,"decoder":)" + decoder +
         R"(,"model":{"type":"BPE","dropout":null,"unk_token":"<unk>","fuse_unk":true,"byte_fallback":true,)"
         R"("ignore_merges":false,"vocab":{)" + vocab +
         R"(},"merges":["▁ h","l l","▁h e","ll o","▁he llo","▁ w","o r"]}})";
}

// Llama 2's normalizer and decoder.
const std::string kPrependReplace = R"({"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"▁"},)"
                                    R"({"type":"Replace","pattern":{"String":" "},"content":"▁"}]})";
const std::string kLlamaDecoder = R"({"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},)"
                                  R"("content":" "},{"type":"ByteFallback"},{"type":"Fuse"},)"
                                  R"({"type":"Strip","content":" ","start":1,"stop":0}]})";

std::string metaspace(const std::string& scheme, bool split) {
  return fmt::format(R"({{"type":"Metaspace","replacement":"▁","prepend_scheme":"{}","split":{}}})", scheme, split);
}

}  // namespace

// Prepend + Replace, no pre-tokenizer: the text is "▁hello▁world", one piece merged from its
// characters; é and 😀 have no token and fall back to their UTF-8 bytes; each span between added
// tokens is normalized (prepended) on its own; <s> begins every text, </s> ends a document.
TEST(HuggingFaceTokenizer, ByteFallbackPrependReplace) {
  const auto t = load_tokenizer_file(write_file("fallback-prepend", byte_fallback_json(kPrependReplace, "null", kLlamaDecoder)));
  EXPECT_EQ(t->kind(), TokenizerKind::huggingface);
  EXPECT_EQ(t->vocab_size(), 274);
  EXPECT_EQ(t->encode("hello world"), ids({1, 271, 272, 273, 262, 266}));
  EXPECT_EQ(t->encode("h\u00e9 \U0001F600"), ids({1, 267, 198, 172, 259, 243, 162, 155, 131}));
  EXPECT_EQ(t->encode(""), ids({1}));
  EXPECT_EQ(t->encode(" hello"), ids({1, 259, 271}));
  EXPECT_EQ(t->encode("hello</s>hello"), ids({1, 271, 2, 271}));
  EXPECT_EQ(t->encode("hello  world "), ids({1, 271, 259, 272, 273, 262, 266, 259}));
  EXPECT_EQ(t->encode("a\nb"), ids({1, 259, 100, 13, 101}));
  EXPECT_EQ(t->encode_document("hello"), ids({1, 271, 2}));
  ASSERT_TRUE(t->begin_of_text() && t->end_of_text());
  EXPECT_EQ(*t->begin_of_text(), 1);
  EXPECT_EQ(*t->end_of_text(), 2);
  EXPECT_EQ(t->token_text(1), "<s>");
  // A long text is one piece, merged as the short one: <s>, then ▁hello ▁w or l d per "hello world",
  // and the last space's ▁.
  std::string long_text;
  for (int i = 0; i < 20000; ++i) long_text += "hello world ";
  const std::vector<int32_t> long_ids = t->encode(long_text);
  ASSERT_EQ(long_ids.size(), 1 + 20000 * 5 + 1u);
  EXPECT_EQ(std::vector<int32_t>(long_ids.end() - 6, long_ids.end()), ids({271, 272, 273, 262, 266, 259}));
  EXPECT_EQ(t->decode(std::span(long_ids).subspan(1)), long_text);
}

// Decoding as tokenizers' Replace, ByteFallback, Fuse, Strip: text round-trips; bytes that are no
// UTF-8 become one U+FFFD each; <s> is kept as text (skip_special_tokens=False).
TEST(HuggingFaceTokenizer, ByteFallbackDecodes) {
  const auto t = load_tokenizer_file(write_file("fallback-decode", byte_fallback_json(kPrependReplace, "null", kLlamaDecoder)));
  EXPECT_EQ(t->decode(ids({1, 271, 272, 273, 262, 266})), "<s> hello world");
  EXPECT_EQ(t->decode(ids({271, 272, 273, 262, 266})), "hello world");
  EXPECT_EQ(t->decode(ids({267, 198, 172, 259, 243, 162, 155, 131})), "h\u00e9 \U0001F600");
  EXPECT_EQ(t->decode(ids({198})), "\uFFFD");
  EXPECT_EQ(t->decode(ids({243, 162, 259})), "\uFFFD\uFFFD ");
  EXPECT_EQ(t->decode(ids({259, 259, 271})), "  hello");
  for (const std::string text : {"hello  world ", " x\n\n\ty ", "\u65e5\u672c \U0001F469\u200D\U0001F467 caf\u00e9"}) {
    const std::vector<int32_t> encoded = t->encode(text);
    EXPECT_EQ(t->decode(std::span(encoded).subspan(1)), text);
  }
}

// Metaspace pre-tokenizers (Mistral's legacy=false: first, no split): "first" prepends ▁ only to
// the span the text begins with, and to none that begins with ▁ already; "always" to every span,
// and split cuts before each ▁. The Metaspace decoder drops the first token's ▁ and keeps <0xNN>.
TEST(HuggingFaceTokenizer, ByteFallbackMetaspace) {
  const auto first = load_tokenizer_file(write_file("metaspace-first", byte_fallback_json("null", metaspace("first", false), kLlamaDecoder)));
  EXPECT_EQ(first->encode("hello world"), ids({1, 271, 272, 273, 262, 266}));
  EXPECT_EQ(first->encode(" hello"), ids({1, 271}));
  EXPECT_EQ(first->encode("hello</s>hello"), ids({1, 271, 2, 260, 261, 270}));
  EXPECT_EQ(first->encode("hello  world "), ids({1, 271, 259, 272, 273, 262, 266, 259}));
  const std::string decoder = R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true})";
  const auto always = load_tokenizer_file(write_file("metaspace-always", byte_fallback_json("null", metaspace("always", true), decoder)));
  EXPECT_EQ(always->encode("hello</s>hello"), ids({1, 271, 2, 271}));
  EXPECT_EQ(always->encode("h\u00e9 \U0001F600"), ids({1, 267, 198, 172, 259, 243, 162, 155, 131}));
  EXPECT_EQ(always->decode(ids({259, 259, 271})), "  hello");
  EXPECT_EQ(always->decode(ids({271, 272})), "hello w");
  EXPECT_EQ(always->decode(ids({198})), "<0xC3>");
  const auto never = load_tokenizer_file(write_file("metaspace-never", byte_fallback_json("null", metaspace("never", true), kLlamaDecoder)));
  EXPECT_EQ(never->encode("hello world"), ids({1, 260, 261, 270, 272, 273, 262, 266}));
}

// nibble merges a piece's words apart (cut before each "▁"), except where a token joins a "▁" to
// the character before it: here "o▁", merged first, so "▁hello▁world" is ▁he ll o▁ w or l d, not
// ▁hello ▁w or l d (ids from tokenizers 0.23.3 for this file, as above).
TEST(HuggingFaceTokenizer, ByteFallbackMergesAcrossWordsWhereATokenDoes) {
  std::string text = byte_fallback_json(kPrependReplace, "null", kLlamaDecoder);
  text.replace(text.find(R"("or":273)"), 8, R"("or":273,"o▁":274)");
  text.replace(text.find(R"("merges":[)"), 10, R"("merges":["o ▁",)");
  const auto t = load_tokenizer_file(write_file("fallback-join", text));
  EXPECT_EQ(t->encode("hello world"), ids({1, 269, 268, 274, 264, 273, 262, 266}));
  EXPECT_EQ(t->encode("hello  world "), ids({1, 269, 268, 274, 272, 273, 262, 266, 259}));
  EXPECT_EQ(t->encode("ho wo"), ids({1, 267, 274, 264, 263}));
}

// What the byte_fallback kind does not implement is refused, naming the file and the value.
TEST(HuggingFaceTokenizer, ByteFallbackRefusals) {
  EXPECT_NE(refusal("fallback-no-0x41", byte_fallback_json(kPrependReplace, "null", kLlamaDecoder, 0x41)).find("<0x41>"),
            std::string::npos);
  EXPECT_NE(refusal("fallback-scheme", byte_fallback_json("null", metaspace("sometimes", true), kLlamaDecoder))
                .find("prepend_scheme is 'sometimes'"),
            std::string::npos);
  EXPECT_NE(refusal("fallback-bytelevel", byte_fallback_json("null", kByteLevel, kLlamaDecoder)).find("ByteLevel"),
            std::string::npos);
  EXPECT_NE(refusal("fallback-decoder", byte_fallback_json(kPrependReplace, "null", R"({"type":"WordPiece","prefix":"##"})"))
                .find("its decoder is WordPiece"),
            std::string::npos);
  EXPECT_NE(refusal("fallback-regex", byte_fallback_json(R"({"type":"Replace","pattern":{"Regex":" +"},"content":"▁"})",
                                                         "null", kLlamaDecoder))
                .find("regex pattern"),
            std::string::npos);
}
