// `nibble prepare`: text files into a data directory (data/shards.h, data/data_directory.h).
#include <fmt/format.h>

#include <atomic>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "data/bpe.h"
#include "data/data.h"
#include "data/data_directory.h"
#include "data/shards.h"

namespace nibble::train {

namespace fs = std::filesystem;

namespace {

// A text input is read to its end: a directory would read as no text at all, and a device
// (/dev/zero, /dev/urandom) has no end. A FIFO is a stream with an end (`prepare <(zcat x.gz)`).
void check_text_input(const fs::path& input) {
  std::error_code ec;
  const auto status = fs::status(input, ec);
  if (fs::is_directory(status))
    throw UsageError(fmt::format("'{}' is a directory: `nibble prepare` takes text files; pass the files in it "
                                 "(e.g. {}/*.txt)",
                                 input.string(), input.string()));
  if (fs::is_character_file(status) || fs::is_block_file(status) || fs::is_socket(status))
    throw UsageError(fmt::format("'{}' is a device or socket, not a text file: `nibble prepare` reads each input to its "
                                 "end; give text files",
                                 input.string()));
}

// The inputs concatenated in order. For BPE each must be UTF-8, checked file by file so that the
// message names the file and the offset in it.
std::string read_corpus(const PrepareOptions& options) {
  std::string text;
  for (const auto& input : options.inputs) {
    const std::string part = read_text_file(input.string());
    if (options.tokenizer == TokenizerKind::bpe)
      if (const auto bad = first_invalid_utf8(part))
        throw UsageError(fmt::format("{}: the byte 0x{:02X} at offset {} begins no UTF-8 character, and the BPE "
                                     "tokenizer learns from UTF-8 text: convert the file (e.g. iconv -f LATIN1 -t "
                                     "UTF-8) or use --tokenizer char, which takes any bytes",
                                     input.string(), static_cast<unsigned char>(part[*bad]), *bad));
    text += part;
  }
  if (text.empty()) throw UsageError("the input text is empty: prepare needs a corpus");
  return text;
}

// Documents encoded on bpe::threads() threads, each taking the next document not yet taken: many
// small documents (web pages) keep every thread busy, as a large one does inside encode().
std::vector<std::vector<int32_t>> encode_in_parallel(const Tokenizer& tokenizer, const std::vector<std::string>& documents) {
  std::vector<std::vector<int32_t>> encoded(documents.size());
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&] {
    for (size_t i; (i = next++) < documents.size();) {
      try {
        encoded[i] = tokenizer.encode_document(documents[i]);
      } catch (...) {
        const std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
        next = documents.size();  // the others stop too
      }
    }
  };
  std::vector<std::thread> workers;
  const size_t n = std::min<size_t>(bpe::threads(), documents.size());
  for (size_t t = 1; t < n; ++t) workers.emplace_back(work);
  work();
  for (auto& w : workers) w.join();
  if (error) std::rethrow_exception(error);
  return encoded;
}

// A loaded tokenizer's corpus: each input a document (data/tokenizer.h encode_document), each
// checked to be UTF-8 first so that the message names the file and the offset in it.
std::vector<int32_t> encode_documents(const PrepareOptions& options, const Tokenizer& tokenizer, int64_t& bytes) {
  std::vector<std::string> documents;
  for (const auto& input : options.inputs) {
    documents.push_back(read_text_file(input.string()));
    const std::string& part = documents.back();
    if (const auto bad = first_invalid_utf8(part))
      throw UsageError(fmt::format("{}: the byte 0x{:02X} at offset {} begins no UTF-8 character, and {} encodes "
                                   "UTF-8 text: convert the file (e.g. iconv -f LATIN1 -t UTF-8)",
                                   input.string(), static_cast<unsigned char>(part[*bad]), *bad,
                                   options.tokenizer_file.string()));
    bytes += static_cast<int64_t>(part.size());
  }
  if (bytes == 0) throw UsageError("the input text is empty: prepare needs a corpus");
  const std::vector<std::vector<int32_t>> encoded = encode_in_parallel(tokenizer, documents);
  std::vector<int32_t> ids;
  for (const auto& document : encoded) ids.insert(ids.end(), document.begin(), document.end());
  return ids;
}

nlohmann::json prepare_record(const PrepareOptions& options, const PrepareResult& r, TokenizerKind kind) {
  nlohmann::json info;
  std::vector<std::string> inputs;
  for (const auto& input : options.inputs) inputs.push_back(input.string());
  info["inputs"] = inputs;
  info["tokenizer"] = std::string(to_string(kind));
  if (!options.tokenizer_file.empty()) {
    info["tokenizer_file"] = options.tokenizer_file.string();
    info["end_of_text"] = r.end_of_text ? nlohmann::json(*r.end_of_text) : nlohmann::json();
  }
  info["vocab_size"] = r.vocab_size;
  info["characters"] = r.characters;
  info["train_tokens"] = r.train_tokens;
  info["val_tokens"] = r.val_tokens;
  return info;
}

}  // namespace

PrepareResult prepare_dataset(const PrepareOptions& options) {
  if (options.inputs.empty()) throw UsageError("prepare needs at least one text file");
  for (const auto& input : options.inputs) check_text_input(input);
  check_prepare_output(options.output_dir, options.inputs, options.force);
  PrepareResult result;
  std::unique_ptr<Tokenizer> tokenizer;
  TokenSplit split;
  if (options.tokenizer_file.empty()) {
    const std::string text = read_corpus(options);
    tokenizer = train_tokenizer(options.tokenizer, text, options.bpe_vocab_size);
    split = split_tokens(tokenizer->encode(text));
    result.characters = static_cast<int64_t>(text.size());
  } else {
    tokenizer = load_tokenizer_file(options.tokenizer_file, options.tiktoken_encoding);
    split = split_tokens(encode_documents(options, *tokenizer, result.characters));
    result.end_of_text = tokenizer->end_of_text();
    if (result.end_of_text) result.end_of_text_token = tokenizer->token_text(*result.end_of_text);
    result.begin_of_text = tokenizer->begin_of_text();
    if (result.begin_of_text) result.begin_of_text_token = tokenizer->token_text(*result.begin_of_text);
  }
  if (split.val.size() < 2 || split.train.size() < 2)
    throw UsageError(fmt::format("the corpus gives only {} tokens: too few for a train/validation split",
                                 split.train.size() + split.val.size()));

  result.vocab_size = tokenizer->vocab_size();
  result.train_tokens = static_cast<int64_t>(split.train.size());
  result.val_tokens = static_cast<int64_t>(split.val.size());
  const fs::path destination = data_directory_destination(options.output_dir);
  // Said at once: the prepare that removes them may still fail (on a full disk, say).
  for (const fs::path& stale : remove_stale_prepare_directories(destination))
    fmt::print("removed {}, left by a prepare that did not finish\n", stale.string());
  StagedDataDirectory staged(destination);
  tokenizer->save(staged.path());
  write_token_shard(staged.path() / kTrainShardFile, split.train, tokenizer->vocab_size());
  write_token_shard(staged.path() / kValShardFile, split.val, tokenizer->vocab_size());
  for (const char* name : {kTokenizerFile, kSentencePieceFile, kTiktokenFile, kNibbleTokenizerFile})
    if (fs::exists(staged.path() / name)) result.tokenizer_files += (result.tokenizer_files.empty() ? "" : ", ") + std::string(name);
  write_prepare_record(staged.path(), prepare_record(options, result, tokenizer->kind()));
  result.replaced = staged.commit(options.force);
  return result;
}

}  // namespace nibble::train
