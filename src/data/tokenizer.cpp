#include "data/tokenizer.h"

#include <fmt/format.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "io/atomic_file.h"
#include "io/checksum.h"
#include "data/data.h"
#include "data/data_directory.h"
#include "data/huggingface_tokenizer.h"
#include "data/tiktoken_tokenizer.h"
#include "io/regular_file.h"

namespace nibble::train {

namespace {

void write_text_atomically(const std::filesystem::path& path, std::string_view text) {
  io::write_file_atomically(path, std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

// Where char and bpe describe themselves in `directory`: nibble_tokenizer.json (their description
// is no Hugging Face tokenizer.json), except in a directory an earlier nibble wrote, whose
// tokenizer.json (of the same tokenizer: a resumed run's) is rewritten, so it keeps one description.
std::filesystem::path own_description(const std::filesystem::path& directory) {
  std::error_code ec;
  const bool earlier = std::filesystem::exists(directory / kTokenizerFile, ec) &&
                       !std::filesystem::exists(directory / kNibbleTokenizerFile, ec);
  return directory / (earlier ? kTokenizerFile : kNibbleTokenizerFile);
}

class CharacterTokenizer final : public Tokenizer {
 public:
  // `alphabet`: the distinct bytes of the corpus in increasing order (CharTokenizer's vocabulary).
  explicit CharacterTokenizer(std::string alphabet) : alphabet_(std::move(alphabet)), table_(alphabet_) {}
  TokenizerKind kind() const override { return TokenizerKind::character; }
  int64_t vocab_size() const override { return table_.vocab_size(); }
  std::vector<int32_t> encode(std::string_view text) const override { return table_.encode(text); }
  std::string decode(std::span<const int32_t> ids) const override {
    return table_.decode(std::vector<int32_t>(ids.begin(), ids.end()));
  }
  void save(const std::filesystem::path& directory) const override {
    nlohmann::json j;
    j["type"] = "char";
    // Byte values, not a string: the alphabet may hold bytes that are not valid UTF-8 on their own.
    std::vector<int> bytes;
    for (unsigned char c : alphabet_) bytes.push_back(c);
    j["bytes"] = bytes;
    write_text_atomically(own_description(directory), j.dump() + "\n");
  }
  std::string identity() const override { return io::content_hash("char\n" + alphabet_); }

 private:
  std::string alphabet_;
  CharTokenizer table_;
};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  // `kind`: bpe for the model nibble trained (documents are not marked, as always), sentencepiece
  // for one given to `prepare --tokenizer x.model` (each document in its BOS and EOS).
  explicit SentencePieceTokenizer(std::string serialized_model, std::string_view source,
                                  TokenizerKind kind = TokenizerKind::bpe)
      : serialized_(std::move(serialized_model)), kind_(kind) {
    auto status = processor_.LoadFromSerializedProto(serialized_);
    if (!status.ok())
      throw UsageError(fmt::format("{}: not a sentencepiece model ({}): {}", source, status.ToString(),
                                   kind == TokenizerKind::bpe ? "run `nibble prepare` again"
                                                              : "give a tokenizer.model that sentencepiece reads"));
  }
  TokenizerKind kind() const override { return kind_; }
  std::optional<int32_t> begin_of_text() const override { return special(processor_.bos_id()); }
  std::optional<int32_t> end_of_text() const override { return special(processor_.eos_id()); }
  std::string token_text(int32_t id) const override { return processor_.IdToPiece(id); }
  std::vector<int32_t> encode_prompt(std::string_view text) const override {
    std::vector<int32_t> ids = encode(text);
    if (const auto bos = begin_of_text()) ids.insert(ids.begin(), *bos);
    return ids;
  }
  std::vector<int32_t> encode_document(std::string_view text) const override {
    std::vector<int32_t> ids = encode_prompt(text);
    if (const auto eos = end_of_text()) ids.push_back(*eos);
    return ids;
  }
  int64_t vocab_size() const override { return processor_.GetPieceSize(); }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int> ids;
    auto status = processor_.Encode(text, &ids);
    if (!status.ok()) throw UsageError("sentencepiece could not encode the text: " + status.ToString());
    return std::vector<int32_t>(ids.begin(), ids.end());
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::vector<int> valid;
    std::string out;
    // Decode runs of valid ids; an id outside the vocabulary shows as '?' (as for char).
    auto flush = [&] {
      std::string piece;
      if (!valid.empty() && processor_.Decode(valid, &piece).ok()) out += piece;
      valid.clear();
    };
    for (int32_t id : ids) {
      if (id >= 0 && id < vocab_size()) {
        valid.push_back(id);
      } else {
        flush();
        out.push_back('?');
      }
    }
    flush();
    return out;
  }
  void save(const std::filesystem::path& directory) const override {
    write_text_atomically(directory / kSentencePieceFile, serialized_);
    nlohmann::json j;
    j["type"] = std::string(to_string(kind_));
    j["model"] = kSentencePieceFile;
    j["vocab_size"] = vocab_size();
    // No Hugging Face tokenizer.json, so not called one (own_description).
    write_text_atomically(kind_ == TokenizerKind::bpe ? own_description(directory) : directory / kNibbleTokenizerFile,
                          j.dump() + "\n");
  }
  std::string identity() const override {
    return io::content_hash(std::string(to_string(kind_)) + "\n" + serialized_);
  }
  std::optional<std::string> converted_to_huggingface() const override;

 private:
  // nibble's own BPE has <s> and </s> too, but documents were never marked with them.
  std::optional<int32_t> special(int id) const {
    return kind_ == TokenizerKind::sentencepiece && id >= 0 ? std::optional<int32_t>(id) : std::nullopt;
  }
  std::string serialized_;
  TokenizerKind kind_;
  sentencepiece::SentencePieceProcessor processor_;
};

// The code points of `piece` as byte offsets (its end included).
std::vector<size_t> code_point_starts(const std::string& piece) {
  std::vector<size_t> starts;
  for (size_t i = 0; i < piece.size(); ++i)
    if ((static_cast<unsigned char>(piece[i]) & 0xC0) != 0x80) starts.push_back(i);
  starts.push_back(piece.size());
  return starts;
}

// The settings of a sentencepiece model that decide whether and how it converts to a Hugging Face
// tokenizer.json, read from its serialized ModelProto (protobuf wire format; sentencepiece's C++ API
// exposes the proto only through generated headers Debian does not ship). Field numbers and proto2
// defaults of sentencepiece_model.proto: ModelProto.pieces 1 (SentencePiece.type 3), .trainer_spec 2,
// .normalizer_spec 3;
// TrainerSpec.model_type 3 (UNIGRAM 1, BPE 2), .treat_whitespace_as_suffix 24, .byte_fallback 35;
// NormalizerSpec.name 1, .add_dummy_prefix 3 (true), .remove_extra_whitespaces 4 (true),
// .escape_whitespaces 5 (true).
struct SentencePieceSettings {
  int model_type = 1;
  bool byte_fallback = false, whitespace_as_suffix = false;
  std::string normalizer = "";
  bool dummy_prefix = true, remove_extra_whitespaces = true, escape_whitespaces = true;
  bool user_defined_pieces = false;  // a piece of type USER_DEFINED (4): matched whole, before BPE
};

// Calls field(number, varint, bytes) for each field of the message in `b`; false when malformed.
template <class Field>
bool for_each_field(std::string_view b, Field&& field) {
  size_t i = 0;
  auto varint = [&](uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64 && i < b.size(); shift += 7) {
      const auto byte = static_cast<uint8_t>(b[i++]);
      v |= uint64_t{byte & 0x7Fu} << shift;
      if (!(byte & 0x80)) return true;
    }
    return false;
  };
  while (i < b.size()) {
    uint64_t key = 0, v = 0;
    if (!varint(key)) return false;
    switch (key & 7) {
      case 0: if (!varint(v)) return false; field(key >> 3, v, std::string_view()); break;
      case 1: if (b.size() - i < 8) return false; i += 8; break;
      case 5: if (b.size() - i < 4) return false; i += 4; break;
      case 2:
        if (!varint(v) || v > b.size() - i) return false;
        field(key >> 3, 0, b.substr(i, v));
        i += v;
        break;
      default: return false;
    }
  }
  return true;
}

SentencePieceSettings read_settings(std::string_view model) {
  SentencePieceSettings s;
  for_each_field(model, [&](uint64_t number, uint64_t, std::string_view message) {
    if (number == 1)
      for_each_field(message, [&](uint64_t n, uint64_t v, std::string_view) { s.user_defined_pieces |= n == 3 && v == 4; });
    if (number == 2)
      for_each_field(message, [&](uint64_t n, uint64_t v, std::string_view) {
        if (n == 3) s.model_type = static_cast<int>(v);
        if (n == 24) s.whitespace_as_suffix = v != 0;
        if (n == 35) s.byte_fallback = v != 0;
      });
    if (number == 3)
      for_each_field(message, [&](uint64_t n, uint64_t v, std::string_view bytes) {
        if (n == 1) s.normalizer = std::string(bytes);
        if (n == 3) s.dummy_prefix = v != 0;
        if (n == 4) s.remove_extra_whitespaces = v != 0;
        if (n == 5) s.escape_whitespaces = v != 0;
      });
  });
  return s;
}

// A sentencepiece BPE model as a Hugging Face BPE tokenizer.json that encodes to the same ids, so
// that transformers loads an export without sentencepiece or protobuf, as transformers' own
// converter for Llama does: the pieces as the vocabulary, a space as "▁" (sentencepiece's
// whitespace escape), "▁" prepended where the model adds a dummy prefix, byte fallback to <0xNN>,
// and the merges the pieces imply: every split of a piece into two pieces, ranked by the merged
// piece's score (sentencepiece BPE merges the highest-scoring pair first). Pieces never span a word
// start ("▁" only begins one), so merging over the whole text as Hugging Face does meets the same
// pairs as sentencepiece merging word by word. A given model (`prepare --tokenizer x.model`) also
// gets its <s> in front, as nibble's documents and prompts have it. Models outside what this
// expresses exactly (unigram, no byte fallback, a normalization other than identity, whitespace
// folding, user-defined pieces) have none: their export keeps the tokenizer.model alone.
std::optional<std::string> SentencePieceTokenizer::converted_to_huggingface() const {
  const SentencePieceSettings settings = read_settings(serialized_);
  if (settings.model_type != 2 || !settings.byte_fallback || settings.whitespace_as_suffix ||
      settings.normalizer != "identity" || settings.remove_extra_whitespaces || !settings.escape_whitespaces ||
      settings.user_defined_pieces)
    return std::nullopt;
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  std::unordered_map<std::string, int> normal;  // piece -> id, the pieces merges may make or use
  nlohmann::json added = nlohmann::json::array();
  for (int id = 0; id < processor_.GetPieceSize(); ++id) {
    const std::string piece = processor_.IdToPiece(id);
    vocab[piece] = id;
    if (processor_.IsControl(id) || processor_.IsUnknown(id))
      added.push_back({{"id", id}, {"content", piece}, {"single_word", false}, {"lstrip", false},
                       {"rstrip", false}, {"normalized", false}, {"special", true}});
    else if (!processor_.IsByte(id) && !processor_.IsUnused(id))
      normal.emplace(piece, id);
  }
  struct Merge {
    float score;
    int merged, left;
    std::string l, r;
  };
  std::vector<Merge> merges;
  for (const auto& [piece, id] : normal) {
    const std::vector<size_t> starts = code_point_starts(piece);
    for (size_t k = 1; k + 1 < starts.size(); ++k) {
      const std::string l = piece.substr(0, starts[k]), r = piece.substr(starts[k]);
      const auto left = normal.find(l);
      if (left != normal.end() && normal.count(r)) merges.push_back({processor_.GetScore(id), id, left->second, l, r});
    }
  }
  std::sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    return a.score != b.score ? a.score > b.score : a.merged != b.merged ? a.merged < b.merged : a.left < b.left;
  });
  nlohmann::json merge_list = nlohmann::json::array();
  for (const Merge& m : merges) merge_list.push_back({m.l, m.r});
  nlohmann::ordered_json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = added;
  const nlohmann::json space = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}};
  j["normalizer"] = settings.dummy_prefix
                        ? nlohmann::json{{"type", "Sequence"},
                                         {"normalizers", {{{"type", "Prepend"}, {"prepend", "\u2581"}}, space}}}
                        : space;
  j["pre_tokenizer"] = nullptr;
  j["post_processor"] = nullptr;
  if (const auto bos = special(processor_.bos_id())) {
    const std::string b = processor_.IdToPiece(*bos);
    j["post_processor"] = {
        {"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", b}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair",
         {{{"SpecialToken", {{"id", b}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
          {{"SpecialToken", {{"id", b}, {"type_id", 1}}}}, {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
        {"special_tokens", {{b, {{"id", b}, {"ids", {*bos}}, {"tokens", {b}}}}}}};
  }
  nlohmann::json decoders = {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                             {{"type", "ByteFallback"}},
                             {{"type", "Fuse"}}};
  if (settings.dummy_prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  j["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
  j["model"] = {{"type", "BPE"},           {"dropout", nullptr},       {"unk_token", processor_.IdToPiece(processor_.unk_id())},
                {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr}, {"fuse_unk", true},
                {"byte_fallback", true},   {"ignore_merges", false},   {"vocab", vocab},
                {"merges", merge_list}};
  return j.dump(2) + "\n";
}

// sentencepiece's BPE trainer splits sentences into words at spaces and indexes a word's characters
// in 16 bits through a signed shift: a word of 32770 characters makes it write out of bounds
// (SIGSEGV), one of 65537 aborts the process; and it drops a sentence of more than
// max_sentence_length bytes. So no sentence it sees is longer than this many bytes.
constexpr size_t kMaxSentenceBytes = 32768;

// Where the sentence that starts at `start` of a line ending at `end` ends: the rest of the line if
// it fits, else before the last space that fits (the trainer splits words there anyway, so the cut
// changes nothing it learns), else between two characters (only a run of 32768 bytes without a
// space, which no text has, is cut inside a word). `text` is valid UTF-8.
size_t sentence_end(std::string_view text, size_t start, size_t end) {
  if (end - start <= kMaxSentenceBytes) return end;
  const size_t space = text.substr(start, kMaxSentenceBytes + 1).rfind(' ');
  if (space != std::string_view::npos && space > 0) return start + space;
  size_t cut = start + kMaxSentenceBytes;
  while ((static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // a UTF-8 continuation byte
  return cut;
}

// Feeds the corpus to the sentencepiece trainer line by line (long lines cut as above), without a
// temporary file.
class LineIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(std::string_view text) : text_(text) { advance(); }
  bool done() const override { return done_; }
  void Next() override { advance(); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void advance() {
    // Empty lines carry nothing to learn; skipping them keeps the trainer from warning.
    while (position_ < text_.size()) {
      // The line break is looked for only as far as a sentence can reach, so that a line of
      // gigabytes is not searched again for each of its sentences; sentence_end cuts a line that
      // goes on beyond that within this window.
      const std::string_view window = text_.substr(position_, kMaxSentenceBytes + 1);
      const size_t line_end = position_ + std::min(window.find('\n'), window.size());
      const size_t cut = sentence_end(text_, position_, line_end);
      line_.assign(text_.substr(position_, cut - position_));
      position_ = cut == line_end ? cut + 1 : cut;  // past the line break, or on to the line's next sentence
      if (!line_.empty()) return;
    }
    done_ = true;
  }
  std::string_view text_;
  size_t position_ = 0;
  std::string line_;
  bool done_ = false;
};

// The length of the UTF-8 character at text[i], 0 when the bytes there are not one.
size_t utf8_length(std::string_view text, size_t i) {
  auto byte = [&](size_t k) { return i + k < text.size() ? static_cast<unsigned char>(text[i + k]) : 0u; };
  auto continuation = [&](size_t k, unsigned lo = 0x80, unsigned hi = 0xBF) { return byte(k) >= lo && byte(k) <= hi; };
  const unsigned b = byte(0);
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return continuation(1) ? 2 : 0;
  // The second byte's range excludes overlong forms (E0, F0), surrogates (ED) and > U+10FFFF (F4).
  if (b >= 0xE0 && b <= 0xEF) {
    const bool second = b == 0xE0 ? continuation(1, 0xA0) : b == 0xED ? continuation(1, 0x80, 0x9F) : continuation(1);
    return second && continuation(2) ? 3 : 0;
  }
  if (b >= 0xF0 && b <= 0xF4) {
    const bool second = b == 0xF0 ? continuation(1, 0x90) : b == 0xF4 ? continuation(1, 0x80, 0x8F) : continuation(1);
    return second && continuation(2) && continuation(3) ? 4 : 0;
  }
  return 0;
}

// How many characters the trainer must give a piece of their own (its required_chars): the
// distinct code points of the corpus but the line break it splits at and the tab and NUL it drops,
// with the space counted as the U+2581 it writes for it. `corpus` is valid UTF-8.
int64_t required_characters(std::string_view corpus) {
  std::vector<bool> seen(0x110000, false);
  for (size_t i = 0; i < corpus.size();) {
    const size_t n = std::max<size_t>(1, utf8_length(corpus, i));
    char32_t c = n == 1 ? static_cast<unsigned char>(corpus[i]) : static_cast<unsigned char>(corpus[i]) & (0x7F >> n);
    for (size_t k = 1; k < n; ++k) c = (c << 6) | (static_cast<unsigned char>(corpus[i + k]) & 0x3F);
    seen[c == U' ' ? 0x2581 : c] = true;
    i += n;
  }
  seen[U'\n'] = seen[U'\t'] = seen[0] = false;
  return std::count(seen.begin(), seen.end(), true);
}

// Refuses, before sentencepiece sees them, a corpus and vocabulary size its trainer would crash on
// (bytes that are not UTF-8) or refuse with advice about its own flags.
void check_bpe_request(std::string_view corpus, int64_t vocab_size) {
  if (const auto bad = first_invalid_utf8(corpus))
    throw UsageError(fmt::format("the corpus is not UTF-8 text: the byte 0x{:02X} at offset {} begins no UTF-8 "
                                 "character; the BPE tokenizer learns from UTF-8 text: convert it (e.g. iconv -f "
                                 "LATIN1 -t UTF-8) or use --tokenizer char, which takes any bytes",
                                 static_cast<unsigned char>(corpus[*bad]), *bad));
  // 256 byte-fallback pieces + <unk>, <s>, </s> + each character's own piece must fit below the
  // vocabulary size with room for merges.
  constexpr int64_t kMaxVocab = 1'000'000;
  const int64_t characters = required_characters(corpus);
  const int64_t minimum = 256 + 3 + characters + 1;
  if (minimum > kMaxVocab)
    throw UsageError(fmt::format("this corpus has {} distinct characters, too many for a BPE vocabulary of at most {} "
                                 "ids: use --tokenizer char",
                                 characters, kMaxVocab));
  if (vocab_size < minimum || vocab_size > kMaxVocab)
    throw UsageError(fmt::format("BPE vocab size {} is outside [{}, {}]: byte fallback alone takes 259 ids and "
                                 "this corpus has {} distinct characters; pass --vocab-size {} or more",
                                 vocab_size, minimum, kMaxVocab, characters, std::max<int64_t>(minimum, 512)));
}

}  // namespace

TokenizerKind parse_tokenizer_kind(std::string_view name) {
  if (name == "char") return TokenizerKind::character;
  if (name == "bpe") return TokenizerKind::bpe;
  throw UsageError(fmt::format("tokenizer '{}' is unknown: use char, bpe, or the path of a tokenizer file "
                               "(a Hugging Face tokenizer.json, a sentencepiece .model, a .tiktoken file)",
                               name));
}

std::string_view to_string(TokenizerKind kind) {
  switch (kind) {
    case TokenizerKind::character: return "char";
    case TokenizerKind::bpe: return "bpe";
    case TokenizerKind::huggingface: return "huggingface";
    case TokenizerKind::sentencepiece: return "sentencepiece";
    case TokenizerKind::tiktoken: return "tiktoken";
  }
  return "?";
}

std::unique_ptr<Tokenizer> train_char_tokenizer(std::string_view corpus) {
  if (corpus.empty()) throw UsageError("the corpus is empty: a tokenizer needs at least one character");
  bool present[256] = {};
  for (unsigned char c : corpus) present[c] = true;
  std::string alphabet;
  for (int c = 0; c < 256; ++c)
    if (present[c]) alphabet.push_back(static_cast<char>(c));
  return std::make_unique<CharacterTokenizer>(std::move(alphabet));
}

std::optional<size_t> first_invalid_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_length(text, i);
    if (n == 0) return i;
    i += n;
  }
  return std::nullopt;
}

std::unique_ptr<Tokenizer> train_bpe_tokenizer(std::string_view corpus, int64_t vocab_size) {
  check_bpe_request(corpus, vocab_size);
  LineIterator lines(corpus);
  if (lines.done()) throw UsageError("the corpus has no non-empty line: BPE needs text to learn from");
  const std::unordered_map<std::string, std::string> options = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"byte_fallback", "true"},
      // Identity normalisation and no dummy prefix / whitespace folding: decode(encode(x)) == x.
      {"normalization_rule_name", "identity"},
      {"add_dummy_prefix", "false"},
      {"remove_extra_whitespaces", "false"},
      {"split_digits", "true"},
      {"character_coverage", "1.0"},
      {"max_sentence_length", "1000000"},
      {"num_threads", "2"},
      {"minloglevel", "2"},
      // A fixed seed and sentence budget keep training deterministic for a given corpus.
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"hard_vocab_limit", "false"},
      {"model_prefix", ""},
  };
  std::string serialized;
  auto status = sentencepiece::SentencePieceTrainer::Train(options, &lines, &serialized);
  if (!status.ok())
    throw UsageError("sentencepiece could not train a BPE tokenizer on this corpus: " + status.ToString() +
                     " (--tokenizer char works on any text)");
  return std::make_unique<SentencePieceTokenizer>(std::move(serialized), "trained BPE model");
}

std::unique_ptr<Tokenizer> train_tokenizer(TokenizerKind kind, std::string_view corpus, int64_t bpe_vocab_size) {
  return kind == TokenizerKind::character ? train_char_tokenizer(corpus) : train_bpe_tokenizer(corpus, bpe_vocab_size);
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& directory) {
  std::error_code ec;
  const char* name = std::filesystem::exists(directory / kNibbleTokenizerFile, ec) ? kNibbleTokenizerFile : kTokenizerFile;
  const auto path = directory / name;
  const auto bytes = read_data_file(directory, name, "a tokenizer file");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(bytes.begin(), bytes.end());
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(fmt::format("{}: not valid JSON ({}): the tokenizer file is damaged; copy it again from the data "
                                 "directory or re-run `nibble prepare`",
                                 path.string(), e.what()));
  }
  if (looks_like_huggingface_tokenizer(j)) return load_huggingface_tokenizer(std::string(bytes.begin(), bytes.end()), path.string());
  try {
    const std::string type = j.at("type").get<std::string>();
    if (type == "char") {
      std::string alphabet;
      int previous = -1;
      for (const auto& b : j.at("bytes")) {
        const int v = b.get<int>();
        if (v <= previous || v > 255) throw UsageError(fmt::format("{}: byte list is not increasing in [0, 255]", path.string()));
        previous = v;
        alphabet.push_back(static_cast<char>(v));
      }
      if (alphabet.empty()) throw UsageError(fmt::format("{}: the char vocabulary is empty", path.string()));
      return std::make_unique<CharacterTokenizer>(std::move(alphabet));
    }
    if (type == "bpe" || type == "sentencepiece") {
      const std::string model_name = j.at("model").get<std::string>();
      // A name, not a path: the tokenizer is read from its own directory and nothing else (a copied
      // or edited tokenizer.json must not make nibble read /dev/zero or another run's files).
      if (model_name.empty() || model_name == "." || model_name == ".." ||
          model_name.find_first_of(std::string_view("/\0", 2)) != std::string::npos)
        throw UsageError(fmt::format("{}: \"model\" is '{}', not the name of a file beside it ({}): the tokenizer "
                                     "file is damaged or was edited; copy it again or re-run `nibble prepare`",
                                     path.string(), model_name, kSentencePieceFile));
      const auto model_path = directory / model_name;
      const auto model = read_data_file(directory, model_name, "a sentencepiece model");
      auto tokenizer = std::make_unique<SentencePieceTokenizer>(
          std::string(model.begin(), model.end()), model_path.string(),
          type == "bpe" ? TokenizerKind::bpe : TokenizerKind::sentencepiece);
      if (tokenizer->vocab_size() != j.at("vocab_size").get<int64_t>())
        throw UsageError(fmt::format("{}: vocab_size {} disagrees with {} ({} pieces)", path.string(),
                                     j.at("vocab_size").get<int64_t>(), model_path.string(), tokenizer->vocab_size()));
      return tokenizer;
    }
    if (type == "tiktoken") {
      // The file's name is fixed, whatever the pointer says: nothing else is read.
      const auto ranks = read_data_file(directory, kTiktokenFile, "a tiktoken file");
      return load_tiktoken_tokenizer(std::string(ranks.begin(), ranks.end()), j.at("encoding").get<std::string>(),
                                     (directory / kTiktokenFile).string());
    }
    throw UsageError(fmt::format("{}: tokenizer type '{}' is unknown (char, bpe, sentencepiece or tiktoken)", path.string(), type));
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(fmt::format("{}: missing or mistyped field ({})", path.string(), e.what()));
  }
}

bool has_tokenizer(const std::filesystem::path& directory) {
  std::error_code ec;
  return std::filesystem::exists(directory / kNibbleTokenizerFile, ec) || std::filesystem::exists(directory / kTokenizerFile, ec);
}

std::unique_ptr<Tokenizer> load_tokenizer_file(const std::filesystem::path& file, std::string_view tiktoken_encoding) {
  const auto bytes = io::read_regular_file(file, "a tokenizer file");
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  if (file.extension() == ".tiktoken" || looks_like_tiktoken_file(text)) {
    const std::string encoding = tiktoken_encoding.empty() ? file.stem().string() : std::string(tiktoken_encoding);
    return load_tiktoken_tokenizer(std::string(text), encoding, file.string());
  }
  const nlohmann::json j = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    // Not JSON: a sentencepiece model (a protobuf) is the other kind nibble reads.
    sentencepiece::SentencePieceProcessor probe;
    const std::string model(bytes.begin(), bytes.end());
    if (probe.LoadFromSerializedProto(model).ok())
      return std::make_unique<SentencePieceTokenizer>(model, file.string(), TokenizerKind::sentencepiece);
    throw UsageError(fmt::format("{}: not a tokenizer nibble reads: neither JSON (a Hugging Face tokenizer.json), a "
                                 "sentencepiece model (tokenizer.model) nor a tiktoken file (NAME.tiktoken)",
                                 file.string()));
  }
  if (!looks_like_huggingface_tokenizer(j))
    throw UsageError(fmt::format("{}: a JSON file, but not a Hugging Face tokenizer.json (no \"model\" object and "
                                 "\"added_tokens\" list): give the tokenizer.json of a model",
                                 file.string()));
  return load_huggingface_tokenizer(std::string(bytes.begin(), bytes.end()), file.string());
}

}  // namespace nibble::train
