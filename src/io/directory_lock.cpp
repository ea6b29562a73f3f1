#include "io/directory_lock.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "common/error.h"

namespace nibble::io {

namespace {

// The PID holding a flock on the file with inode `inode`, from /proc/locks lines such as
// "3: FLOCK  ADVISORY  WRITE 4242 08:01:1234567 0 EOF"; -1 when not found (no /proc).
long lock_holder(ino_t inode) {
  std::ifstream in("/proc/locks");
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string number, kind, mode, access, where;
    long pid = -1;
    if (!(fields >> number >> kind)) continue;
    if (kind == "->") fields >> kind;  // a waiter, listed under the holder
    if (!(fields >> mode >> access >> pid >> where) || kind != "FLOCK") continue;
    const auto colon = where.rfind(':');
    if (colon != std::string::npos && where.substr(colon + 1) == std::to_string(inode)) return pid;
  }
  return -1;
}

}  // namespace

DirectoryLock::DirectoryLock(const std::filesystem::path& directory, const std::string& holder_hint) {
  fd_ = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd_ < 0)
    throw UsageError(fmt::format("cannot open '{}' to lock it: {}", directory.string(), std::strerror(errno)));
  if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) return;
  const int error = errno;
  struct stat st {};
  const long pid = ::fstat(fd_, &st) == 0 ? lock_holder(st.st_ino) : -1;
  ::close(fd_);
  fd_ = -1;
  if (error != EWOULDBLOCK)
    throw UsageError(fmt::format("cannot lock '{}': {}", directory.string(), std::strerror(error)));
  throw UsageError(fmt::format("'{}' is in use by {} (PID {}): one process at a time may write a run directory. Wait "
                               "for it to finish or stop it (kill {}), or choose another run.dir",
                               directory.string(), holder_hint, pid >= 0 ? std::to_string(pid) : "unknown",
                               pid >= 0 ? std::to_string(pid) : "PID"));
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);
}

std::unique_ptr<CheckpointLock> CheckpointLock::for_reading(const std::filesystem::path& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 && errno != ENOENT && errno != ENOTDIR)
    throw UsageError(fmt::format("cannot open '{}' to read it: {}", directory.string(), std::strerror(errno)));
  if (fd < 0) return nullptr;
  int locked;
  while ((locked = ::flock(fd, LOCK_SH)) != 0 && errno == EINTR) {
  }
  // A remover renames the directory away while it holds the exclusive lock, before this one can
  // have it: the path then names another directory, or none.
  struct stat held {}, now {};
  if (locked != 0 || ::fstat(fd, &held) != 0 || ::stat(directory.c_str(), &now) != 0 || held.st_ino != now.st_ino ||
      held.st_dev != now.st_dev) {
    ::close(fd);
    return nullptr;
  }
  return std::unique_ptr<CheckpointLock>(new CheckpointLock(fd));
}

std::unique_ptr<CheckpointLock> CheckpointLock::for_removal_if_unread(const std::filesystem::path& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return nullptr;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return nullptr;
  }
  return std::unique_ptr<CheckpointLock>(new CheckpointLock(fd));
}

CheckpointLock::~CheckpointLock() { ::close(fd_); }

}  // namespace nibble::io
