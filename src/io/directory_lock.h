// Locks on directories, all flock(2) on the directory itself, not on a lock file inside it: nothing
// is created, so a command refused after taking a lock leaves every byte of the directory as it
// was, and there is no stale lock file to clean up. The kernel releases a lock when the process
// ends in any way (kill -9 included).
// - DirectoryLock: exclusive, on a run directory, for the one process that may write it.
// - CheckpointLock: between the readers of a checkpoint (eval, generate, export: shared, held while
//   they read it) and the trainer that removes or replaces it (exclusive, never waited for: a
//   checkpoint being read is removed at a later rotation instead).
#pragma once
#include <filesystem>
#include <memory>
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

class CheckpointLock {
 public:
  // A reader's shared lock on `directory`, waiting while a remover holds it. nullptr when the
  // directory does not exist, or once locked is no longer at `directory` (renamed away or removed
  // while this waited): the caller lists the checkpoints again. UsageError when it cannot be opened
  // for another reason (permissions).
  static std::unique_ptr<CheckpointLock> for_reading(const std::filesystem::path& directory);
  // A remover's exclusive lock on `directory`, only when nobody holds one: nullptr while a reader
  // reads it (or when it does not exist).
  static std::unique_ptr<CheckpointLock> for_removal_if_unread(const std::filesystem::path& directory);
  CheckpointLock(const CheckpointLock&) = delete;
  CheckpointLock& operator=(const CheckpointLock&) = delete;
  ~CheckpointLock();

 private:
  explicit CheckpointLock(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace nibble::io
