// An exclusive lock on a directory, for the one process that may write a run directory at a time.
// It is flock(2) on the directory itself, not on a lock file inside it: nothing is created, so a
// command refused after taking the lock leaves every byte of the directory as it was, and there is
// no stale lock file to clean up. The kernel releases the lock when the process ends in any way
// (kill -9 included). Readers (eval, generate) do not take it: checkpoints appear by rename only.
#pragma once
#include <filesystem>
#include <string>

namespace nibble::io {

class DirectoryLock {
 public:
  // Locks `directory` (which must exist) or throws UsageError naming it, the process that holds the
  // lock (its PID, from /proc/locks) and `holder_hint` (what that process is, e.g. "another nibble
  // train"), so the user knows what to wait for or stop.
  DirectoryLock(const std::filesystem::path& directory, const std::string& holder_hint);
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;
  ~DirectoryLock();

 private:
  int fd_ = -1;
};

}  // namespace nibble::io
