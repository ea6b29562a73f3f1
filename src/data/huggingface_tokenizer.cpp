// A Hugging Face `tokenizers` BPE file, encoded as `Tokenizer.from_file(p).encode(text).ids` does.
// Two kinds: byte-level (GPT-2, Llama 3, Qwen: tokens are bytes in GPT-2's alphabet) and
// sentencepiece-style with byte_fallback (Llama 2, Mistral, TinyLlama: tokens are text with "▁" for
// a space, and "<0xNN>" for a byte of a character the vocabulary lacks).
//   1. added tokens with normalized=false are cut out of the text, the rest is normalized (Unicode
//      NFC/NFD/NFKC/NFKD by ICU, as Qwen's NFC; Prepend and Replace, as Llama 2's "▁" + spaces as
//      "▁"), then the other added tokens are cut out (leftmost-longest each), and the text between
//      them is pre-tokenized on its own;
//   2. the pre-tokenizer splits it: regexes (ByteLevel's GPT-2 pattern, Split's pattern), or
//      Metaspace (spaces as "▁", one prepended, cut before each "▁"), or none (one piece);
//   3. each piece is merged by the merge list (data/bpe.h), from its bytes (byte-level) or from its
//      characters (byte_fallback);
//   4. the post-processor's template adds its tokens around the result (Llama's <s>).
// Decoding: byte-level tokens are their bytes; byte_fallback ones go through the file's decoder
// (Replace, ByteFallback, Fuse, Strip, Metaspace), as `decode(ids, skip_special_tokens=False)`.
// What it does not implement (other normalizers, add_prefix_space, ...) is refused with the file and
// the kind named, never encoded differently.
#include "data/huggingface_tokenizer.h"

#include <fmt/format.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <array>
#include <cctype>
#include <map>
#include <unordered_set>

#include "common/error.h"
#include "data/bpe.h"
#include "io/atomic_file.h"
#include "io/checksum.h"

namespace nibble::train {

namespace {

using nlohmann::json;

// GPT-2's pattern, which ByteLevel's use_regex applies (tokenizers' byte_level.rs).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Tokens that end a document in pretraining, most specific first: GPT-2 / Qwen, Llama 3 (base:
// <|eot_id|> ends a chat turn, not a text), Llama 2 / Mistral, Gemma.
constexpr std::array<const char*, 4> kEndOfTextNames = {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"};

// GPT-2's byte <-> character table: printable bytes stand for themselves, the others for U+0100 on.
std::array<char32_t, 256> byte_characters() {
  std::array<char32_t, 256> table{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    table[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return table;
}

// The bytes a byte-level token string stands for; nullopt when a character of it stands for none
// (an added token such as <|endoftext|> is plain text, not byte-level).
std::optional<std::string> byte_level_bytes(const std::string& token, const std::map<char32_t, uint8_t>& byte_of) {
  std::string bytes;
  for (size_t i = 0; i < token.size();) {
    const unsigned char lead = token[i];
    const size_t n = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
    char32_t c = n == 1 ? lead : lead & (0x7F >> n);
    for (size_t k = 1; k < n && i + k < token.size(); ++k) c = (c << 6) | (token[i + k] & 0x3F);
    const auto it = byte_of.find(c);
    if (it == byte_of.end()) return std::nullopt;
    bytes.push_back(static_cast<char>(it->second));
    i += n;
  }
  return bytes;
}

// The length of the UTF-8 character `lead` begins (valid UTF-8).
size_t utf8_length(char lead) {
  const auto b = static_cast<unsigned char>(lead);
  return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

// The code point of the UTF-8 character that ends just before `end` in `text` (valid UTF-8).
char32_t character_before(std::string_view text, size_t end) {
  size_t begin = end - 1;
  while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) --begin;
  const auto lead = static_cast<unsigned char>(text[begin]);
  char32_t c = end - begin == 1 ? lead : lead & (0x7F >> (end - begin));
  for (size_t k = begin + 1; k < end; ++k) c = (c << 6) | (text[k] & 0x3F);
  return c;
}

constexpr std::string_view kWordStart = "\u2581";  // "▁", sentencepiece's space

// A single-character string field (Strip's content, Metaspace's replacement).
bool is_one_character(const std::string& s) {
  return !s.empty() && !first_invalid_utf8(s) && s.size() == utf8_length(s[0]);
}

struct AddedToken {
  std::string content;
  int32_t id;
  bool normalized;
  std::string match;  // what is cut out of the text: a normalized token's content normalized, as HF does
};

// One normalizer: a Unicode normal form (ICU), or Prepend / Replace (plain strings).
struct NormalizeStep {
  const icu::Normalizer2* unicode = nullptr;
  std::string prepend;                // Prepend: put before a non-empty text
  std::string pattern, replacement;   // Replace: every `pattern`, left to right
};

// The Metaspace pre-tokenizer (tokenizers' pre_tokenizers/metaspace.rs).
struct Metaspace {
  enum class Prepend { first, always, never } prepend = Prepend::always;
  std::string replacement;  // one character, "▁"
  bool split = true;        // cut before every replacement character (MergedWithNext)
};

// One decoder of a Sequence (byte_fallback files): each maps the list of token strings.
struct DecodeStep {
  enum class Type { replace, byte_fallback, fuse, strip, metaspace } type = Type::fuse;
  std::string pattern, content;     // replace: pattern -> content; strip / metaspace: the character
  size_t start = 0, stop = 0;       // strip: up to this many at the start / end of each token
  bool metaspace_prepends = false;  // metaspace: its prepend_scheme is not never
};

struct PreTokenizeStage {
  bpe::Regex regex;
  bpe::SplitBehavior behavior;
};

class HuggingFaceTokenizer final : public Tokenizer {
 public:
  HuggingFaceTokenizer(std::string file, std::string source) : file_(std::move(file)), source_(std::move(source)) {
    json j = json::parse(file_, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) fail("is not a JSON object", "give a Hugging Face tokenizer.json");
    try {
      check_unsupported(j);
      read_normalizer(j.value("normalizer", json()));
      read_model(j.at("model"));
      read_added_tokens(j.at("added_tokens"));
      read_pre_tokenizer(j.at("pre_tokenizer"));
      read_post_processor(j.value("post_processor", json()));
      if (byte_fallback_) read_decoder(j.value("decoder", json()));
    } catch (const json::exception& e) {
      fail(fmt::format("has a missing or mistyped field ({})", e.what()), "give tokenizer.json as `tokenizers` saves it");
    }
    choose_end_of_text();
  }
  TokenizerKind kind() const override { return TokenizerKind::huggingface; }
  int64_t vocab_size() const override { return static_cast<int64_t>(bytes_of_id_.size()); }
  std::vector<int32_t> encode(std::string_view text) const override;
  std::vector<int32_t> encode_document(std::string_view text) const override {
    std::vector<int32_t> ids = encode(text);
    // A template that already ends documents with it (suffix) gets no second one.
    if (end_of_text_ && (suffix_.empty() || suffix_.back() != *end_of_text_)) ids.push_back(*end_of_text_);
    return ids;
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::vector<std::string> tokens;
    for (int32_t id : ids) {
      const bool known = id >= 0 && id < vocab_size() && has_id_[id];
      tokens.push_back(known ? bytes_of_id_[id] : std::string("?"));
    }
    return byte_fallback_ ? run_decoder(std::move(tokens)) : join(tokens, "");
  }
  void save(const std::filesystem::path& directory) const override {
    io::write_file_atomically(directory / kTokenizerFile,
                              std::span(reinterpret_cast<const uint8_t*>(file_.data()), file_.size()));
  }
  std::string identity() const override { return io::content_hash("huggingface\n" + file_); }
  std::optional<int32_t> end_of_text() const override { return end_of_text_; }
  std::optional<int32_t> begin_of_text() const override {
    return prefix_.empty() ? std::nullopt : std::optional<int32_t>(prefix_.front());
  }

 private:
  static std::string join(const std::vector<std::string>& tokens, std::string_view separator) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? std::string(separator) : "") + tokens[i];
    return out;
  }
  [[noreturn]] void fail(const std::string& what, const std::string& fix) const {
    throw UsageError(fmt::format("{}: {}: {}", source_, what, fix));
  }
  void unsupported(const std::string& what) const {
    fail(fmt::format("{}, which nibble does not implement", what),
         "nibble reads byte-level BPE tokenizers (GPT-2, Llama 3, Qwen style: model BPE, a ByteLevel pre-tokenizer "
         "or Split + ByteLevel, no normalizer or a Unicode NF* one) and sentencepiece-style BPE ones with "
         "byte_fallback (Llama 2, Mistral: Prepend + Replace normalizers or a Metaspace pre-tokenizer, a decoder "
         "of Replace, ByteFallback, Fuse, Strip or Metaspace); for another sentencepiece model pass its "
         "tokenizer.model instead");
  }
  void check_unsupported(const json& j) const;
  void read_normalizer(const json& n);
  std::string normalize(std::string_view text) const;
  void read_model(const json& model);
  void read_byte_level_vocab(const json& vocab, std::unordered_map<std::string, int32_t>& id_of);
  void read_byte_fallback_vocab(const json& vocab, std::unordered_map<std::string, int32_t>& id_of);
  void find_word_joins(const json& vocab);
  void cut_words(std::string_view text, std::vector<std::pair<size_t, size_t>>& pieces) const;
  void read_metaspace(const json& p);
  void read_decoder(const json& d);
  std::string run_decoder(std::vector<std::string> tokens) const;
  void metaspace_pieces(std::string_view work, const std::vector<std::pair<size_t, size_t>>& spans,
                        std::string& spaced, std::vector<std::pair<size_t, size_t>>& pieces) const;
  void read_added_tokens(const json& added);
  void read_pre_tokenizer(const json& p);
  void read_post_processor(const json& p);
  void choose_end_of_text();
  void set_token(int32_t id, std::string bytes);
  void split_added(std::string_view text, size_t begin, size_t end, bool normalized_pass,
                   std::vector<std::pair<size_t, size_t>>& out) const;
  void pre_tokenize(std::string_view text, size_t begin, size_t end, std::vector<std::pair<size_t, size_t>>& out) const;

  std::string file_, source_;
  std::vector<NormalizeStep> normalizers_;  // applied in order; none: the text as it is
  bpe::Merger merger_;
  bool byte_fallback_ = false;  // the sentencepiece-style kind (characters, <0xNN>, a decoder)
  std::vector<PreTokenizeStage> stages_;
  std::optional<Metaspace> metaspace_;
  std::optional<std::vector<DecodeStep>> decoder_;  // byte_fallback; none: tokens joined by spaces
  // byte_fallback: the characters a "▁" follows inside some token. Before any other "▁" (a word's
  // start) no merge can ever join two symbols, so a piece is cut there: its words merge apart,
  // each cached, into the very ids the whole piece gets (one piece per document, as Llama 2's
  // files make it, would otherwise be one long merge). nullopt where that cannot be known.
  std::optional<std::unordered_set<char32_t>> joined_before_word_;
  std::vector<AddedToken> added_;
  // The added tokens of each pass by their first byte, longest first (leftmost-longest matching).
  std::array<std::array<std::vector<const AddedToken*>, 256>, 2> starting_with_;
  std::vector<std::string> bytes_of_id_;  // what each id decodes to (byte_fallback: its token, for the decoder)
  std::vector<bool> has_id_;
  std::vector<int32_t> prefix_, suffix_;  // the post-processor's template around a text
  std::optional<int32_t> end_of_text_;
};

void HuggingFaceTokenizer::read_normalizer(const json& n) {
  if (n.is_null()) return;
  const std::string type = n.at("type").get<std::string>();
  if (type == "Sequence") {
    for (const json& step : n.at("normalizers")) read_normalizer(step);
    return;
  }
  if (type == "Prepend") {
    NormalizeStep step;
    step.prepend = n.at("prepend").get<std::string>();
    normalizers_.push_back(std::move(step));
    return;
  }
  if (type == "Replace") {
    const json& pattern = n.at("pattern");
    if (!pattern.contains("String")) unsupported("its Replace normalizer has a regex pattern");
    NormalizeStep step;
    step.pattern = pattern.at("String").get<std::string>(), step.replacement = n.at("content").get<std::string>();
    if (step.pattern.empty()) fail("its Replace normalizer's pattern is empty", "fix the file");
    normalizers_.push_back(std::move(step));
    return;
  }
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = type == "NFC"    ? icu::Normalizer2::getNFCInstance(status)
                                       : type == "NFD"  ? icu::Normalizer2::getNFDInstance(status)
                                       : type == "NFKC" ? icu::Normalizer2::getNFKCInstance(status)
                                       : type == "NFKD" ? icu::Normalizer2::getNFKDInstance(status)
                                                        : nullptr;
  if (normalizer == nullptr && U_SUCCESS(status)) unsupported(fmt::format("its normalizer is {}", type));
  if (U_FAILURE(status)) fail(fmt::format("ICU has no {} normalizer ({})", type, u_errorName(status)), "install ICU's data");
  NormalizeStep step;
  step.unicode = normalizer;
  normalizers_.push_back(std::move(step));
}

// Every `pattern` in `text` as `replacement`, left to right, matches not overlapping.
std::string replace_all(std::string_view text, std::string_view pattern, std::string_view replacement) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0;;) {
    const size_t at = text.find(pattern, i);
    out.append(text.substr(i, at == std::string_view::npos ? std::string_view::npos : at - i));
    if (at == std::string_view::npos) return out;
    out.append(replacement);
    i = at + pattern.size();
  }
}

std::string HuggingFaceTokenizer::normalize(std::string_view text) const {
  std::string out(text);
  for (const NormalizeStep& step : normalizers_) {
    if (step.unicode == nullptr && !step.pattern.empty()) {
      out = replace_all(out, step.pattern, step.replacement);
    } else if (step.unicode == nullptr) {
      if (!out.empty()) out.insert(0, step.prepend);
    } else {
      icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(out.data(), static_cast<int32_t>(out.size())));
      UErrorCode status = U_ZERO_ERROR;
      u = step.unicode->normalize(u, status);
      if (U_FAILURE(status)) throw UsageError(fmt::format("{}: normalizing a text failed ({})", source_, u_errorName(status)));
      out.clear();
      u.toUTF8String(out);
    }
  }
  return out;
}

void HuggingFaceTokenizer::check_unsupported(const json& j) const {
  if (!j.value("truncation", json()).is_null() || !j.value("padding", json()).is_null())
    fail("sets truncation or padding, which would change the ids of a document",
         "set \"truncation\" and \"padding\" to null in the file");
}

void HuggingFaceTokenizer::set_token(int32_t id, std::string bytes) {
  if (id < 0) fail(fmt::format("has the negative id {}", id), "give a valid tokenizer.json");
  if (static_cast<size_t>(id) >= bytes_of_id_.size()) bytes_of_id_.resize(id + 1), has_id_.resize(id + 1);
  bytes_of_id_[id] = std::move(bytes);
  has_id_[id] = true;
}

void HuggingFaceTokenizer::read_byte_level_vocab(const json& vocab, std::unordered_map<std::string, int32_t>& id_of) {
  const auto table = byte_characters();
  std::map<char32_t, uint8_t> byte_of;
  for (int b = 0; b < 256; ++b) byte_of[table[b]] = static_cast<uint8_t>(b);
  for (const auto& [token, value] : vocab.items()) {
    const int32_t id = value.get<int32_t>();
    id_of[token] = id;
    const auto bytes = byte_level_bytes(token, byte_of);
    set_token(id, bytes ? *bytes : token);  // ByteLevel's decoder keeps a token it cannot map as text
    if (bytes) merger_.add_token(*bytes, id);
    if (bytes && bytes->size() == 1) merger_.set_byte_id(static_cast<uint8_t>((*bytes)[0]), id);
  }
}

// Tokens are text; every byte needs its <0xNN> token (HF writes them "<0x0A>"), or a character the
// vocabulary lacks would become <unk> where the file promises its bytes.
void HuggingFaceTokenizer::read_byte_fallback_vocab(const json& vocab, std::unordered_map<std::string, int32_t>& id_of) {
  merger_.use_character_symbols();
  for (const auto& [token, value] : vocab.items()) {
    const int32_t id = value.get<int32_t>();
    id_of[token] = id;
    set_token(id, token);
    merger_.add_token(token, id);
  }
  for (int b = 0; b < 256; ++b) {
    const std::string name = fmt::format("<0x{:02X}>", b);
    const auto it = id_of.find(name);
    if (it == id_of.end())
      fail(fmt::format("its BPE model has byte_fallback but its vocabulary lacks the byte token {}", name),
           "give a tokenizer.json whose vocabulary has all 256 byte tokens <0x00>..<0xFF> (as Llama 2's has)");
    merger_.set_byte_id(static_cast<uint8_t>(b), it->second);
  }
}

// joined_before_word_ from the vocabulary (every token a merge can make is in it). A token made of
// byte tokens ("<0xE2><0x96>") stands for text it does not spell, so then nothing is known.
void HuggingFaceTokenizer::find_word_joins(const json& vocab) {
  std::unordered_set<char32_t> before;
  for (const auto& [token, value] : vocab.items()) {
    if (token.find("<0x") != std::string::npos && token.size() != 6) return;
    for (size_t at = token.find(kWordStart, 1); at != std::string::npos; at = token.find(kWordStart, at + 1))
      before.insert(character_before(token, at));
  }
  joined_before_word_ = std::move(before);
}

void HuggingFaceTokenizer::cut_words(std::string_view text, std::vector<std::pair<size_t, size_t>>& pieces) const {
  std::vector<std::pair<size_t, size_t>> cut;
  cut.reserve(pieces.size());
  for (const auto& [b, e] : pieces) {
    if (b == std::string::npos) {
      cut.emplace_back(b, e);
      continue;
    }
    const std::string_view piece = text.substr(b, e - b);
    size_t start = 0;
    for (size_t at = piece.find(kWordStart, 1); at != std::string_view::npos; at = piece.find(kWordStart, at + 1))
      if (!joined_before_word_->contains(character_before(piece, at))) cut.emplace_back(b + start, b + at), start = at;
    cut.emplace_back(b + start, e);
  }
  pieces = std::move(cut);
}

void HuggingFaceTokenizer::read_model(const json& model) {
  const std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") unsupported(fmt::format("its model is of type {}", type));
  byte_fallback_ = model.value("byte_fallback", false);
  if (!model.value("dropout", json()).is_null()) unsupported("its BPE model has dropout");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const json v = model.value(key, json()); !v.is_null() && v != "") unsupported(fmt::format("its BPE model has a {}", key));
  std::unordered_map<std::string, int32_t> id_of;
  if (byte_fallback_)
    read_byte_fallback_vocab(model.at("vocab"), id_of);
  else
    read_byte_level_vocab(model.at("vocab"), id_of);
  merger_.set_whole_piece_first(model.value("ignore_merges", false));
  if (byte_fallback_ && !model.value("ignore_merges", false)) find_word_joins(model.at("vocab"));
  if (const json unk = model.value("unk_token", json()); !unk.is_null()) {
    const auto it = id_of.find(unk.get<std::string>());
    if (it == id_of.end()) fail(fmt::format("unk_token '{}' is not in the vocabulary", unk.get<std::string>()), "fix the file");
    merger_.set_unknown(it->second, model.value("fuse_unk", false));
  }
  uint32_t rank = 0;
  for (const json& m : model.at("merges")) {
    std::string a, b;
    if (m.is_array() && m.size() == 2) {
      a = m[0].get<std::string>(), b = m[1].get<std::string>();
    } else {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        fail(fmt::format("merge #{} '{}' is not two tokens separated by one space", rank, s), "fix the file");
      a = s.substr(0, space), b = s.substr(space + 1);
    }
    const auto ia = id_of.find(a), ib = id_of.find(b), im = id_of.find(a + b);
    if (ia == id_of.end() || ib == id_of.end() || im == id_of.end())
      fail(fmt::format("merge #{} ('{}' '{}') names a token the vocabulary lacks", rank, a, b), "fix the file");
    merger_.add_merge(ia->second, ib->second, rank++, im->second);
  }
}

void HuggingFaceTokenizer::read_added_tokens(const json& added) {
  for (const json& t : added) {
    for (const char* flag : {"single_word", "lstrip", "rstrip"})
      if (t.value(flag, false))
        unsupported(fmt::format("its added token '{}' sets {}", t.at("content").get<std::string>(), flag));
    AddedToken token{t.at("content").get<std::string>(), t.at("id").get<int32_t>(), t.value("normalized", true), ""};
    set_token(token.id, token.content);
    token.match = token.normalized ? normalize(token.content) : token.content;
    if (!token.match.empty()) added_.push_back(std::move(token));
  }
  // Leftmost-longest: at a position, the longest token that starts there.
  std::stable_sort(added_.begin(), added_.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.match.size() > b.match.size(); });
  for (const AddedToken& t : added_) starting_with_[t.normalized][static_cast<unsigned char>(t.match[0])].push_back(&t);
}

void HuggingFaceTokenizer::read_pre_tokenizer(const json& p) {
  if (p.is_null() && byte_fallback_) return;  // Llama 2's: the normalized text is one piece
  if (p.is_null()) unsupported("it has no pre-tokenizer (a byte-level BPE needs ByteLevel)");
  const std::string type = p.at("type").get<std::string>();
  // Its pieces are text, not bytes: for byte_fallback models only, and alone.
  if (type == "Metaspace" && byte_fallback_ && stages_.empty() && !metaspace_) return read_metaspace(p);
  if (byte_fallback_ && type != "Sequence")
    unsupported(fmt::format("its byte_fallback model has a {} pre-tokenizer (nibble reads Metaspace alone or none)", type));
  if (type == "Sequence") {
    for (const json& step : p.at("pretokenizers")) read_pre_tokenizer(step);
    return;
  }
  if (type == "ByteLevel") {
    if (p.value("add_prefix_space", false)) unsupported("its ByteLevel pre-tokenizer sets add_prefix_space");
    if (p.value("use_regex", true))
      stages_.push_back({bpe::Regex(kGpt2Pattern, false, source_), bpe::SplitBehavior::isolated});
    return;
  }
  if (type == "Split") {
    const std::string behavior = p.at("behavior").get<std::string>();
    if (p.value("invert", false)) unsupported("its Split pre-tokenizer sets invert");
    if (behavior != "Isolated" && behavior != "Removed")
      unsupported(fmt::format("its Split pre-tokenizer's behavior is {}", behavior));
    const json& pattern = p.at("pattern");
    const bool literal = pattern.contains("String");
    const std::string text = literal ? pattern.at("String").get<std::string>() : pattern.at("Regex").get<std::string>();
    stages_.push_back({bpe::Regex(text, literal, source_),
                       behavior == "Isolated" ? bpe::SplitBehavior::isolated : bpe::SplitBehavior::removed});
    return;
  }
  unsupported(fmt::format("its pre-tokenizer is {}", type));
}

void HuggingFaceTokenizer::read_metaspace(const json& p) {
  Metaspace m;
  m.replacement = p.at("replacement").get<std::string>();
  if (!is_one_character(m.replacement))
    fail(fmt::format("its Metaspace replacement '{}' is not one character", m.replacement), "fix the file");
  // tokenizers reads add_prefix_space=false as prepend_scheme never, its default is always.
  const std::string scheme = p.value("prepend_scheme", std::string("always"));
  if (scheme == "first")
    m.prepend = Metaspace::Prepend::first;
  else if (scheme == "never")
    m.prepend = Metaspace::Prepend::never;
  else if (scheme != "always")
    fail(fmt::format("its Metaspace prepend_scheme is '{}'", scheme), "use first, always or never, as tokenizers does");
  if (p.value("add_prefix_space", true) == false) {
    if (m.prepend != Metaspace::Prepend::never)
      fail(fmt::format("its Metaspace sets add_prefix_space false with prepend_scheme {}", scheme),
           "set prepend_scheme never (tokenizers refuses this file too)");
  }
  m.split = p.value("split", true);
  metaspace_ = std::move(m);
}

void HuggingFaceTokenizer::read_post_processor(const json& p) {
  if (p.is_null()) return;
  const std::string type = p.at("type").get<std::string>();
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    for (const json& step : p.at("processors")) read_post_processor(step);
    return;
  }
  if (type != "TemplateProcessing") unsupported(fmt::format("its post-processor is {}", type));
  bool after = false;
  for (const json& item : p.at("single")) {
    if (item.contains("Sequence")) {
      if (item["Sequence"].at("id") != "A") fail("its template's single sequence is not A", "fix the file");
      after = true;
      continue;
    }
    const std::string name = item.at("SpecialToken").at("id").get<std::string>();
    for (const json& id : p.at("special_tokens").at(name).at("ids")) (after ? suffix_ : prefix_).push_back(id.get<int32_t>());
  }
}

void HuggingFaceTokenizer::read_decoder(const json& d) {
  if (d.is_null()) return;
  const std::string type = d.at("type").get<std::string>();
  if (type == "Sequence") {
    for (const json& step : d.at("decoders")) read_decoder(step);
    return;
  }
  if (!decoder_) decoder_.emplace();
  DecodeStep step;
  if (type == "Replace") {
    const json& pattern = d.at("pattern");
    if (!pattern.contains("String")) unsupported("its Replace decoder has a regex pattern");
    step.type = DecodeStep::Type::replace;
    step.pattern = pattern.at("String").get<std::string>(), step.content = d.at("content").get<std::string>();
    if (step.pattern.empty()) fail("its Replace decoder's pattern is empty", "fix the file");
  } else if (type == "ByteFallback") {
    step.type = DecodeStep::Type::byte_fallback;
  } else if (type == "Strip") {
    step.type = DecodeStep::Type::strip, step.content = d.at("content").get<std::string>();
    step.start = d.at("start").get<size_t>(), step.stop = d.at("stop").get<size_t>();
    if (!is_one_character(step.content)) fail(fmt::format("its Strip decoder's content '{}' is not one character", step.content), "fix the file");
  } else if (type == "Metaspace") {
    step.type = DecodeStep::Type::metaspace, step.content = d.at("replacement").get<std::string>();
    step.metaspace_prepends = d.value("prepend_scheme", std::string("always")) != "never" && d.value("add_prefix_space", true);
    if (!is_one_character(step.content)) fail(fmt::format("its Metaspace decoder's replacement '{}' is not one character", step.content), "fix the file");
  } else if (type != "Fuse") {
    unsupported(fmt::format("its decoder is {}", type));
  }
  decoder_->push_back(std::move(step));
}

// tokenizers' ByteFallback decoder: a run of <0xNN> tokens becomes its bytes where they are UTF-8,
// else one U+FFFD per token.
void fall_back_bytes(std::vector<std::string>& tokens) {
  std::vector<std::string> out;
  std::string bytes;
  size_t count = 0;
  auto flush = [&] {
    if (count == 0) return;
    if (first_invalid_utf8(bytes))
      out.insert(out.end(), count, "\xEF\xBF\xBD");
    else
      out.push_back(bytes);
    bytes.clear(), count = 0;
  };
  for (std::string& t : tokens) {
    const bool byte_token = t.size() == 6 && t.starts_with("<0x") && t.ends_with('>') &&
                            std::isxdigit(static_cast<unsigned char>(t[3])) && std::isxdigit(static_cast<unsigned char>(t[4]));
    if (byte_token) {
      bytes.push_back(static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16))), ++count;
      continue;
    }
    flush();
    out.push_back(std::move(t));
  }
  flush();
  tokens = std::move(out);
}

// tokenizers' Strip decoder: up to `start` leading and `stop` trailing `c` of each token dropped.
std::string strip(const std::string& token, const std::string& c, size_t start, size_t stop) {
  size_t b = 0, e = token.size(), n = 0;
  for (; n < start && token.compare(b, c.size(), c) == 0 && b + c.size() <= e; ++n) b += c.size();
  for (n = 0; n < stop && e >= b + c.size() && token.compare(e - c.size(), c.size(), c) == 0; ++n) e -= c.size();
  return token.substr(b, e - b);
}

std::string HuggingFaceTokenizer::run_decoder(std::vector<std::string> tokens) const {
  if (!decoder_) return join(tokens, " ");  // tokenizers without a decoder
  for (const DecodeStep& step : *decoder_) {
    switch (step.type) {
      case DecodeStep::Type::replace:
        for (std::string& t : tokens) t = replace_all(t, step.pattern, step.content);
        break;
      case DecodeStep::Type::byte_fallback:
        fall_back_bytes(tokens);
        break;
      case DecodeStep::Type::fuse:
        tokens = {join(tokens, "")};
        break;
      case DecodeStep::Type::strip:
        for (std::string& t : tokens) t = strip(t, step.content, step.start, step.stop);
        break;
      case DecodeStep::Type::metaspace:  // the first token's replacements vanish where one was prepended
        for (size_t i = 0; i < tokens.size(); ++i)
          tokens[i] = replace_all(tokens[i], step.content, i == 0 && step.metaspace_prepends ? "" : " ");
        break;
    }
  }
  return join(tokens, "");
}

void HuggingFaceTokenizer::choose_end_of_text() {
  for (const char* name : kEndOfTextNames)
    for (const AddedToken& t : added_)
      if (t.content == name) {
        end_of_text_ = t.id;
        return;
      }
}

// Cuts [begin, end) of `text` at the added tokens of one pass into `out`: text spans as they are,
// an added token as (npos, id).
void HuggingFaceTokenizer::split_added(std::string_view text, size_t begin, size_t end, bool normalized_pass,
                                       std::vector<std::pair<size_t, size_t>>& out) const {
  size_t start = begin;
  for (size_t i = begin; i < end;) {
    const AddedToken* found = nullptr;
    for (const AddedToken* t : starting_with_[normalized_pass][static_cast<unsigned char>(text[i])])
      if (text.substr(i, std::min(end - i, t->match.size())) == t->match) {
        found = t;
        break;
      }
    if (found == nullptr) {
      ++i;
      continue;
    }
    if (i > start) out.emplace_back(start, i);
    out.emplace_back(std::string::npos, found->id);
    i += found->match.size();
    start = i;
  }
  if (end > start) out.emplace_back(start, end);
}

void HuggingFaceTokenizer::pre_tokenize(std::string_view text, size_t begin, size_t end,
                                        std::vector<std::pair<size_t, size_t>>& out) const {
  std::vector<std::pair<size_t, size_t>> pieces{{begin, end}}, next;
  for (const PreTokenizeStage& stage : stages_) {
    next.clear();
    for (const auto& [b, e] : pieces) bpe::split(stage.regex, stage.behavior, text, b, e, next);
    std::swap(pieces, next);
  }
  out.insert(out.end(), pieces.begin(), pieces.end());
}

// Metaspace on each text span of `spans` (of `work`; added tokens pass through): spaces become the
// replacement, which is prepended (always; first: to the span the text begins with) where the span
// does not begin with it, and the span is cut before each replacement (split). Into `spaced`.
void HuggingFaceTokenizer::metaspace_pieces(std::string_view work, const std::vector<std::pair<size_t, size_t>>& spans,
                                            std::string& spaced, std::vector<std::pair<size_t, size_t>>& pieces) const {
  const Metaspace& m = *metaspace_;
  for (size_t i = 0; i < spans.size(); ++i) {
    const auto [b, e] = spans[i];
    if (b == std::string::npos) {
      pieces.emplace_back(b, e);
      continue;
    }
    std::string span = replace_all(work.substr(b, e - b), " ", m.replacement);
    // "first": the span at offset 0 of the text, i.e. with no added token before it.
    const bool prepend = m.prepend == Metaspace::Prepend::always || (m.prepend == Metaspace::Prepend::first && i == 0);
    if (prepend && !span.starts_with(m.replacement)) span.insert(0, m.replacement);
    const size_t start = spaced.size();
    spaced += span;
    if (!m.split) {
      pieces.emplace_back(start, spaced.size());
      continue;
    }
    size_t piece = start;
    for (size_t at = spaced.find(m.replacement, start + 1); at != std::string::npos; at = spaced.find(m.replacement, at + 1)) {
      pieces.emplace_back(piece, at);
      piece = at;
    }
    pieces.emplace_back(piece, spaced.size());
  }
}

std::vector<int32_t> HuggingFaceTokenizer::encode(std::string_view text) const {
  if (const auto bad = first_invalid_utf8(text))
    throw UsageError(fmt::format("the text is not UTF-8: the byte 0x{:02X} at offset {} begins no UTF-8 character; "
                                 "convert it (e.g. iconv -f LATIN1 -t UTF-8)",
                                 static_cast<unsigned char>(text[*bad]), *bad));
  std::vector<std::pair<size_t, size_t>> first, second, pieces;
  split_added(text, 0, text.size(), false, first);
  // With a normalizer, the spans between those added tokens are normalized into `normalized`, and
  // the rest works on that text.
  std::string normalized;
  if (!normalizers_.empty()) {
    for (auto& [b, e] : first) {
      if (b == std::string::npos) continue;
      const size_t start = normalized.size();
      normalized += normalize(text.substr(b, e - b));
      b = start, e = normalized.size();
    }
  }
  const std::string_view work = normalizers_.empty() ? text : std::string_view(normalized);
  for (const auto& [b, e] : first)
    if (b == std::string::npos)
      second.emplace_back(b, e);
    else
      split_added(work, b, e, true, second);
  std::string spaced;  // Metaspace's text: spaces replaced, its "▁" prepended
  if (metaspace_)
    metaspace_pieces(work, second, spaced, pieces);
  else
    for (const auto& [b, e] : second)
      if (b == std::string::npos)
        pieces.emplace_back(b, e);
      else
        pre_tokenize(work, b, e, pieces);
  const std::string_view pieces_text = metaspace_ ? std::string_view(spaced) : work;
  if (joined_before_word_) cut_words(pieces_text, pieces);
  std::vector<int32_t> ids = bpe::encode_pieces(merger_, pieces_text, pieces, bpe::threads());
  ids.insert(ids.begin(), prefix_.begin(), prefix_.end());
  ids.insert(ids.end(), suffix_.begin(), suffix_.end());
  return ids;
}

}  // namespace

bool looks_like_huggingface_tokenizer(const nlohmann::json& j) {
  return j.is_object() && j.contains("model") && j["model"].is_object() && j.contains("added_tokens");
}

std::unique_ptr<Tokenizer> load_huggingface_tokenizer(std::string file, const std::string& source) {
  return std::make_unique<HuggingFaceTokenizer>(std::move(file), source);
}

}  // namespace nibble::train
