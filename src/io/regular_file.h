// Reading a file whose format says how long it is (safetensors, .npy, token shards, tokenizer
// files, prepare.json). Only regular files are read: /dev/zero or /dev/urandom has no end and would
// be read until memory runs out, and a FIFO would block or hand over a stream that is no such file.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string_view>
#include <vector>

namespace nibble::io {

// The whole file; UsageError naming `path` when it is missing, unreadable, a directory, or not a
// regular file (a device, FIFO or socket). `what` says what the file should have been ("a token
// shard"), for the message.
std::vector<uint8_t> read_regular_file(const std::filesystem::path& path, std::string_view what);

}  // namespace nibble::io
