// A tiktoken encoding: the ranks of a .tiktoken file, the pattern of the named OpenAI encoding,
// encoded as tiktoken's `encode_ordinary` does (special-token text in a document is ordinary text,
// as llm.c and nanoGPT prepare corpora) and each document followed by <|endoftext|>.
// Special tokens: the named encoding's own ids when the file has that encoding's number of ranks
// (the file is that encoding's); otherwise <|endoftext|> is the id after the last rank.
#include "data/tiktoken_tokenizer.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <array>
#include <optional>
#include <regex>
#include <utility>
#include <vector>

#include "common/error.h"
#include "data/bpe.h"
#include "io/atomic_file.h"
#include "io/checksum.h"

namespace nibble::train {

namespace {

struct Encoding {
  const char* name;
  const char* pattern;
  size_t ranks;  // how many ranks the encoding's own file has
  std::vector<std::pair<std::string, int32_t>> specials;
};

// Patterns as tiktoken_ext/openai_public.py (tiktoken 0.14) writes them.
constexpr const char* kR50k = R"('(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s)";
constexpr const char* kCl100k =
    R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s)";
constexpr const char* kO200k =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

const std::vector<Encoding>& encodings() {
  static const std::vector<Encoding> all = {
      {"r50k_base", kR50k, 50256, {{"<|endoftext|>", 50256}}},
      {"p50k_base", kR50k, 50280, {{"<|endoftext|>", 50256}}},
      {"cl100k_base",
       kCl100k,
       100256,
       {{"<|endoftext|>", 100257},
        {"<|fim_prefix|>", 100258},
        {"<|fim_middle|>", 100259},
        {"<|fim_suffix|>", 100260},
        {"<|endofprompt|>", 100276}}},
      {"o200k_base", kO200k, 199998, {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}}},
  };
  return all;
}

std::optional<std::string> base64_decode(std::string_view text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
  };
  std::string out;
  uint32_t buffer = 0;
  int bits = 0;
  for (char c : text) {
    if (c == '=') break;
    const int v = value(c);
    if (v < 0) return std::nullopt;
    buffer = (buffer << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((buffer >> bits) & 0xFF));
    }
  }
  return out;
}

class TiktokenTokenizer final : public Tokenizer {
 public:
  TiktokenTokenizer(std::string file, std::string encoding, const std::string& source)
      : file_(std::move(file)), encoding_(std::move(encoding)), source_(source) {
    const Encoding* e = nullptr;
    for (const Encoding& candidate : encodings())
      if (candidate.name == encoding_) e = &candidate;
    if (e == nullptr)
      throw UsageError(fmt::format("{}: tiktoken encoding '{}' is unknown: name its pattern with --tiktoken-encoding "
                                   "r50k_base, p50k_base, cl100k_base or o200k_base",
                                   source_, encoding_));
    pattern_ = e->pattern;
    regex_.emplace(e->pattern, false, source_, bpe::Dialect::rust);
    read_ranks();
    if (ranks_ == e->ranks) {
      for (const auto& [text, id] : e->specials) add_special(text, id);
    } else {
      add_special("<|endoftext|>", static_cast<int32_t>(bytes_of_id_.size()));
    }
    end_of_text_ = specials_.front().second;
  }
  TokenizerKind kind() const override { return TokenizerKind::tiktoken; }
  int64_t vocab_size() const override { return static_cast<int64_t>(bytes_of_id_.size()); }
  std::vector<int32_t> encode(std::string_view text) const override {
    if (const auto bad = first_invalid_utf8(text))
      throw UsageError(fmt::format("the text is not UTF-8: the byte 0x{:02X} at offset {} begins no UTF-8 character; "
                                   "convert it (e.g. iconv -f LATIN1 -t UTF-8)",
                                   static_cast<unsigned char>(text[*bad]), *bad));
    std::vector<std::pair<size_t, size_t>> pieces;
    bpe::split(*regex_, bpe::SplitBehavior::isolated, text, 0, text.size(), pieces);
    return bpe::encode_pieces(merger_, text, pieces, bpe::threads());
  }
  std::vector<int32_t> encode_document(std::string_view text) const override {
    std::vector<int32_t> ids = encode(text);
    ids.push_back(end_of_text_);
    return ids;
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    for (int32_t id : ids) out += id >= 0 && id < vocab_size() && has_id_[id] ? bytes_of_id_[id] : std::string("?");
    return out;
  }
  void save(const std::filesystem::path& directory) const override {
    io::write_file_atomically(directory / kTiktokenFile,
                              std::span(reinterpret_cast<const uint8_t*>(file_.data()), file_.size()));
    const std::string pointer =
        nlohmann::json{{"type", "tiktoken"}, {"file", kTiktokenFile}, {"encoding", encoding_}}.dump() + "\n";
    io::write_file_atomically(directory / kNibbleTokenizerFile,
                              std::span(reinterpret_cast<const uint8_t*>(pointer.data()), pointer.size()));
  }
  std::string identity() const override { return io::content_hash("tiktoken\n" + encoding_ + "\n" + file_); }
  std::optional<int32_t> end_of_text() const override { return end_of_text_; }

 private:
  void set_id(int32_t id, std::string bytes) {
    if (static_cast<size_t>(id) >= bytes_of_id_.size()) bytes_of_id_.resize(id + 1), has_id_.resize(id + 1);
    bytes_of_id_[id] = std::move(bytes);
    has_id_[id] = true;
  }
  void add_special(const std::string& text, int32_t id) {
    specials_.emplace_back(text, id);
    set_id(id, text);
  }
  void read_ranks();
  std::optional<std::string> converted_to_huggingface() const override;
  std::vector<std::string> merge_of(const std::string& token, int32_t rank) const;

  std::string file_, encoding_, source_;
  std::string pattern_;
  std::optional<bpe::Regex> regex_;
  bpe::Merger merger_;
  std::vector<std::string> bytes_of_id_;
  std::vector<bool> has_id_;
  std::vector<std::pair<std::string, int32_t>> specials_;
  size_t ranks_ = 0;
  int32_t end_of_text_ = 0;
};

void TiktokenTokenizer::read_ranks() {
  merger_.use_concatenation_ranks();
  merger_.set_whole_piece_first(true);
  size_t line_number = 0;
  for (size_t start = 0; start < file_.size();) {
    const size_t end = std::min(file_.find('\n', start), file_.size());
    const std::string_view line = std::string_view(file_).substr(start, end - start);
    start = end + 1;
    ++line_number;
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    const auto bytes = space == std::string_view::npos ? std::nullopt : base64_decode(line.substr(0, space));
    int64_t rank = -1;
    if (bytes) {
      const std::string number(line.substr(space + 1));
      rank = number.find_first_not_of("0123456789") == std::string::npos && !number.empty() && number.size() < 10
                 ? std::stoll(number)
                 : -1;
    }
    if (!bytes || bytes->empty() || rank < 0)
      throw UsageError(fmt::format("{}:{}: not 'BASE64-TOKEN RANK': a .tiktoken file has one token per line",
                                   source_, line_number));
    if (static_cast<size_t>(rank) < has_id_.size() && has_id_[rank])
      throw UsageError(fmt::format("{}:{}: rank {} is given twice", source_, line_number, rank));
    set_id(static_cast<int32_t>(rank), *bytes);
    merger_.add_token(*bytes, static_cast<int32_t>(rank));
    if (bytes->size() == 1) merger_.set_byte_id(static_cast<uint8_t>((*bytes)[0]), static_cast<int32_t>(rank));
    ++ranks_;
  }
  // Every text must be encodable: tiktoken itself panics on a byte without a rank.
  for (int b = 0; b < 256; ++b)
    if (merger_.find_token(std::string(1, static_cast<char>(b))) == nullptr)
      throw UsageError(fmt::format("{}: the byte 0x{:02X} has no rank, so some texts cannot be encoded: a tiktoken "
                                   "file gives each of the 256 bytes a rank",
                                   source_, b));
}

// `pattern` for Oniguruma (tokenizers): there `X{1,3}+` is (X{1,3})+, not a possessive X{1,3}, so the
// `+` goes; greedy instead of possessive changes nothing where the interval ends its alternative, as
// in cl100k_base's `\p{N}{1,3}+`. (`?+`, `*+`, `++` are possessive in both.)
std::string oniguruma_pattern(const std::string& pattern) {
  return std::regex_replace(pattern, std::regex(R"((\{[0-9]+(,[0-9]*)?\})\+)"), "$1");
}

// The parts tiktoken's merging leaves of `token` when only ranks below its own may merge: two
// parts are the merge that makes the token (transformers' tiktoken conversion does the same).
std::vector<std::string> TiktokenTokenizer::merge_of(const std::string& token, int32_t rank) const {
  std::vector<std::string> parts;
  for (char c : token) parts.emplace_back(1, c);
  while (parts.size() > 1) {
    size_t best = 0;
    int32_t best_rank = -1;
    for (size_t i = 0; i + 1 < parts.size(); ++i)
      if (const int32_t* r = merger_.find_token(parts[i] + parts[i + 1]); r && *r < rank && (best_rank < 0 || *r < best_rank))
        best = i, best_rank = *r;
    if (best_rank < 0) break;
    parts[best] += parts[best + 1];
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  return parts;
}

// A byte-level BPE with the ranks as ids, merges in rank order, ignore_merges (tiktoken takes a
// piece that is a token whole), the encoding's pattern as a Split before ByteLevel, and the
// special tokens as added tokens.
std::optional<std::string> TiktokenTokenizer::converted_to_huggingface() const {
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  nlohmann::ordered_json merges = nlohmann::ordered_json::array();
  for (size_t id = 0; id < bytes_of_id_.size(); ++id) {
    const bool special = std::any_of(specials_.begin(), specials_.end(), [&](const auto& s) { return s.second == static_cast<int32_t>(id); });
    if (!has_id_[id] || special) continue;
    vocab[bpe::byte_level_text(bytes_of_id_[id])] = id;
    if (bytes_of_id_[id].size() < 2) continue;
    const auto parts = merge_of(bytes_of_id_[id], static_cast<int32_t>(id));
    if (parts.size() == 2) merges.push_back({bpe::byte_level_text(parts[0]), bpe::byte_level_text(parts[1])});
  }
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  for (const auto& [text, id] : specials_)
    added.push_back({{"id", id}, {"content", text}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
  const nlohmann::ordered_json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                                             {"use_regex", false}};
  const nlohmann::ordered_json j = {
      {"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", oniguruma_pattern(pattern_)}}},
                                                                   {"behavior", "Isolated"}, {"invert", false}},
                                                                  byte_level}}}},
      {"post_processor", nullptr}, {"decoder", byte_level},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
                 {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false},
                 {"ignore_merges", true}, {"vocab", vocab}, {"merges", merges}}}};
  return j.dump(1) + "\n";
}

}  // namespace

bool looks_like_tiktoken_file(std::string_view bytes) {
  const std::string_view first = bytes.substr(0, bytes.find('\n'));
  const size_t space = first.find(' ');
  return space != std::string_view::npos && space > 0 && base64_decode(first.substr(0, space)).has_value() &&
         space + 1 < first.size() && first.substr(space + 1).find_first_not_of("0123456789") == std::string_view::npos;
}

std::unique_ptr<Tokenizer> load_tiktoken_tokenizer(std::string file, std::string encoding, const std::string& source) {
  return std::make_unique<TiktokenTokenizer>(std::move(file), std::move(encoding), source);
}

}  // namespace nibble::train
