// Where nibble may create, replace and delete (docs/run-directory.md, "What nibble writes"): only
// regular files and directories inside the run directory, the data directory or the output the user
// named, and it deletes only what it created. Every command that takes an output path asks here, so
// the rules live in one place:
// - an output is never inside a run directory (only the trainer writes there) nor inside a prepared
//   data directory (only prepare writes there), and never one of the command's own inputs;
// - an output that is a device node, FIFO or socket is written to directly (`-o /dev/null` leaves
//   /dev/null a device), a symlink is followed to the file it names; neither is ever renamed over.
// Run and data directories are recognised by the files nibble writes into them (below), so the rules
// hold for directories made by any nibble version and moved or copied anywhere.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string_view>

namespace nibble::io {

// A run directory holds config.yaml together with metrics.jsonl or checkpoints/ (what `nibble train`
// writes before its first step); a data directory holds prepare.json (what `nibble prepare` writes).
enum class DirectoryKind { other, run, data };
DirectoryKind directory_kind(const std::filesystem::path& dir);
std::string_view to_string(DirectoryKind kind);  // "run directory", "data directory", "directory"

// The nearest run or data directory that `path` is or lies in, symlinks followed (`path` itself
// need not exist: its nearest existing ancestor is resolved); nullopt when there is none.
struct OwnedDirectory {
  std::filesystem::path dir;
  DirectoryKind kind;
};
std::optional<OwnedDirectory> enclosing_owned_directory(const std::filesystem::path& path);

// Throws UsageError naming the run or data directory and the fix when `output` of `command` (e.g.
// "export", "compare -o") is one, lies inside one, or is an existing directory that holds one
// (searched to `depth` levels, so `-o runs --force` cannot replace a tree of runs).
void refuse_output_in_owned_directory(const std::filesystem::path& output, std::string_view command, int depth = 3);

// Throws UsageError when `output` is one of `inputs` (the same file, through any link), lies inside
// an input directory, or is a directory that holds an input (`prepare D/train-00000.bin -o D`).
void refuse_output_overlapping_inputs(const std::filesystem::path& output,
                                      std::span<const std::filesystem::path> inputs, std::string_view command);

// How an output file is written. `atomic`: a regular file (or none yet) at `path` (symlinks resolved),
// written to a temporary beside it and renamed over it. `direct`: a device node, FIFO or socket,
// opened and written in place. A directory, or a symlink whose target's directory does not exist, is
// refused with UsageError naming the path.
struct OutputFile {
  enum class Mode { atomic, direct } mode;
  std::filesystem::path path;  // where the bytes go: the symlink's target for a symlink
};
OutputFile resolve_output_file(const std::filesystem::path& output);

// Writes the whole of `bytes` to an output the user named (`-o`), as resolve_output_file says:
// atomically for a regular file (through a symlink: the file it names), in place for a device node
// or FIFO. Throws UsageError naming the path; a failed atomic write leaves the old file as it was.
void write_output_file(const std::filesystem::path& output, std::span<const uint8_t> bytes);

// True for a name nibble's atomic writers give their temporaries: `<name>.tmp.<digits>`. Whether a
// stray one may be removed is for its owner to say (only its own names, only a dead process's pid).
bool is_temporary_name(std::string_view file_name, std::string_view of_name);
// The pid in `<of_name>.tmp.<pid>`, when `file_name` is one.
std::optional<long> temporary_owner_pid(std::string_view file_name, std::string_view of_name);
// Whether process `pid` may still write: it exists and still has an address space. A killed process
// shows for a moment after its files and locks are gone, while the kernel finishes its exit (and a
// zombie stays until reaped); its memory goes first, so no VmSize in /proc/PID/status means it writes
// nothing more. Without /proc, kill(2)'s answer stands.
bool process_is_alive(long pid);

// `path` absolute, symlinks resolved as far as it exists (a name not yet created keeps its last
// components as given), without a trailing separator ("D/" is D): how outputs and directories are
// compared with each other.
std::filesystem::path resolved_path(const std::filesystem::path& path);

}  // namespace nibble::io
