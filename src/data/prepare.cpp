// `nibble prepare`: text and JSON-lines files into a data directory (data/shards.h,
// data/data_directory.h), streamed: inputs are read in batches, encoded in parallel and written in
// order to shard series, so memory stays bounded whatever the corpus size.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "data/bpe.h"
#include "data/data.h"
#include "data/data_directory.h"
#include "data/prepare_inputs.h"
#include "data/shards.h"

namespace nibble::train {

namespace fs = std::filesystem;

namespace {

// What sentencepiece's trainer learns from: the corpus's first this many bytes (all of a smaller
// corpus, so that its model is the one a whole-corpus prepare always trained).
constexpr size_t kBpeSampleBytes = size_t{64} << 20;

// The progress line on stderr: rewritten in place on a terminal, a line every 10 s otherwise
// (a log file), and a summary at the end.
class Progress {
 public:
  Progress(bool enabled, std::optional<uint64_t> total) : enabled_(enabled), tty_(::isatty(STDERR_FILENO)), total_(total) {}
  void phase(std::string label) {
    end_line();
    label_ = std::move(label);
    start_ = last_ = Clock::now();
  }
  void update(uint64_t bytes, int64_t documents, uint64_t tokens) {
    bytes_ = bytes, documents_ = documents, tokens_ = tokens;
    const auto now = Clock::now();
    if (!enabled_ || now - last_ < (tty_ ? std::chrono::milliseconds(250) : std::chrono::milliseconds(10000))) return;
    last_ = now;
    fmt::print(stderr, "{}{}{}", tty_ ? "\r" : "", line(), tty_ ? "\033[K" : "\n");
    shown_ = tty_;
  }
  // The last figures as a line of their own.
  void summary() {
    if (!enabled_) return;
    end_line();
    fmt::print(stderr, "{} in {:.1f} s\n", line(false), seconds());
  }

 private:
  using Clock = std::chrono::steady_clock;
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  std::string line(bool eta = true) const {
    const double s = std::max(seconds(), 1e-3), mb = static_cast<double>(bytes_) / 1e6;
    std::string read = total_ ? fmt::format("{:.1f} of {:.1f} MB ({:.0f}%)", mb, static_cast<double>(*total_) / 1e6,
                                            *total_ ? 100.0 * static_cast<double>(bytes_) / static_cast<double>(*total_) : 100.0)
                              : fmt::format("{:.1f} MB", mb);
    std::string text = fmt::format("prepare: {}: {}, {} documents, {} tokens, {:.1f} MB/s, {:.0f} tokens/s", label_, read,
                                   documents_, tokens_, mb / s, static_cast<double>(tokens_) / s);
    if (eta && total_ && bytes_ > 0 && *total_ > bytes_)
      text += fmt::format(", ETA {:.0f} s", static_cast<double>(*total_ - bytes_) / (static_cast<double>(bytes_) / s));
    return text;
  }
  void end_line() {
    if (shown_) fmt::print(stderr, "\n");
    shown_ = false;
  }
  const bool enabled_, tty_;
  const std::optional<uint64_t> total_;
  std::string label_;
  Clock::time_point start_ = Clock::now(), last_ = Clock::now();
  uint64_t bytes_ = 0, tokens_ = 0;
  int64_t documents_ = 0;
  bool shown_ = false;
};

std::optional<uint64_t> total_bytes(const std::vector<InputSource>& sources) {
  uint64_t total = 0;
  for (const auto& s : sources) {
    if (!s.bytes) return std::nullopt;  // a FIFO: its length is known at its end only
    total += *s.bytes;
  }
  return total;
}

PieceMode piece_mode(const PrepareOptions& o) {
  if (!o.tokenizer_file.empty()) return PieceMode::documents;
  return o.tokenizer == TokenizerKind::bpe ? PieceMode::lines : PieceMode::bytes;
}

// Text pieces are cut smaller than a batch, so that a batch's pieces keep every thread busy.
size_t piece_bytes(const PrepareOptions& o) { return std::max<size_t>(o.batch_bytes / 16, 4096); }

// The tokenizer char or bpe trains: char on every byte of the corpus (a first pass over it), bpe
// on its first kBpeSampleBytes.
std::unique_ptr<Tokenizer> train_on_corpus(const PrepareOptions& o, const std::vector<InputSource>& sources,
                                           Progress& progress) {
  progress.phase(o.tokenizer == TokenizerKind::bpe ? "1/2 reading the BPE training sample" : "1/2 reading the alphabet");
  bool present[256] = {};
  std::string sample, piece;
  uint64_t done = 0;
  int64_t documents = 0;
  for (const auto& source : sources) {
    PieceReader reader(source, piece_mode(o), o.field, piece_bytes(o));
    while (sample.size() < kBpeSampleBytes && reader.next(piece)) {
      if (o.tokenizer == TokenizerKind::bpe) sample += piece;
      else for (unsigned char c : piece) present[c] = true;
      progress.update(done + reader.consumed(), documents + reader.documents(), 0);
    }
    done += reader.consumed();
    documents += reader.documents();
  }
  if (o.tokenizer == TokenizerKind::bpe) {
    if (sample.empty()) throw UsageError("the input text is empty: prepare needs a corpus");
    return train_bpe_tokenizer(sample, o.bpe_vocab_size);
  }
  std::string alphabet;
  for (int c = 0; c < 256; ++c)
    if (present[c]) alphabet.push_back(static_cast<char>(c));
  if (alphabet.empty()) throw UsageError("the input text is empty: prepare needs a corpus");
  return train_char_tokenizer(alphabet);
}

// Pieces encoded on bpe::threads() threads, each taking the next piece not yet taken: many small
// documents (web pages) keep every thread busy, as a large one does inside encode().
std::vector<std::vector<int32_t>> encode_in_parallel(const Tokenizer& tokenizer, const std::vector<std::string>& pieces,
                                                     bool documents) {
  std::vector<std::vector<int32_t>> encoded(pieces.size());
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&] {
    for (size_t i; (i = next++) < pieces.size();) {
      try {
        encoded[i] = documents ? tokenizer.encode_document(pieces[i]) : tokenizer.encode(pieces[i]);
      } catch (...) {
        const std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
        next = pieces.size();  // the others stop too
      }
    }
  };
  std::vector<std::thread> workers;
  const size_t n = std::min<size_t>(bpe::threads(), pieces.size());
  for (size_t t = 1; t < n; ++t) workers.emplace_back(work);
  work();
  for (auto& w : workers) w.join();
  if (error) std::rethrow_exception(error);
  return encoded;
}

// The tokens of the source being split, kept in the staging directory until its end, when the
// first part goes to the training shards and the rest to the validation shards.
class Spool {
 public:
  // `width`: bytes a token (2 for vocabularies up to 65536, as in the shards).
  Spool(const fs::path& dir, uint32_t width) : path_(dir / kSpoolFile), width_(width) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw UsageError(fmt::format("cannot create {}: {}", path_.string(), std::strerror(errno)));
  }
  ~Spool() {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  Spool(const Spool&) = delete;
  Spool& operator=(const Spool&) = delete;

  void append(std::span<const int32_t> tokens) {
    const void* data = tokens.data();
    if (width_ == 2) {
      narrow_.assign(tokens.begin(), tokens.end());  // ids below 65536: the tokenizer's vocabulary
      data = narrow_.data();
    }
    // A short write is continued: at a file-size limit the next one fails (EFBIG) or raises SIGXFSZ.
    const auto* bytes = static_cast<const char*>(data);
    for (size_t done = 0, n = tokens.size() * width_; done < n;) {
      const ssize_t w = ::pwrite(fd_, bytes + done, n - done, static_cast<off_t>(count_ * width_ + done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail(w);
      done += static_cast<size_t>(w);
    }
    count_ += tokens.size();
  }
  uint64_t size() const { return count_; }
  // Tokens [begin, end) to `series`, then the spool emptied when `end` is its end.
  void copy(uint64_t begin, uint64_t end, ShardSeries& series) {
    std::vector<int32_t> buffer(size_t{1} << 20);
    for (uint64_t at = begin; at < end;) {
      const size_t n = std::min<uint64_t>(buffer.size(), end - at);
      if (width_ == 2) narrow_.resize(n);
      void* into = width_ == 2 ? static_cast<void*>(narrow_.data()) : buffer.data();
      if (::pread(fd_, into, n * width_, static_cast<off_t>(at * width_)) != static_cast<ssize_t>(n * width_)) fail(-1);
      if (width_ == 2) std::copy(narrow_.begin(), narrow_.end(), buffer.begin());
      series.append(std::span(buffer.data(), n));
      at += n;
    }
  }
  void clear() {
    count_ = 0;
    if (::ftruncate(fd_, 0) != 0) throw UsageError(fmt::format("cannot truncate {}: {}", path_.string(), std::strerror(errno)));
  }

 private:
  [[noreturn]] void fail(ssize_t result) const {
    throw UsageError(fmt::format("cannot write or read back {}: {}", path_.string(),
                                 result < 0 ? std::strerror(errno) : "nothing written (is the disk full?)"));
  }
  fs::path path_;
  uint32_t width_;
  int fd_ = -1;
  uint64_t count_ = 0;
  std::vector<uint16_t> narrow_;
};

// Where each source's tokens go: straight to the train or val shards (with --val), or through the
// spool, split at the end of the source (--val-fraction).
class TokenRouter {
 public:
  TokenRouter(const fs::path& dir, const PrepareOptions& o, int64_t vocab)
      : train_(dir, "train", vocab, o.shard_tokens), val_(dir, "val", vocab, o.shard_tokens),
        fraction_(o.val_inputs.empty() ? o.val_fraction : 0) {
    if (fraction_ > 0) spool_ = std::make_unique<Spool>(dir, vocab <= 65536 ? 2 : 4);
  }
  void append(bool validation, std::span<const int32_t> tokens) {
    if (spool_) spool_->append(tokens);
    else (validation ? val_ : train_).append(tokens);
    source_tokens_ += tokens.size();
  }
  // Ends a source; returns its (train, val) token counts. The split is split_tokens's rule: the
  // first floor(n * (1 - fraction)) tokens train.
  std::pair<uint64_t, uint64_t> end_source(bool validation) {
    const uint64_t n = source_tokens_;
    source_tokens_ = 0;
    if (!spool_) return validation ? std::pair<uint64_t, uint64_t>{0, n} : std::pair<uint64_t, uint64_t>{n, 0};
    const auto cut = static_cast<uint64_t>(static_cast<double>(n) * (1.0 - fraction_));
    spool_->copy(0, cut, train_);
    spool_->copy(cut, n, val_);
    spool_->clear();
    return {cut, n - cut};
  }
  void finish() {
    spool_.reset();
    train_.finish();
    val_.finish();
  }
  const ShardSeries& train() const { return train_; }
  const ShardSeries& val() const { return val_; }

 private:
  ShardSeries train_, val_;
  double fraction_;
  std::unique_ptr<Spool> spool_;
  uint64_t source_tokens_ = 0;
};

struct SourceRecord {
  std::string path;
  int64_t documents = 0;
  uint64_t train = 0, val = 0;
};

// Pass 2: every source read in batches of about batch_bytes, each batch encoded in parallel and
// its tokens routed in order. Sources [0, first_val) train, the rest validate (--val).
std::vector<SourceRecord> encode_sources(const PrepareOptions& o, const std::vector<InputSource>& sources,
                                         size_t first_val, const Tokenizer& tokenizer, TokenRouter& router,
                                         Progress& progress, PrepareResult& result) {
  progress.phase(o.tokenizer_file.empty() ? "2/2 encoding" : "encoding");
  uint64_t tokens = 0;  // encoded so far, for the progress line
  const bool documents = piece_mode(o) == PieceMode::documents;
  std::vector<SourceRecord> records;
  std::vector<std::string> batch;
  std::vector<size_t> batch_source;  // the source of each piece
  uint64_t done = 0;
  size_t s = 0;
  std::unique_ptr<PieceReader> reader;
  auto route = [&] {
    const auto encoded = encode_in_parallel(tokenizer, batch, documents);
    for (size_t i = 0; i < batch.size(); ++i) {
      router.append(batch_source[i] >= first_val, encoded[i]);
      tokens += encoded[i].size();
    }
    batch.clear();
    batch_source.clear();
  };
  for (; s < sources.size(); ++s) {
    reader = std::make_unique<PieceReader>(sources[s], piece_mode(o), o.field, piece_bytes(o));
    size_t batched = 0;
    for (std::string piece; reader->next(piece);) {
      result.characters += static_cast<int64_t>(piece.size());
      batched += piece.size();
      batch.push_back(std::move(piece));
      batch_source.push_back(s);
      if (batched >= o.batch_bytes) route(), batched = 0;
      progress.update(done + reader->consumed(), result.documents + reader->documents(), tokens);
    }
    route();  // the source's last pieces, so that it can be split now
    const auto [train, val] = router.end_source(s >= first_val);
    records.push_back({sources[s].path.string(), reader->documents(), train, val});
    done += reader->consumed();
    result.documents += reader->documents();
  }
  progress.update(done, result.documents, tokens);
  progress.summary();
  return records;
}

nlohmann::json shard_list(const std::vector<ShardSeries::Shard>& shards) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& s : shards) list.push_back({{"file", s.file}, {"tokens", s.tokens}});
  return list;
}

nlohmann::json prepare_record(const PrepareOptions& options, const PrepareResult& r, TokenizerKind kind,
                              const std::vector<SourceRecord>& sources) {
  nlohmann::json info;
  std::vector<std::string> inputs, val_inputs;
  for (const auto& input : options.inputs) inputs.push_back(input.string());
  for (const auto& input : options.val_inputs) val_inputs.push_back(input.string());
  info["inputs"] = inputs;
  if (!val_inputs.empty()) info["val_inputs"] = val_inputs;
  else info["val_fraction"] = options.val_fraction;
  info["tokenizer"] = std::string(to_string(kind));
  if (!options.tokenizer_file.empty()) {
    info["tokenizer_file"] = options.tokenizer_file.string();
    info["end_of_text"] = r.end_of_text ? nlohmann::json(*r.end_of_text) : nlohmann::json();
  }
  info["vocab_size"] = r.vocab_size;
  info["characters"] = r.characters;
  info["documents"] = r.documents;
  info["train_tokens"] = r.train_tokens;
  info["val_tokens"] = r.val_tokens;
  info["shards"] = {{"train", shard_list(r.train_shards)}, {"val", shard_list(r.val_shards)}};
  nlohmann::json list = nlohmann::json::array();
  for (const auto& s : sources)
    list.push_back({{"path", s.path}, {"documents", s.documents}, {"train_tokens", s.train}, {"val_tokens", s.val}});
  info["sources"] = list;
  return info;
}

void check_options(const PrepareOptions& o) {
  if (o.inputs.empty()) throw UsageError("prepare needs at least one input (a text or JSON-lines file, a directory, a pattern)");
  if (o.val_inputs.empty() && !(o.val_fraction > 0 && o.val_fraction < 1))
    throw UsageError(fmt::format("--val-fraction {} leaves {}: give a fraction between 0 and 1 (0.1: the last tenth of "
                                 "each input validates), or the validation text itself with --val FILE...",
                                 o.val_fraction, o.val_fraction <= 0 ? "no validation data" : "no training data"));
  if (o.shard_tokens == 0) throw UsageError("--shard-tokens 0: a shard holds at least one token");
  if (o.field.empty()) throw UsageError("--field is empty: name the field of each JSON line that holds its text");
}

}  // namespace

PrepareResult prepare_dataset(const PrepareOptions& options) {
  check_options(options);
  std::vector<InputSource> sources = expand_inputs(options.inputs, "input");
  const size_t first_val = sources.size();
  for (auto& v : expand_inputs(options.val_inputs, "--val input")) sources.push_back(std::move(v));
  std::vector<fs::path> paths;
  for (const auto& s : sources) {
    // char and bpe read the corpus twice (to learn the tokenizer, then to encode): a pipe once only.
    if (options.tokenizer_file.empty() && !s.bytes)
      throw UsageError(fmt::format("input '{}' is a pipe, not a file: --tokenizer {} reads the corpus twice (to learn "
                                   "the tokenizer, then to encode it), a pipe only once; give the file itself (.gz and "
                                   ".zst files are read as they are), or encode with --tokenizer FILE",
                                   s.path.string(), to_string(options.tokenizer)));
    paths.push_back(s.path);
  }
  check_prepare_output(options.output_dir, paths, options.force);
  PrepareResult result;
  Progress progress(options.progress, total_bytes(sources));
  std::unique_ptr<Tokenizer> tokenizer;
  if (options.tokenizer_file.empty()) {
    tokenizer = train_on_corpus(options, sources, progress);
  } else {
    tokenizer = load_tokenizer_file(options.tokenizer_file, options.tiktoken_encoding);
    result.end_of_text = tokenizer->end_of_text();
    if (result.end_of_text) result.end_of_text_token = tokenizer->token_text(*result.end_of_text);
    result.begin_of_text = tokenizer->begin_of_text();
    if (result.begin_of_text) result.begin_of_text_token = tokenizer->token_text(*result.begin_of_text);
  }
  result.vocab_size = tokenizer->vocab_size();
  result.sources = static_cast<int64_t>(sources.size());
  const fs::path destination = data_directory_destination(options.output_dir);
  // Said at once: the prepare that removes them may still fail (on a full disk, say).
  for (const fs::path& stale : remove_stale_prepare_directories(destination))
    fmt::print("removed {}, left by a prepare that did not finish\n", stale.string());
  StagedDataDirectory staged(destination);
  TokenRouter router(staged.path(), options, tokenizer->vocab_size());
  const auto records = encode_sources(options, sources, first_val, *tokenizer, router, progress, result);
  router.finish();
  if (result.characters == 0) throw UsageError("the input text is empty: prepare needs a corpus");
  result.train_tokens = static_cast<int64_t>(router.train().tokens());
  result.val_tokens = static_cast<int64_t>(router.val().tokens());
  if (result.val_tokens < 2 || result.train_tokens < 2)
    throw UsageError(fmt::format("the corpus gives {} training and {} validation tokens: too few for training (each "
                                 "needs 2 or more); give more text{}",
                                 result.train_tokens, result.val_tokens,
                                 options.val_inputs.empty() ? " or a larger --val-fraction" : ""));
  result.train_shards = router.train().shards();
  result.val_shards = router.val().shards();
  tokenizer->save(staged.path());
  for (const char* name : {kTokenizerFile, kSentencePieceFile, kTiktokenFile, kNibbleTokenizerFile})
    if (fs::exists(staged.path() / name)) result.tokenizer_files += (result.tokenizer_files.empty() ? "" : ", ") + std::string(name);
  write_prepare_record(staged.path(), prepare_record(options, result, tokenizer->kind(), records));
  result.replaced = staged.commit(options.force);
  return result;
}

}  // namespace nibble::train
