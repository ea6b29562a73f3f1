// A data directory as `nibble prepare` writes it, whole or not at all: train-00000.bin ...,
// val-00000.bin ... (an earlier nibble wrote train.bin, val.bin),
// the tokenizer's files (tokenizer.json, + tokenizer.model for BPE; nibble_tokenizer.json with
// tokenizer.model or tokenizer.tiktoken for a given one) and, written last, prepare.json, whose "files" manifest
// records every other file's size and XXH3 checksum.
//
// Writing: the directory is built beside its destination, as DEST.tmp.PID, and renamed into place
// when complete. Over an existing one (`prepare --force`) the two are exchanged in one atomic
// rename where the filesystem has RENAME_EXCHANGE, and the old one is then removed; so a prepare
// killed, or stopped by a full disk, leaves the old directory or the new one, never a mix of their
// files. Such a prepare leaves its DEST.tmp.PID behind, which the next prepare of DEST removes.
//
// Reading: each file is checked against the manifest as it is read, so a directory changed after
// prepare wrote it (a tokenizer.json copied in from another prepare, a truncated copy) is refused
// instead of trained on. A directory prepared by a nibble from before the manifest (prepare.json
// without "files") is read unverified with a warning: the runs trained on it keep working, and
// `nibble prepare ... --force` rewrites it with one.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace nibble::train {

inline constexpr const char* kPrepareFile = "prepare.json";
// The tokens of the source being split into train and validation, spooled while prepare works
// (removed before the directory is complete; a killed prepare's is removed with its staging).
inline constexpr const char* kSpoolFile = "source-tokens.spool";

// The bytes of DIR/NAME (a regular file only), checked against DIR/prepare.json's record of NAME
// when the directory has a manifest. UsageError naming the file and the fix when it is missing, was
// changed, or is a data file the manifest does not list. `what` names the file's kind for messages.
std::vector<uint8_t> read_data_file(const std::filesystem::path& dir, std::string_view name, std::string_view what);

// read_data_file's check for a file read another way (a token shard memory-mapped): `size` is its
// length, and `hash` computes its io::content_hash, called only when the manifest records the file.
void check_data_file(const std::filesystem::path& dir, std::string_view name, uint64_t size,
                     const std::function<std::string()>& hash);

// Whether DIR's file set is the one its manifest records: every recorded file present, no data file
// unrecorded (their contents are checked by read_data_file as they are read). False, after a
// warning on stderr, for a directory without a manifest.
bool check_data_directory(const std::filesystem::path& dir);

// Writes DIR/prepare.json, last: `record` (inputs, tokenizer, counts) plus the manifest of the data
// files now in DIR.
void write_prepare_record(const std::filesystem::path& dir, nlohmann::json record);

// Where `nibble prepare -o OUTPUT` writes: OUTPUT made absolute, symlinks followed.
std::filesystem::path data_directory_destination(const std::filesystem::path& output);

// Refuses (UsageError naming the path and the fix), before anything is read or written, an output
// that is or lies in a run directory, lies in a data directory, is or holds one of `inputs`, is an
// existing data directory without `force` or one holding files prepare did not write, or is an
// existing file or non-empty directory of another kind.
void check_prepare_output(const std::filesystem::path& output, std::span<const std::filesystem::path> inputs,
                          bool force);

// Removes DEST.tmp.PID (and DEST.old.tmp.PID) directories that prepares of `destination` left when
// killed: only those of processes no longer alive, and only when they hold nothing but a data
// directory's files. Returns their paths.
std::vector<std::filesystem::path> remove_stale_prepare_directories(const std::filesystem::path& destination);

// A data directory under construction at DEST.tmp.PID (missing parents of DEST created). Unless
// commit() put it in place, the destructor removes it and the parents it created.
class StagedDataDirectory {
 public:
  explicit StagedDataDirectory(std::filesystem::path destination);
  StagedDataDirectory(const StagedDataDirectory&) = delete;
  StagedDataDirectory& operator=(const StagedDataDirectory&) = delete;
  ~StagedDataDirectory();

  const std::filesystem::path& path() const { return staging_; }
  // Renames the directory to DEST, replacing an existing DEST (which check_prepare_output allowed);
  // returns whether one was replaced. A data directory that appeared at DEST meanwhile (another
  // prepare's) is replaced only with `force`.
  bool commit(bool force);

 private:
  void move_into_place();
  void replace_existing();
  void remove_created_parents() noexcept;

  std::filesystem::path destination_, staging_, first_created_parent_;
  bool committed_ = false;
};

}  // namespace nibble::train
