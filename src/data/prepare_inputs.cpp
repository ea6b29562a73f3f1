#include "data/prepare_inputs.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <glob.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "data/tokenizer.h"
#include "io/write_rules.h"

namespace nibble::train {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, std::string_view suffix) { return std::string_view(s).ends_with(suffix); }

// Kind and compression from the name: x.jsonl.zst is zstd-compressed JSON lines, x.gz gzip text.
InputSource source_of(const fs::path& path) {
  InputSource s;
  s.path = path;
  std::string name = path.filename().string();
  if (ends_with(name, ".gz")) s.compression = Compression::gzip, name.resize(name.size() - 3);
  else if (ends_with(name, ".zst")) s.compression = Compression::zstd, name.resize(name.size() - 4);
  if (ends_with(name, ".jsonl") || ends_with(name, ".ndjson")) s.kind = InputKind::jsonl;
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) s.bytes = fs::file_size(path, ec);
  return s;
}

// The names a directory's files are taken by: text and JSON lines, plain or compressed.
bool recognised(const fs::path& path) {
  std::string name = path.filename().string();
  for (std::string_view c : {".gz", ".zst"})
    if (ends_with(name, c)) name.resize(name.size() - c.size());
  for (std::string_view e : {".txt", ".text", ".md", ".jsonl", ".ndjson"})
    if (ends_with(name, e)) return true;
  return false;
}

// A directory's recognised regular files, recursively, in name order; hidden files and
// directories (.git) skipped.
std::vector<fs::path> directory_files(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::follow_directory_symlink, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const bool hidden = it->path().filename().string().starts_with(".");
    if (hidden && it->is_directory(ec)) it.disable_recursion_pending();
    if (!hidden && it->is_regular_file(ec) && recognised(it->path())) files.push_back(it->path());
  }
  if (ec) throw UsageError(fmt::format("cannot list the input directory {}: {}", dir.string(), ec.message()));
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<fs::path> glob_matches(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);  // sorted
  std::vector<fs::path> matches;
  for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) matches.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  return matches;
}

void check_file_input(const fs::path& input, std::string_view role) {
  std::error_code ec;
  const auto status = fs::status(input, ec);
  if (fs::is_character_file(status) || fs::is_block_file(status) || fs::is_socket(status))
    throw UsageError(fmt::format("{} '{}' is a device or socket, not a text file: `nibble prepare` reads each input to "
                                 "its end; give text or JSON-lines files",
                                 role, input.string()));
}

// One argument's sources: a file, a directory's files, or a pattern's matches.
void expand_one(const fs::path& input, std::string_view role, std::vector<InputSource>& out) {
  std::error_code ec;
  const std::string s = input.string();
  if (fs::is_directory(input, ec)) {
    // A run's metrics.jsonl or a data directory's files are no corpus.
    if (const auto owner = io::enclosing_owned_directory(input))
      throw UsageError(fmt::format("{} '{}' {} the {} {}: its files are nibble's records, not text to train on; give "
                                   "the directories or files of your corpus",
                                   role, s, owner->dir == io::resolved_path(input) ? "is" : "lies inside",
                                   io::to_string(owner->kind), owner->dir.string()));
    const auto files = directory_files(input);
    if (files.empty())
      throw UsageError(fmt::format("{} directory '{}' holds no file prepare reads (*.txt, *.text, *.md, *.jsonl, "
                                   "*.ndjson, each also .gz or .zst; hidden files are skipped): give the files "
                                   "themselves, or a directory holding such files",
                                   role, s));
    for (const auto& f : files) out.push_back(source_of(f));
    return;
  }
  if (fs::exists(input, ec)) {
    check_file_input(input, role);
    out.push_back(source_of(input));
    return;
  }
  if (s.find_first_of("*?[") == std::string::npos)
    throw UsageError(fmt::format("{} '{}' does not exist: check the path", role, s));
  const auto matches = glob_matches(s);
  if (matches.empty())
    throw UsageError(fmt::format("{} pattern '{}' matches no file: check the pattern (it is expanded as glob(3) does, "
                                 "relative to the current directory)",
                                 role, s));
  for (const auto& m : matches) {
    if (fs::is_directory(m, ec)) expand_one(m, role, out);
    else check_file_input(m, role), out.push_back(source_of(m));
  }
}

}  // namespace

std::vector<InputSource> expand_inputs(const std::vector<fs::path>& inputs, std::string_view role) {
  std::vector<InputSource> sources;
  for (const auto& input : inputs) expand_one(input, role, sources);
  return sources;
}

// A source's decompressed bytes, read in pieces.
class PieceReader::Bytes {
 public:
  explicit Bytes(const InputSource& source) : source_(source) {
    fd_ = ::open(source.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0)
      throw UsageError(fmt::format("cannot open {}: {}: check the path and its permissions", source.path.string(),
                                   std::strerror(errno)));
    if (source.compression == Compression::gzip && inflateInit2(&z_, 15 + 32) != Z_OK)  // 32: gzip or zlib header
      throw std::runtime_error("zlib: inflateInit2 failed");
    if (source.compression == Compression::zstd) zstd_ = ZSTD_createDCtx();
    input_.resize(1 << 18);
  }
  ~Bytes() {
    ::close(fd_);
    if (source_.compression == Compression::gzip) inflateEnd(&z_);
    if (zstd_) ZSTD_freeDCtx(zstd_);
  }
  // Appends up to `max` bytes to `out`; false at the end of the source (nothing appended).
  bool read(std::string& out, size_t max) {
    switch (source_.compression) {
      case Compression::gzip: return read_gzip(out, max);
      case Compression::zstd: return read_zstd(out, max);
      case Compression::none: break;
    }
    const size_t at = out.size();
    out.resize(at + max);
    const ssize_t n = read_fd(out.data() + at, max);
    out.resize(at + static_cast<size_t>(n));
    return n > 0;
  }
  uint64_t consumed() const { return file_read_ - available_; }

 private:
  ssize_t read_fd(char* to, size_t n) {
    ssize_t r;
    do r = ::read(fd_, to, n);
    while (r < 0 && errno == EINTR);
    if (r < 0)
      throw UsageError(fmt::format("cannot read {} at byte {}: {}", source_.path.string(), file_read_, std::strerror(errno)));
    file_read_ += static_cast<uint64_t>(r);
    return r;
  }
  // More compressed input when all of it was used; false at the end of the file.
  bool refill() {
    if (available_ > 0) return true;
    next_in_ = 0;
    available_ = static_cast<size_t>(read_fd(input_.data(), input_.size()));
    return available_ > 0;
  }
  std::string tool() const { return source_.compression == Compression::gzip ? "gzip" : "zstd"; }
  [[noreturn]] void truncated() const {
    throw UsageError(fmt::format("{}: the {} data is truncated: the file ends at byte {} inside a compressed stream "
                                 "(an interrupted download or copy); fetch or compress it again (`{} -t {}` checks it)",
                                 source_.path.string(), tool(), file_read_, tool(), source_.path.string()));
  }
  [[noreturn]] void corrupt(const std::string& why) const {
    throw UsageError(fmt::format("{}: corrupt {} data near byte {} of the file ({}): the file is damaged or not {}; "
                                 "fetch or compress it again (`{} -t {}` checks it)",
                                 source_.path.string(), tool(), consumed(), why, tool(), tool(), source_.path.string()));
  }
  bool read_gzip(std::string& out, size_t max);
  bool read_zstd(std::string& out, size_t max);

  const InputSource source_;
  int fd_ = -1;
  std::vector<char> input_;
  size_t next_in_ = 0, available_ = 0;
  uint64_t file_read_ = 0;
  z_stream z_{};
  ZSTD_DCtx* zstd_ = nullptr;
  bool in_stream_ = false, any_stream_ = false;  // inside a gzip member / zstd frame; one seen whole
};

bool PieceReader::Bytes::read_gzip(std::string& out, size_t max) {
  const size_t start = out.size();
  out.resize(start + max);
  size_t produced = 0;
  while (produced == 0) {
    if (!refill()) {
      if (in_stream_ || !any_stream_) truncated();
      break;
    }
    z_.next_in = reinterpret_cast<Bytef*>(input_.data() + next_in_);
    z_.avail_in = static_cast<uInt>(available_);
    z_.next_out = reinterpret_cast<Bytef*>(out.data() + start);
    z_.avail_out = static_cast<uInt>(max);
    const int rc = inflate(&z_, Z_NO_FLUSH);
    next_in_ += available_ - z_.avail_in;
    available_ = z_.avail_in;
    produced = max - z_.avail_out;
    in_stream_ = true;
    if (rc == Z_STREAM_END) {  // a member ends; another may follow (concatenated .gz files)
      in_stream_ = false, any_stream_ = true;
      inflateReset(&z_);
    } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
      corrupt(z_.msg ? z_.msg : fmt::format("zlib error {}", rc));
    }
  }
  out.resize(start + produced);
  return produced > 0;
}

bool PieceReader::Bytes::read_zstd(std::string& out, size_t max) {
  const size_t start = out.size();
  out.resize(start + max);
  ZSTD_outBuffer o{out.data() + start, max, 0};
  while (o.pos == 0) {
    if (!refill()) {
      if (in_stream_ || !any_stream_) truncated();
      break;
    }
    ZSTD_inBuffer i{input_.data() + next_in_, available_, 0};
    const size_t rc = ZSTD_decompressStream(zstd_, &o, &i);
    next_in_ += i.pos;
    available_ -= i.pos;
    if (ZSTD_isError(rc)) corrupt(ZSTD_getErrorName(rc));
    in_stream_ = rc != 0;  // 0: a frame ended
    if (rc == 0) any_stream_ = true;
  }
  out.resize(start + o.pos);
  return o.pos > 0;
}

PieceReader::PieceReader(const InputSource& source, PieceMode mode, std::string field, size_t piece_bytes)
    : source_(source), mode_(mode), field_(std::move(field)), piece_bytes_(std::max<size_t>(piece_bytes, 1)),
      bytes_(std::make_unique<Bytes>(source)) {}

PieceReader::~PieceReader() = default;

uint64_t PieceReader::consumed() const { return bytes_->consumed(); }

bool PieceReader::next(std::string& piece) {
  piece.clear();
  return source_.kind == InputKind::jsonl ? next_jsonl(piece) : next_text(piece);
}

void PieceReader::check_utf8(std::string_view text, uint64_t offset) const {
  const auto bad = first_invalid_utf8(text);
  if (!bad) return;
  const std::string where = source_.kind == InputKind::jsonl
                                ? fmt::format("line {}: the byte 0x{:02X} at byte {} of the line", line_,
                                              static_cast<unsigned char>(text[*bad]), *bad)
                                : fmt::format("the byte 0x{:02X} at offset {}", static_cast<unsigned char>(text[*bad]),
                                              offset + *bad);
  throw UsageError(fmt::format("{}: {} begins no UTF-8 character, and the tokenizer encodes UTF-8 text: convert the "
                               "file (e.g. iconv -f LATIN1 -t UTF-8){}",
                               source_.path.string(), where,
                               mode_ == PieceMode::lines ? ", or use --tokenizer char, which takes any bytes" : ""));
}

// Where the buffer's next piece ends (lines mode): after its last line break, else before its last
// space (there no piece of sentencepiece's model spans: none holds a line break, and a word's
// piece begins at its space); 0 when neither is found.
size_t PieceReader::cut_point() const {
  if (mode_ == PieceMode::bytes) return buffer_.size();
  const size_t newline = buffer_.rfind('\n');
  if (newline != std::string::npos) return newline + 1;
  const size_t space = buffer_.rfind(' ');
  return space != std::string::npos && space > 0 ? space : 0;
}

bool PieceReader::next_text(std::string& piece) {
  if (mode_ == PieceMode::documents) {  // the file whole: one document
    if (end_) return false;
    while (bytes_->read(piece, std::max<size_t>(piece_bytes_, 1 << 20))) {
    }
    end_ = true;
    check_utf8(piece, 0);
    ++documents_;
    return true;
  }
  while (!end_ && buffer_.size() < piece_bytes_) end_ = !bytes_->read(buffer_, piece_bytes_ - buffer_.size());
  // A text with no cut point yet is read on until one comes (or the file ends).
  size_t cut = end_ ? buffer_.size() : cut_point();
  while (cut == 0 && !end_) {
    end_ = !bytes_->read(buffer_, piece_bytes_);
    cut = end_ ? buffer_.size() : cut_point();
  }
  if (cut == 0) {
    if (end_ && documents_ == 0) ++documents_;
    return false;
  }
  piece.assign(buffer_, 0, cut);
  buffer_.erase(0, cut);
  if (mode_ == PieceMode::lines) check_utf8(piece, buffer_offset_);
  buffer_offset_ += cut;
  if (end_ && buffer_.empty()) ++documents_;
  return true;
}

// The next line of the file without its line break (a last line without one included).
bool PieceReader::next_line(std::string& line) {
  size_t newline;
  while ((newline = buffer_.find('\n')) == std::string::npos && !end_) end_ = !bytes_->read(buffer_, 1 << 20);
  if (buffer_.empty() && end_) return false;
  const size_t length = newline == std::string::npos ? buffer_.size() : newline;
  line.assign(buffer_, 0, length);
  buffer_.erase(0, std::min(buffer_.size(), length + 1));
  ++line_;
  return true;
}

std::string PieceReader::document_of(const std::string& line) {
  check_utf8(line, 0);
  const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  const std::string at = fmt::format("{}: line {}", source_.path.string(), line_);
  if (j.is_discarded() || !j.is_object())
    throw UsageError(fmt::format("{}: not a JSON object ({}...): a JSON-lines file holds one object per line; fix "
                                 "the line, or give the file a .txt name to read it as plain text",
                                 at, line.substr(0, 60)));
  const auto it = j.find(field_);
  if (it == j.end())
    throw UsageError(fmt::format("{}: the object has no \"{}\" field: choose the field holding the text with --field "
                                 "NAME (the line has {})",
                                 at, field_, [&] {
                                   std::string keys;
                                   for (const auto& [k, v] : j.items()) keys += (keys.empty() ? "" : ", ") + k;
                                   return keys.empty() ? std::string("no fields") : keys;
                                 }()));
  if (!it->is_string())
    throw UsageError(fmt::format("{}: the \"{}\" field is {}, not a string: choose the field holding the text with "
                                 "--field NAME",
                                 at, field_, it->type_name()));
  return it->get<std::string>();
}

bool PieceReader::next_jsonl(std::string& piece) {
  std::string line;
  // Documents are joined into pieces of about piece_bytes (bytes, lines); alone for a tokenizer
  // file, which marks each one's end.
  while (piece.size() < piece_bytes_ && next_line(line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // a blank line holds no document
    const std::string text = document_of(line);
    ++documents_;
    if (mode_ == PieceMode::documents) {
      piece = text;
      return true;
    }
    piece += text;
    piece += '\n';
  }
  return !piece.empty();
}

}  // namespace nibble::train
