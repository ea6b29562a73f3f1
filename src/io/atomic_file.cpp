#include "io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"

namespace nibble::io {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

// Durability of the rename itself needs the directory entry flushed too; failure here is not an
// error for the caller (some filesystems do not support fsync on directories).
void sync_directory_of(const std::filesystem::path& file) {
  std::filesystem::path dir = file.parent_path();
  if (dir.empty()) dir = ".";
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(std::filesystem::path target) : target_(std::move(target)) {
  temporary_ = target_;
  temporary_ += ".tmp." + std::to_string(::getpid());
  // "x": fail rather than clobber a temporary that another live process with our pid (a
  // container sibling, say) might be writing; a stale one from a crashed run is replaced below.
  file_ = std::fopen(temporary_.c_str(), "wbx");
  if (!file_ && errno == EEXIST) {
    std::error_code ignored;
    std::filesystem::remove(temporary_, ignored);
    file_ = std::fopen(temporary_.c_str(), "wbx");
  }
  if (!file_) throw UsageError("cannot create output file " + target_.string() + ": " + errno_text(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (!committed_) discard();
}

void AtomicFileWriter::discard() noexcept {
  if (file_) {
    std::fclose(file_);
    file_ = nullptr;
  }
  std::error_code ignored;
  std::filesystem::remove(temporary_, ignored);
}

void AtomicFileWriter::write(std::span<const uint8_t> bytes) {
  if (!file_) throw UsageError("output file " + target_.string() + " is already closed");
  if (bytes.empty()) return;
  if (std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size()) {
    int err = errno;
    discard();
    throw UsageError("cannot write output file " + target_.string() + ": " + errno_text(err));
  }
}

void AtomicFileWriter::commit() {
  if (!file_) throw UsageError("output file " + target_.string() + " is already closed");
  bool ok = std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0;
  int err = errno;
  ok = (std::fclose(file_) == 0) && ok;
  if (!ok && err == 0) err = errno;
  file_ = nullptr;
  if (!ok) {
    discard();
    throw UsageError("cannot write output file " + target_.string() + ": " + errno_text(err));
  }
  if (std::rename(temporary_.c_str(), target_.c_str()) != 0) {
    err = errno;
    discard();
    throw UsageError("cannot move " + temporary_.string() + " to " + target_.string() + ": " + errno_text(err));
  }
  committed_ = true;
  sync_directory_of(target_);
}

void write_file_atomically(const std::filesystem::path& target, std::span<const uint8_t> bytes) {
  AtomicFileWriter writer(target);
  writer.write(bytes);
  writer.commit();
}

std::vector<uint8_t> read_file_bytes(const std::filesystem::path& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw UsageError("cannot open " + path.string() + ": " + errno_text(errno));
  std::vector<uint8_t> bytes;
  // One byte more than the file size, so the read that reaches end of file needs no regrowth.
  std::error_code size_error;
  if (auto size = std::filesystem::file_size(path, size_error); !size_error) bytes.reserve(size + 1);
  // Pipes and /dev/stdin have no size: keep doubling until a short read says end of file.
  constexpr size_t kMinChunk = size_t{1} << 20;
  for (;;) {
    if (bytes.size() == bytes.capacity()) bytes.reserve(std::max(2 * bytes.capacity(), kMinChunk));
    const size_t old_size = bytes.size(), room = bytes.capacity() - old_size;
    bytes.resize(bytes.capacity());
    const size_t got = std::fread(bytes.data() + old_size, 1, room, f);
    bytes.resize(old_size + got);
    if (got < room) break;
  }
  bool failed = std::ferror(f) != 0;
  int err = errno;
  std::fclose(f);
  if (failed) throw UsageError("cannot read " + path.string() + ": " + errno_text(err));
  return bytes;
}

}  // namespace nibble::io
