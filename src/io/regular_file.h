// Reading a file whose format says how long it is (safetensors, .npy, token shards, tokenizer
// files, prepare.json). Only regular files are read: /dev/zero or /dev/urandom has no end and would
// be read until memory runs out, and a FIFO would block or hand over a stream that is no such file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string_view>
#include <vector>

namespace nibble::io {

// The whole file; UsageError naming `path` when it is missing, unreadable, a directory, or not a
// regular file (a device, FIFO or socket). `what` says what the file should have been ("a token
// shard"), for the message.
std::vector<uint8_t> read_regular_file(const std::filesystem::path& path, std::string_view what);

// An open read-only descriptor of a regular file and its size, with the same checks and messages:
// for readers that map the file instead of reading it (token files). Closes itself.
class RegularFile {
 public:
  RegularFile(const std::filesystem::path& path, std::string_view what);
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  ~RegularFile();
  int fd() const { return fd_; }
  size_t size() const { return size_; }

 private:
  int fd_ = -1;
  size_t size_ = 0;
};

}  // namespace nibble::io
