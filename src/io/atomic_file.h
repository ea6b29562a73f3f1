// Writing a file so that readers only ever see the complete old file or the complete new one:
// the bytes go to `<path>.tmp.<pid>` in the same directory, are flushed to disk, and the temporary
// is renamed over `path` only on success. On any failure (or if the writer is destroyed without
// commit(), e.g. because an exception unwound the stack) the temporary is removed, so a failed
// command leaves no output file behind. Used for quantize outputs and, later, checkpoints.
#pragma once
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <span>
#include <vector>

namespace nibble::io {

class AtomicFileWriter {
 public:
  // Creates the temporary file; throws UsageError naming `target` if it cannot be created.
  explicit AtomicFileWriter(std::filesystem::path target);
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();  // removes the temporary unless commit() succeeded

  void write(std::span<const uint8_t> bytes);
  // Flushes, fsyncs and renames the temporary over the target. After a throw nothing is left behind.
  void commit();

  const std::filesystem::path& target() const { return target_; }
  const std::filesystem::path& temporary() const { return temporary_; }

 private:
  void discard() noexcept;

  std::filesystem::path target_;
  std::filesystem::path temporary_;
  std::FILE* file_ = nullptr;
  bool committed_ = false;
};

// One-shot convenience: the whole file content at once.
void write_file_atomically(const std::filesystem::path& target, std::span<const uint8_t> bytes);

// Reads a whole file (regular file, pipe or device); throws UsageError naming the file and the
// reason (missing, a directory, permission denied, read error).
std::vector<uint8_t> read_file_bytes(const std::filesystem::path& path);

}  // namespace nibble::io
