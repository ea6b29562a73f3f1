// A Hugging Face `tokenizers` file of the byte-level BPE kind (GPT-2, Llama 3, Qwen), encoded as
// `Tokenizer.from_file(p).encode(text).ids` does:
//   1. added tokens with normalized=false are cut out of the text, the rest is normalized (Unicode
//      NFC/NFD/NFKC/NFKD by ICU, as Qwen's NFC), then the other added tokens are cut out (leftmost-
//      longest each), and the text between them is pre-tokenized on its own;
//   2. the pre-tokenizer's regexes split it (ByteLevel's GPT-2 pattern, Split's pattern);
//   3. each piece's bytes are merged by the merge list (data/bpe.h);
//   4. the post-processor's template adds its tokens around the result (Llama 3's BOS).
// What it does not implement (other normalizers, byte_fallback models, add_prefix_space, ...) is refused
// with the file and the kind named, never encoded differently.
#include "data/huggingface_tokenizer.h"

#include <fmt/format.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <array>
#include <map>

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

struct AddedToken {
  std::string content;
  int32_t id;
  bool normalized;
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
    std::string out;
    for (int32_t id : ids) {
      const bool known = id >= 0 && id < vocab_size() && has_id_[id];
      out += known ? bytes_of_id_[id] : std::string("?");
    }
    return out;
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
  [[noreturn]] void fail(const std::string& what, const std::string& fix) const {
    throw UsageError(fmt::format("{}: {}: {}", source_, what, fix));
  }
  void unsupported(const std::string& what) const {
    fail(fmt::format("{}, which nibble does not implement", what),
         "nibble reads byte-level BPE tokenizers (GPT-2, Llama 3, Qwen style: model BPE, a ByteLevel pre-tokenizer "
         "or Split + ByteLevel, no normalizer or a Unicode NF* one); for a sentencepiece-style model pass its "
         "tokenizer.model instead");
  }
  void check_unsupported(const json& j) const;
  void read_normalizer(const json& n);
  std::string normalize(std::string_view text) const;
  void read_model(const json& model);
  void read_added_tokens(const json& added);
  void read_pre_tokenizer(const json& p);
  void read_post_processor(const json& p);
  void choose_end_of_text();
  void set_token(int32_t id, std::string bytes);
  void split_added(std::string_view text, size_t begin, size_t end, bool normalized_pass,
                   std::vector<std::pair<size_t, size_t>>& out) const;
  void pre_tokenize(std::string_view text, size_t begin, size_t end, std::vector<std::pair<size_t, size_t>>& out) const;

  std::string file_, source_;
  std::vector<const icu::Normalizer2*> normalizers_;  // applied in order; none: the text as it is
  bpe::Merger merger_;
  std::vector<PreTokenizeStage> stages_;
  std::vector<AddedToken> added_;
  // The added tokens of each pass by their first byte, longest first (leftmost-longest matching).
  std::array<std::array<std::vector<const AddedToken*>, 256>, 2> starting_with_;
  std::vector<std::string> bytes_of_id_;  // what each id decodes to
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
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = type == "NFC"    ? icu::Normalizer2::getNFCInstance(status)
                                       : type == "NFD"  ? icu::Normalizer2::getNFDInstance(status)
                                       : type == "NFKC" ? icu::Normalizer2::getNFKCInstance(status)
                                       : type == "NFKD" ? icu::Normalizer2::getNFKDInstance(status)
                                                        : nullptr;
  if (normalizer == nullptr && U_SUCCESS(status)) unsupported(fmt::format("its normalizer is {}", type));
  if (U_FAILURE(status)) fail(fmt::format("ICU has no {} normalizer ({})", type, u_errorName(status)), "install ICU's data");
  normalizers_.push_back(normalizer);
}

std::string HuggingFaceTokenizer::normalize(std::string_view text) const {
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  for (const icu::Normalizer2* normalizer : normalizers_) {
    UErrorCode status = U_ZERO_ERROR;
    u = normalizer->normalize(u, status);
    if (U_FAILURE(status)) throw UsageError(fmt::format("{}: normalizing a text failed ({})", source_, u_errorName(status)));
  }
  std::string out;
  return u.toUTF8String(out);
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

void HuggingFaceTokenizer::read_model(const json& model) {
  const std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") unsupported(fmt::format("its model is of type {}", type));
  if (model.value("byte_fallback", false)) unsupported("its BPE model has byte_fallback (sentencepiece style)");
  if (!model.value("dropout", json()).is_null()) unsupported("its BPE model has dropout");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const json v = model.value(key, json()); !v.is_null() && v != "") unsupported(fmt::format("its BPE model has a {}", key));
  const auto table = byte_characters();
  std::map<char32_t, uint8_t> byte_of;
  for (int b = 0; b < 256; ++b) byte_of[table[b]] = static_cast<uint8_t>(b);
  std::unordered_map<std::string, int32_t> id_of;
  for (const auto& [token, value] : model.at("vocab").items()) {
    const int32_t id = value.get<int32_t>();
    id_of[token] = id;
    const auto bytes = byte_level_bytes(token, byte_of);
    set_token(id, bytes ? *bytes : token);  // ByteLevel's decoder keeps a token it cannot map as text
    if (bytes) merger_.add_token(*bytes, id);
    if (bytes && bytes->size() == 1) merger_.set_byte_id(static_cast<uint8_t>((*bytes)[0]), id);
  }
  merger_.set_whole_piece_first(model.value("ignore_merges", false));
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
    AddedToken token{t.at("content").get<std::string>(), t.at("id").get<int32_t>(), t.value("normalized", true)};
    set_token(token.id, token.content);
    if (!token.content.empty()) added_.push_back(std::move(token));
  }
  // Leftmost-longest: at a position, the longest token that starts there.
  std::stable_sort(added_.begin(), added_.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  for (const AddedToken& t : added_) starting_with_[t.normalized][static_cast<unsigned char>(t.content[0])].push_back(&t);
}

void HuggingFaceTokenizer::read_pre_tokenizer(const json& p) {
  if (p.is_null()) unsupported("it has no pre-tokenizer (a byte-level BPE needs ByteLevel)");
  const std::string type = p.at("type").get<std::string>();
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
      if (text.substr(i, std::min(end - i, t->content.size())) == t->content) {
        found = t;
        break;
      }
    if (found == nullptr) {
      ++i;
      continue;
    }
    if (i > start) out.emplace_back(start, i);
    out.emplace_back(std::string::npos, found->id);
    i += found->content.size();
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
  for (const auto& [b, e] : second)
    if (b == std::string::npos)
      pieces.emplace_back(b, e);
    else
      pre_tokenize(work, b, e, pieces);
  std::vector<int32_t> ids = bpe::encode_pieces(merger_, work, pieces, bpe::threads());
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
