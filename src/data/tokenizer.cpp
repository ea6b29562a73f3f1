#include "data/tokenizer.h"

#include <fmt/format.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <nlohmann/json.hpp>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "io/atomic_file.h"
#include "io/checksum.h"
#include "data/data.h"

namespace nibble::train {

namespace {

constexpr const char* kTokenizerFile = "tokenizer.json";
constexpr const char* kSentencePieceFile = "tokenizer.model";

void write_text_atomically(const std::filesystem::path& path, std::string_view text) {
  io::write_file_atomically(path, std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
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
    write_text_atomically(directory / kTokenizerFile, j.dump() + "\n");
  }
  std::string identity() const override { return io::content_hash("char\n" + alphabet_); }

 private:
  std::string alphabet_;
  CharTokenizer table_;
};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(std::string serialized_model, std::string_view source)
      : serialized_(std::move(serialized_model)) {
    auto status = processor_.LoadFromSerializedProto(serialized_);
    if (!status.ok())
      throw UsageError(fmt::format("{}: not a sentencepiece model ({}): run `nibble prepare` again", source,
                                   status.ToString()));
  }
  TokenizerKind kind() const override { return TokenizerKind::bpe; }
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
    j["type"] = "bpe";
    j["model"] = kSentencePieceFile;
    j["vocab_size"] = vocab_size();
    write_text_atomically(directory / kTokenizerFile, j.dump() + "\n");
  }
  std::string identity() const override { return io::content_hash("bpe\n" + serialized_); }

 private:
  std::string serialized_;
  sentencepiece::SentencePieceProcessor processor_;
};

// Feeds the corpus to the sentencepiece trainer line by line, without a temporary file.
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
      size_t end = text_.find('\n', position_);
      if (end == std::string_view::npos) end = text_.size();
      line_.assign(text_.substr(position_, end - position_));
      position_ = end + 1;
      if (!line_.empty()) return;
    }
    done_ = true;
  }
  std::string_view text_;
  size_t position_ = 0;
  std::string line_;
  bool done_ = false;
};

}  // namespace

TokenizerKind parse_tokenizer_kind(std::string_view name) {
  if (name == "char") return TokenizerKind::character;
  if (name == "bpe") return TokenizerKind::bpe;
  throw UsageError(fmt::format("tokenizer '{}' is unknown: use char or bpe", name));
}

std::string_view to_string(TokenizerKind kind) { return kind == TokenizerKind::character ? "char" : "bpe"; }

std::unique_ptr<Tokenizer> train_char_tokenizer(std::string_view corpus) {
  if (corpus.empty()) throw UsageError("the corpus is empty: a tokenizer needs at least one character");
  bool present[256] = {};
  for (unsigned char c : corpus) present[c] = true;
  std::string alphabet;
  for (int c = 0; c < 256; ++c)
    if (present[c]) alphabet.push_back(static_cast<char>(c));
  return std::make_unique<CharacterTokenizer>(std::move(alphabet));
}

std::unique_ptr<Tokenizer> train_bpe_tokenizer(std::string_view corpus, int64_t vocab_size) {
  bool present[256] = {};
  for (unsigned char c : corpus) present[c] = true;
  int64_t distinct = 0;
  for (bool p : present) distinct += p;
  // 256 byte-fallback pieces + <unk>, <s>, </s> + the characters themselves must fit below the
  // vocabulary size with room for merges.
  const int64_t minimum = 256 + 3 + distinct + 1;
  if (vocab_size < minimum || vocab_size > 1'000'000)
    throw UsageError(fmt::format("BPE vocab size {} is outside [{}, 1000000]: byte fallback alone takes 259 ids and "
                                 "this corpus has {} distinct bytes; pass --vocab-size {} or more",
                                 vocab_size, minimum, distinct, std::max<int64_t>(minimum, 512)));
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
                     " (a smaller --vocab-size or a larger corpus helps)");
  return std::make_unique<SentencePieceTokenizer>(std::move(serialized), "trained BPE model");
}

std::unique_ptr<Tokenizer> train_tokenizer(TokenizerKind kind, std::string_view corpus, int64_t bpe_vocab_size) {
  return kind == TokenizerKind::character ? train_char_tokenizer(corpus) : train_bpe_tokenizer(corpus, bpe_vocab_size);
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& directory) {
  const auto path = directory / kTokenizerFile;
  const auto bytes = io::read_file_bytes(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(bytes.begin(), bytes.end());
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(fmt::format("{}: not valid JSON ({}): the tokenizer file is damaged; copy it again from the data "
                                 "directory or re-run `nibble prepare`",
                                 path.string(), e.what()));
  }
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
    if (type == "bpe") {
      const auto model_path = directory / j.at("model").get<std::string>();
      const auto model = io::read_file_bytes(model_path);
      auto tokenizer = std::make_unique<SentencePieceTokenizer>(std::string(model.begin(), model.end()), model_path.string());
      if (tokenizer->vocab_size() != j.at("vocab_size").get<int64_t>())
        throw UsageError(fmt::format("{}: vocab_size {} disagrees with {} ({} pieces)", path.string(),
                                     j.at("vocab_size").get<int64_t>(), model_path.string(), tokenizer->vocab_size()));
      return tokenizer;
    }
    throw UsageError(fmt::format("{}: tokenizer type '{}' is unknown (char or bpe)", path.string(), type));
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(fmt::format("{}: missing or mistyped field ({})", path.string(), e.what()));
  }
}

}  // namespace nibble::train
