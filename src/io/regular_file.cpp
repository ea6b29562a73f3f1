#include "io/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "common/error.h"

namespace nibble::io {

namespace {

std::string kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISFIFO(mode)) return "a FIFO (pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

RegularFile::RegularFile(const std::filesystem::path& path, std::string_view what) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer before it can be refused. The type is
  // checked on the open descriptor, so a file swapped for a device after a stat cannot slip through.
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd_ < 0) throw UsageError("cannot open " + path.string() + ": " + std::strerror(errno));
  struct stat st{};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    throw UsageError("cannot read " + path.string() + ": " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw UsageError(path.string() + " is " + kind_of(st.st_mode) + ", not " + std::string(what) +
                     ": give the path of the file itself");
  }
  size_ = static_cast<size_t>(st.st_size);
}

RegularFile::~RegularFile() { ::close(fd_); }

std::vector<uint8_t> read_regular_file(const std::filesystem::path& path, std::string_view what) {
  const RegularFile file(path, what);
  std::vector<uint8_t> bytes(file.size());
  size_t done = 0;
  for (;;) {
    // Room past the size fstat gave: the read that meets end of file needs it, and a file that grew
    // since is still read whole.
    if (done == bytes.size()) bytes.resize(bytes.size() + (bytes.size() / 2) + 4096);
    const ssize_t got = ::read(file.fd(), bytes.data() + done, bytes.size() - done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw UsageError("cannot read " + path.string() + ": " + std::strerror(errno));
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  bytes.resize(done);
  return bytes;
}

}  // namespace nibble::io
