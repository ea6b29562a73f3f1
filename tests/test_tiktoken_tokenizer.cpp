// tiktoken files (data/tiktoken_tokenizer.h) on a tiny hand-made ranks file whose ids were worked
// out by hand: the 256 bytes at their own value, then he, ll, llo, hello, " w", or. The comparison
// with the tiktoken package on real text is tests/tokenizers (ctest tokenizer_reference_ids).
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

std::string base64(const std::string& bytes) {
  static const char* digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t v = static_cast<unsigned char>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) v |= static_cast<unsigned char>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) v |= static_cast<unsigned char>(bytes[i + 2]);
    for (int k = 0; k < 4; ++k) out += k <= static_cast<int>(bytes.size() - i) ? digits[(v >> (18 - 6 * k)) & 63] : '=';
  }
  return out;
}

// The ranks file, without the byte `skip` when it is 0..255.
fs::path ranks_file(const std::string& test, int skip = -1) {
  const fs::path dir = nibble_test::fresh_dir("test_tiktoken_tokenizer", test);
  std::ofstream out(dir / "tiny.tiktoken", std::ios::binary);
  for (int b = 0; b < 256; ++b)
    if (b != skip) out << base64(std::string(1, static_cast<char>(b))) << ' ' << b << '\n';
  int rank = 256;
  for (const char* token : {"he", "ll", "llo", "hello", " w", "or"}) out << base64(token) << ' ' << rank++ << '\n';
  return dir / "tiny.tiktoken";
}

std::vector<int32_t> ids(std::initializer_list<int32_t> list) { return list; }

}  // namespace

// A piece that is a token whole is that token ("hello"); otherwise the lowest-ranked adjacent pair
// merges first, the leftmost among equals ("lll" -> ll l); <|endoftext|> follows the last rank.
TEST(TiktokenTokenizer, EncodesByConcatenationRanks) {
  const auto t = load_tokenizer_file(ranks_file("encode"), "r50k_base");
  EXPECT_EQ(t->kind(), TokenizerKind::tiktoken);
  EXPECT_EQ(t->vocab_size(), 263);
  EXPECT_EQ(t->encode("hello world"), ids({259, 260, 261, 'l', 'd'}));
  EXPECT_EQ(t->encode("lll"), ids({257, 'l'}));
  EXPECT_EQ(t->encode_document("hello"), ids({259, 262}));
  EXPECT_EQ(t->encode("<|endoftext|>").size(), 13u);  // ordinary text, as encode_ordinary
  const std::string text = "hello world\xF0\x9F\x91\x8D ok";
  EXPECT_EQ(t->decode(t->encode(text)), text);
}

// The pointer and the ranks are saved; loading them back gives the same tokenizer; the identity
// covers the encoding's name (another pattern splits the text otherwise).
TEST(TiktokenTokenizer, SavesAndLoadsBack) {
  const auto t = load_tokenizer_file(ranks_file("save"), "cl100k_base");
  const fs::path dir = nibble_test::fresh_dir("test_tiktoken_tokenizer", "save-dir");
  t->save(dir);
  EXPECT_TRUE(fs::exists(dir / kTiktokenFile));
  EXPECT_TRUE(fs::exists(dir / kNibbleTokenizerFile));  // not tokenizer.json: it is no Hugging Face file
  EXPECT_FALSE(fs::exists(dir / kTokenizerFile));
  const auto loaded = load_tokenizer(dir);
  EXPECT_EQ(loaded->identity(), t->identity());
  EXPECT_EQ(loaded->encode("hello world"), t->encode("hello world"));
  EXPECT_NE(load_tokenizer_file(ranks_file("save-other"), "o200k_base")->identity(), t->identity());
}

// Refused, naming the file: an encoding nibble has no pattern for, a byte without a rank, a bad line.
TEST(TiktokenTokenizer, RefusesWhatItCannotEncodeWith) {
  auto message = [](const fs::path& file, const std::string& encoding) -> std::string {
    try {
      load_tokenizer_file(file, encoding);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "";
  };
  const fs::path file = ranks_file("refusals");
  EXPECT_NE(message(file, "").find("'tiny' is unknown"), std::string::npos);  // the name comes from the file
  EXPECT_NE(message(ranks_file("no-zero", 0), "r50k_base").find("0x00 has no rank"), std::string::npos);
  std::ofstream(file, std::ios::app) << "not base64! 7\n";
  const std::string bad = message(file, "r50k_base");
  EXPECT_NE(bad.find(file.string() + ":263"), std::string::npos) << bad;
}
