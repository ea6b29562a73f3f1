#include "data/token_files.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <glob.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <optional>
#include <span>

#include "common/error.h"
#include "io/regular_file.h"
#include "data/data_directory.h"
#include "data/shards.h"
#include "io/checksum.h"

namespace nibble::train {

namespace fs = std::filesystem;

namespace {

// A mapped file truncated while a run reads it faults (SIGBUS) at the next window past its new end:
// said in words, with exit status 2, instead of a bare "Bus error" (x86-64 raises SIGBUS for nothing
// else nibble does).
void on_sigbus(int) {
  static const char message[] =
      "error: a memory-mapped token file was truncated (or its disk failed) while nibble read it (SIGBUS): "
      "restore the file, then continue the run with resume=true\n";
  [[maybe_unused]] const ssize_t ignored = ::write(STDERR_FILENO, message, sizeof message - 1);
  ::_exit(2);
}

void explain_bus_errors() {
  static const bool installed = [] {
    struct sigaction action{};
    action.sa_handler = on_sigbus;
    sigemptyset(&action.sa_mask);
    return ::sigaction(SIGBUS, &action, nullptr) == 0;
  }();
  (void)installed;
}

// A regular file mapped read-only for as long as a TokenStream piece refers to it.
class MappedFile {
 public:
  explicit MappedFile(const fs::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const uint8_t> bytes() const { return {static_cast<const uint8_t*>(data_), size_}; }
  // Calls fn on [begin, end) in pieces of 64 MiB, each dropped from this process's memory after
  // (the page cache keeps it while memory allows): a pass over a 10 GB shard stays small in RSS.
  void scan(uint64_t begin, uint64_t end, const std::function<void(std::span<const uint8_t>, uint64_t)>& fn) const;
  // After the checks: windows are read at random places, where read-ahead only wastes memory.
  void expect_random_reads() const;

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

MappedFile::MappedFile(const fs::path& path) {
  explain_bus_errors();
  const io::RegularFile file(path, "a token shard");
  size_ = file.size();
  if (size_ > 0) data_ = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, file.fd(), 0);  // outlives the descriptor
  const int map_errno = errno;
  if (data_ == MAP_FAILED)
    throw UsageError(fmt::format("cannot map {} ({} bytes) into memory: {} (an address-space limit such as `ulimit -v` "
                                 "must leave room for the token files)",
                                 path.string(), size_, std::strerror(map_errno)));
}

MappedFile::~MappedFile() {
  if (size_ > 0) ::munmap(data_, size_);
}

void MappedFile::scan(uint64_t begin, uint64_t end,
                      const std::function<void(std::span<const uint8_t>, uint64_t)>& fn) const {
  constexpr uint64_t kPiece = uint64_t{64} << 20;  // a multiple of every page size
  auto* base = static_cast<uint8_t*>(data_);
  for (uint64_t at = begin; at < end;) {
    const uint64_t next = std::min(end, (at / kPiece + 1) * kPiece);
    ::madvise(base + at / kPiece * kPiece, next - at / kPiece * kPiece, MADV_WILLNEED);
    fn(std::span<const uint8_t>(base + at, next - at), at);
    ::madvise(base + at / kPiece * kPiece, next - at / kPiece * kPiece, MADV_DONTNEED);
    at = next;
  }
}

void MappedFile::expect_random_reads() const {
  if (size_ > 0) ::madvise(data_, size_, MADV_RANDOM);
}

int32_t read_i32(std::span<const uint8_t> bytes, size_t at) {
  int32_t v;
  std::memcpy(&v, bytes.data() + at, sizeof v);
  return v;
}

// The largest of `n` tokens of type T at `p`: a loop the compiler vectorizes, so a check pass runs at
// memory speed; the offending token is looked for only in a piece whose maximum is too large.
template <typename T>
uint32_t max_token(const uint8_t* p, size_t n) {
  T m = 0;
  for (size_t i = 0; i < n; ++i) {
    T t;
    std::memcpy(&t, p + i * sizeof(T), sizeof(T));  // little-endian host (token_stream.cpp)
    m = t > m ? t : m;
  }
  return m;
}

uint32_t largest_token(const uint8_t* p, size_t n, uint32_t width) {
  return width == 2 ? max_token<uint16_t>(p, n) : max_token<uint32_t>(p, n);
}

// Every token of the layout below `vocab`, in one streaming pass over the mapping; the first that
// is not is named with its position and byte offset.
void check_tokens(const MappedFile& file, const TokenLayout& layout, int64_t vocab, const fs::path& path,
                  std::string_view fix) {
  if (layout.width == 2 && vocab >= 65536) return;  // every uint16 fits
  const uint64_t begin = layout.offset, end = layout.offset + layout.count * layout.width;
  file.scan(begin, end, [&](std::span<const uint8_t> piece, uint64_t at) {
    const auto beyond = first_token_beyond(piece, layout.width, vocab);
    if (!beyond) return;
    const uint64_t offset = at + *beyond * layout.width;
    throw UsageError(fmt::format("{}: token {} at position {} (byte offset {}) is >= the vocabulary size {}: {}",
                                 path.string(), largest_token(piece.data() + *beyond * layout.width, 1, layout.width),
                                 (offset - begin) / layout.width, offset, vocab, fix));
  });
}

std::string vocab_fix(int64_t vocab, std::string_view key) {
  return fmt::format("the file holds ids of a larger vocabulary than {}={}: set {} to the size of the tokenizer that "
                     "wrote it (50257 for GPT-2, 128256 for Llama 3)",
                     key, vocab, key);
}

// Bytes per token of an llm.c shard of this magic and version; 0 for a pair llm.c does not write.
uint32_t llmc_token_width(int32_t magic, int32_t version) {
  if (magic == kLlmcMagic) return version == 1 ? 2 : version == 2 ? 4 : 0;
  return version == 7 ? 4 : 0;  // kLlmcLlama3Magic
}

TokenLayout llmc_layout(std::span<const uint8_t> bytes, const std::string& source) {
  auto fail = [&](const std::string& why) {
    return UsageError(fmt::format("{}: not a usable llm.c token shard: {}", source, why));
  };
  constexpr size_t header = kLlmcHeaderInts * 4;
  if (bytes.size() < header)
    throw fail(fmt::format("its {} bytes are fewer than the {}-byte header (256 x int32)", bytes.size(), header));
  const int32_t magic = read_i32(bytes, 0), version = read_i32(bytes, 4);
  if (magic != kLlmcMagic && magic != kLlmcLlama3Magic)
    throw fail(fmt::format("header[0] (magic) is {}, not {} (GPT-2 shards) or {} (Llama 3 shards): not an llm.c shard "
                           "(nanoGPT's raw train.bin is data.format=nanogpt; a `nibble prepare` directory "
                           "data.format=nibble)",
                           magic, kLlmcMagic, kLlmcLlama3Magic));
  const uint32_t width = llmc_token_width(magic, version);
  if (width == 0)
    throw fail(fmt::format("header[1] (version) is {}, which magic {} does not have: llm.c writes version 1 (uint16 "
                           "tokens) under magic {}, version 7 (uint32 tokens) under magic {}; version 2 (uint32 tokens) "
                           "under {} is read too",
                           version, magic, kLlmcMagic, kLlmcLlama3Magic, kLlmcMagic));
  const int32_t count = read_i32(bytes, 8);
  const uint64_t payload = bytes.size() - header;
  if (count < 0 || static_cast<uint64_t>(count) * width != payload)
    throw fail(fmt::format("header[2] (token count) says {} tokens ({} bytes of version-{} tokens), but the file "
                           "holds {} bytes after the header: it is truncated or its header lies; write it again",
                           count, static_cast<int64_t>(count) * width, version, payload));
  return {header, static_cast<uint64_t>(count), width, 0};
}

TokenLayout nanogpt_layout(std::span<const uint8_t> bytes, const std::string& source) {
  // A headed file read as raw tokens would train on its header: name the format it is.
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), kShardMagic, 8) == 0)
    throw UsageError(fmt::format("{} is a `nibble prepare` shard (NIBTOKNS), not a raw nanoGPT file: set "
                                 "data.format=nibble and data.dir to its directory",
                                 source));
  if (bytes.size() >= 4 && (read_i32(bytes, 0) == kLlmcMagic || read_i32(bytes, 0) == kLlmcLlama3Magic))
    throw UsageError(fmt::format("{} begins with llm.c's magic {}, so it is an llm.c shard, not a raw nanoGPT file: "
                                 "set data.format=llmc",
                                 source, read_i32(bytes, 0)));
  if (bytes.size() % 2 != 0)
    throw UsageError(fmt::format("{}: {} bytes is not a whole number of 2-byte tokens: a nanoGPT file holds uint16 "
                                 "tokens and nothing else; it is truncated or not a nanoGPT file",
                                 source, bytes.size()));
  return {0, bytes.size() / 2, 2, 0};
}

// parse_token_shard's checks on the header alone (parsed as an empty shard), then the length
// against the header's count.
TokenLayout nibble_layout(std::span<const uint8_t> bytes, const std::string& source) {
  std::vector<uint8_t> header(bytes.begin(), bytes.begin() + std::min(bytes.size(), kShardHeaderBytes));
  uint64_t count = 0;
  if (header.size() == kShardHeaderBytes) {
    std::memcpy(&count, header.data() + 24, 8);
    std::memset(header.data() + 24, 0, 8);
  }
  const TokenShard shape = parse_token_shard(header, source);
  const uint32_t width = shape.vocab_size <= 65536 ? 2 : 4;
  const uint64_t payload = bytes.size() - kShardHeaderBytes;
  if (count > payload / width || count * width != payload)
    throw UsageError(fmt::format("{}: not a usable token shard: the header says {} tokens ({} bytes) but the file holds "
                                 "{} bytes after the header (re-create it with `nibble prepare`)",
                                 source, count, count > UINT64_MAX / width ? UINT64_MAX : count * width, payload));
  return {kShardHeaderBytes, count, width, shape.vocab_size};
}

// A `nibble prepare` shard is checked against its directory's manifest first (as read_data_file
// does), hashed in pieces so that its pages do not all stay resident.
void check_against_manifest(const fs::path& path, const MappedFile& file) {
  const fs::path dir = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  check_data_file(dir, path.filename().string(), file.bytes().size(), [&] {
    io::ContentHasher hasher;
    file.scan(0, file.bytes().size(), [&](std::span<const uint8_t> piece, uint64_t) { hasher.update(piece); });
    return hasher.digest();
  });
}

// The files matching `patterns` (glob(3), comma-separated, relative to `dir` when set), each
// pattern's matches in name order; every pattern must match.
std::vector<fs::path> glob_files(const std::string& patterns, const fs::path& dir, std::string_view key) {
  std::vector<fs::path> files;
  size_t from = 0;
  while (from <= patterns.size()) {
    const size_t comma = std::min(patterns.find(',', from), patterns.size());
    const std::string pattern = patterns.substr(from, comma - from);
    from = comma + 1;
    if (pattern.empty()) continue;
    const std::string full = dir.empty() || fs::path(pattern).is_absolute() ? pattern : (dir / pattern).string();
    glob_t g{};
    const int rc = ::glob(full.c_str(), 0, nullptr, &g);  // glob sorts its matches
    for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
    if (rc != 0)
      throw UsageError(fmt::format("{}: the pattern '{}' matches no file: check the path (relative patterns are taken "
                                   "from data.dir when it is set)",
                                   key, full));
  }
  return files;
}

// llm.c's own naming: fineweb_train_000001.bin, fineweb_val_000000.bin.
std::vector<fs::path> llmc_files(const fs::path& dir, std::string_view role) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.ends_with(".bin") && name.find(role) != std::string::npos) files.push_back(it->path());
  }
  if (ec) throw UsageError(fmt::format("cannot list data.dir '{}': {}", dir.string(), ec.message()));
  std::sort(files.begin(), files.end());
  if (files.empty())
    throw UsageError(fmt::format("data.dir '{}' holds no llm.c {} shard (a file named *{}*.bin): point data.dir at "
                                 "the directory llm.c's script wrote, or give data.train_files and data.val_files",
                                 dir.string(), role, role));
  return files;
}

}  // namespace

TokenFileLists list_token_files(const DataSpec& spec) {
  if (spec.format == TokenFormat::nibble) {
    const PreparedShards shards = prepared_shards(spec.dir);
    TokenFileLists lists;
    for (const auto& s : shards.train) lists.train.push_back(spec.dir / s.file);
    for (const auto& s : shards.val) lists.val.push_back(spec.dir / s.file);
    return lists;
  }
  if (!spec.dir.empty() && !fs::is_directory(spec.dir))
    throw UsageError(fmt::format("data.dir '{}' is not a directory", spec.dir.string()));
  TokenFileLists lists;
  if (!spec.train_files.empty()) {
    lists.train = glob_files(spec.train_files, spec.dir, "data.train_files");
    lists.val = glob_files(spec.val_files, spec.dir, "data.val_files");
  } else if (spec.format == TokenFormat::llmc) {
    lists.train = llmc_files(spec.dir, "train");
    lists.val = llmc_files(spec.dir, "val");
  } else {
    lists.train = {spec.dir / kTrainShardFile};
    lists.val = {spec.dir / kValShardFile};
  }
  return lists;
}

TokenFormat parse_token_format(std::string_view name) {
  if (name == "nibble") return TokenFormat::nibble;
  if (name == "llmc") return TokenFormat::llmc;
  if (name == "nanogpt") return TokenFormat::nanogpt;
  throw UsageError(fmt::format("unknown token format '{}': use nibble (a `nibble prepare` directory), llmc (llm.c's "
                               ".bin shards) or nanogpt (nanoGPT's raw uint16 train.bin/val.bin)",
                               name));
}

std::string_view to_string(TokenFormat format) {
  switch (format) {
    case TokenFormat::nibble: return "nibble";
    case TokenFormat::llmc: return "llmc";
    case TokenFormat::nanogpt: return "nanogpt";
  }
  return "nibble";
}

TokenLayout parse_token_layout(std::span<const uint8_t> bytes, TokenFormat format, const std::string& source) {
  switch (format) {
    case TokenFormat::llmc: return llmc_layout(bytes, source);
    case TokenFormat::nanogpt: return nanogpt_layout(bytes, source);
    case TokenFormat::nibble: break;
  }
  return nibble_layout(bytes, source);
}

std::optional<uint64_t> first_token_beyond(std::span<const uint8_t> tokens, uint32_t width, int64_t vocab) {
  const size_t n = tokens.size() / width;
  if (largest_token(tokens.data(), n, width) < static_cast<uint64_t>(vocab)) return std::nullopt;
  for (size_t i = 0; i < n; ++i)
    if (largest_token(tokens.data() + i * width, 1, width) >= static_cast<uint64_t>(vocab)) return i;
  return std::nullopt;
}

TokenFile open_token_file(const fs::path& path, TokenFormat format, int64_t vocab, std::string_view vocab_key) {
  auto file = std::make_shared<const MappedFile>(path);
  if (format == TokenFormat::nibble) check_against_manifest(path, *file);
  const TokenLayout layout = parse_token_layout(file->bytes(), format, path.string());
  std::string fix = vocab_fix(vocab, vocab_key);
  if (format == TokenFormat::nibble) {
    if (vocab > 0 && vocab != layout.vocab)
      throw UsageError(fmt::format("{} holds ids of a vocabulary of {}, not {}", path.string(), layout.vocab, vocab));
    vocab = layout.vocab;
    fix = "the file is damaged; re-create it with `nibble prepare`";
  }
  check_tokens(*file, layout, vocab, path, fix);
  file->expect_random_reads();
  TokenFile t;
  t.vocab_size = vocab;
  t.tokens.append(TokenStream::Piece{file->bytes().data() + layout.offset, layout.count, layout.width}, file);
  return t;
}

std::string pretokenized_identity(TokenFormat format, int64_t vocab) {
  return fmt::format("pretokenized:{}:vocab={}", to_string(format), vocab);
}

std::vector<int32_t> Dataset::corpus() const {
  std::vector<int32_t> all = train.to_vector(), v = val.to_vector();
  all.insert(all.end(), v.begin(), v.end());
  return all;
}

}  // namespace nibble::train
