// What `nibble prepare` reads: the inputs the user names (files, directories, glob patterns)
// expanded into sources, each read as a stream of decompressed bytes (plain, gzip, zstd) and cut
// into the pieces a tokenizer encodes, so that no source is ever held whole (except a text file
// that is one document of a loaded tokenizer: it is encoded whole, as the tokenizer would).
//   text   (.txt, .text, .md, or any file named directly): its bytes;
//   jsonl  (.jsonl, .ndjson): one JSON object per line, the document the string under `field`.
// Either may end in .gz or .zst. Every error names the file and the line (JSON lines) or the byte
// offset, and says what to do; all are UsageError (exit 2).
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nibble::train {

enum class InputKind : uint8_t { text, jsonl };
enum class Compression : uint8_t { none, gzip, zstd };

struct InputSource {
  std::filesystem::path path;
  InputKind kind = InputKind::text;
  Compression compression = Compression::none;
  std::optional<uint64_t> bytes;  // the file's size, where it has one (not a FIFO)
};

// `inputs` expanded, in order: a file as itself (kind and compression from its name); a directory
// as its regular files with a recognised extension, recursively, in name order, hidden ones
// skipped; a pattern glob(3) expands (quoted, so the shell left it) as its matches. A directory or
// pattern that finds nothing, a missing path, a device or socket is refused. `role` names the
// inputs in messages ("input", "--val input").
std::vector<InputSource> expand_inputs(const std::vector<std::filesystem::path>& inputs, std::string_view role);

// How the pieces of a source are cut.
enum class PieceMode : uint8_t {
  // A loaded tokenizer: one piece per document (a text file whole, a JSON line's text), each UTF-8.
  documents,
  // char: the text in pieces cut anywhere (encoding is byte by byte); JSON lines' texts each
  // followed by a line break.
  bytes,
  // bpe: as `bytes`, but pieces end after a line break or before a space, where no piece of
  // the trained model spans (so encoding the pieces gives encode() of the whole), and UTF-8.
  lines,
};

// The pieces of one source, read in order.
class PieceReader {
 public:
  // `piece_bytes`: the size pieces of text are cut at (bytes, lines modes).
  PieceReader(const InputSource& source, PieceMode mode, std::string field, size_t piece_bytes);
  ~PieceReader();
  PieceReader(const PieceReader&) = delete;
  PieceReader& operator=(const PieceReader&) = delete;

  // The next piece into `piece`; false at the end of the source.
  bool next(std::string& piece);
  // Bytes of the file consumed so far (compressed bytes for a compressed file).
  uint64_t consumed() const;
  // Documents completed so far (JSON lines; a text file counts as one at its end).
  int64_t documents() const { return documents_; }

 private:
  bool next_text(std::string& piece);
  bool next_jsonl(std::string& piece);
  bool next_line(std::string& line);
  std::string document_of(const std::string& line);
  void check_utf8(std::string_view text, uint64_t offset) const;
  size_t cut_point() const;

  class Bytes;
  const InputSource source_;
  const PieceMode mode_;
  const std::string field_;
  const size_t piece_bytes_;
  std::unique_ptr<Bytes> bytes_;
  std::string buffer_;  // read but not yet handed out
  uint64_t buffer_offset_ = 0;  // the offset of buffer_[0] in the decompressed text
  int64_t line_ = 0, documents_ = 0;
  bool end_ = false;
};

}  // namespace nibble::train
