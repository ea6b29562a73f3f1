#include "data/data_directory.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc >= 2.28)
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "common/error.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "io/atomic_file.h"
#include "io/checksum.h"
#include "io/regular_file.h"
#include "io/write_rules.h"

namespace nibble::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kManifestKey = "files";
// What prepare writes into a data directory: the data files, then prepare.json.
constexpr std::string_view kDataFiles[] = {kTrainShardFile, kValShardFile,      kTokenizerFile,
                                           kSentencePieceFile, kTiktokenFile, kNibbleTokenizerFile};

bool is_data_file(std::string_view name) {
  return std::find(std::begin(kDataFiles), std::end(kDataFiles), name) != std::end(kDataFiles) || is_shard_name(name);
}

// The data files in DIR (regular or not: a symlink in place of a shard must be reported too).
std::vector<std::string> data_files_in(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (is_data_file(it->path().filename().string())) names.push_back(it->path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string redo_advice(const fs::path& dir) {
  return fmt::format("prepare it again: nibble prepare TEXT... -o {} --force", dir.string());
}

// DIR's manifest (prepare.json's "files"): nullopt when DIR has no prepare.json, or one without
// "files" (an earlier nibble's). UsageError for a damaged record.
std::optional<json> read_manifest(const fs::path& dir) {
  const fs::path record = dir / kPrepareFile;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(record, ec))) return std::nullopt;
  const auto bytes = io::read_regular_file(record, "a prepare.json record");
  const json j = json::parse(bytes.begin(), bytes.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    throw UsageError(
        fmt::format("{}: not a JSON object: the data directory is damaged; {}", record.string(), redo_advice(dir)));
  if (!j.contains(kManifestKey)) return std::nullopt;
  const json& files = j[kManifestKey];
  bool well_formed = files.is_object();
  // Only a data file's name may appear: the manifest must not make a reader open anything else.
  for (auto it = files.begin(); well_formed && it != files.end(); ++it)
    well_formed = is_data_file(it.key()) && it->is_object() && it->contains("bytes") &&
                  (*it)["bytes"].is_number_unsigned() && it->contains("checksum") && (*it)["checksum"].is_string();
  if (!well_formed)
    throw UsageError(fmt::format("{}: its \"files\" record is damaged (each entry names a data file with its bytes "
                                 "and checksum); {}",
                                 record.string(), redo_advice(dir)));
  return files;
}

std::string unlisted_message(const fs::path& dir, std::string_view name) {
  return fmt::format("{}: prepare.json does not list this file, so it was put there after `nibble prepare` wrote the "
                     "directory (the files come from different `nibble prepare` runs); {}",
                     (dir / name).string(), redo_advice(dir));
}

void check_recorded(const fs::path& dir, std::string_view name, uint64_t actual_size,
                    const std::function<std::string()>& hash, const json& files) {
  const auto entry = files.find(std::string(name));
  if (entry == files.end()) {
    if (is_data_file(name)) throw UsageError(unlisted_message(dir, name));
    return;  // a file prepare does not write (eval --tokens D/other.bin): nothing records it
  }
  const uint64_t size = (*entry)["bytes"].get<uint64_t>();
  const std::string recorded = (*entry)["checksum"].get<std::string>();
  const std::string actual = hash();
  if (size != actual_size || recorded != actual)
    throw UsageError(fmt::format("{}: {} bytes with checksum {}, but prepare.json records {} bytes with checksum {}: "
                                 "the file was changed or damaged after `nibble prepare` wrote it, or the files come "
                                 "from different `nibble prepare` runs; {}",
                                 (dir / name).string(), actual_size, actual, size, recorded, redo_advice(dir)));
}

// The first entry of DIR that prepare does not write there (anything but a regular data file,
// prepare.json, or an atomic writer's temporary of one), "" when there is none. A directory that
// cannot be listed counts as foreign: nothing in it is removed.
std::string foreign_entry(const fs::path& dir) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  for (const fs::directory_iterator end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    bool ours = false;
    for (std::string_view known : kDataFiles) ours |= name == known || io::is_temporary_name(name, known);
    ours |= is_shard_name(name) || name == kSpoolFile;
    ours |= name == kPrepareFile || io::is_temporary_name(name, kPrepareFile);
    std::error_code type_error;
    if (!ours || it->is_symlink(type_error) || !it->is_regular_file(type_error)) return name;
  }
  return ec ? fmt::format("(its entries cannot be listed: {})", ec.message()) : "";
}

void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // durability only: some filesystems cannot fsync a directory
  ::fsync(fd);
  ::close(fd);
}

std::string appeared_message(const fs::path& destination) {
  return fmt::format("{} was created while this prepare ran (by another prepare?), so nothing was replaced: pass "
                     "--force to replace it",
                     destination.string());
}

fs::path sibling(const fs::path& destination, std::string_view suffix) {
  const std::string name = destination.filename().string() + std::string(suffix) + std::to_string(::getpid());
  return destination.parent_path() / name;
}

}  // namespace

std::vector<uint8_t> read_data_file(const fs::path& dir, std::string_view name, std::string_view what) {
  std::vector<uint8_t> bytes = io::read_regular_file(dir / name, what);
  if (const auto files = read_manifest(dir))
    check_recorded(dir, name, bytes.size(), [&] { return io::content_hash(bytes); }, *files);
  return bytes;
}

void check_data_file(const fs::path& dir, std::string_view name, uint64_t size, const std::function<std::string()>& hash) {
  if (const auto files = read_manifest(dir)) check_recorded(dir, name, size, hash, *files);
}

bool check_data_directory(const fs::path& dir) {
  const auto files = read_manifest(dir);
  if (!files) {
    fmt::print(stderr,
               "warning: {} has no record of its files' checksums (it was prepared by an earlier nibble, or not by "
               "nibble prepare): its files are read unverified; `nibble prepare TEXT... -o {} --force` writes it again "
               "with them\n",
               dir.string(), dir.string());
    return false;
  }
  for (const std::string& name : data_files_in(dir))
    if (!files->contains(name)) throw UsageError(unlisted_message(dir, name));
  for (auto it = files->begin(); it != files->end(); ++it) {
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(dir / it.key(), ec)))
      throw UsageError(fmt::format("{}: missing, though prepare.json lists it: the data directory lost a file; {}",
                                   (dir / it.key()).string(), redo_advice(dir)));
  }
  return true;
}

void write_prepare_record(const fs::path& dir, json record) {
  json files = json::object();
  for (const std::string& name : data_files_in(dir)) {
    std::error_code ec;
    if (!fs::is_regular_file(dir / name, ec)) continue;
    // Hashed in pieces: a shard of gigabytes is never read into memory whole.
    const auto hash = io::file_content_hash(dir / name);
    if (!hash) throw UsageError(fmt::format("cannot read {} back to checksum it", (dir / name).string()));
    files[name] = {{"bytes", fs::file_size(dir / name)}, {"checksum", *hash}};
  }
  record[kManifestKey] = std::move(files);
  const std::string text = record.dump(2) + "\n";
  io::write_file_atomically(dir / kPrepareFile, std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

fs::path data_directory_destination(const fs::path& output) { return io::resolved_path(output); }

void check_prepare_output(const fs::path& output, std::span<const fs::path> inputs, bool force) {
  if (output.empty()) throw UsageError("prepare -o is empty: give the directory to write the data into");
  io::refuse_output_overlapping_inputs(output, inputs, "prepare");
  const fs::path destination = data_directory_destination(output);
  const std::string o = output.string();
  if (const auto owner = io::enclosing_owned_directory(output)) {
    const bool is_it = owner->dir == destination;
    if (owner->kind == io::DirectoryKind::run)
      throw UsageError(fmt::format("prepare -o {}: {} the run directory {}; only nibble train writes into a run "
                                   "directory (its tokenizer belongs to its checkpoints): prepare into a directory of "
                                   "its own and set data.dir to it",
                                   o, is_it ? "is" : "lies inside", owner->dir.string()));
    if (!is_it)
      throw UsageError(fmt::format("prepare -o {}: lies inside the data directory {}, which holds only its own files: "
                                   "choose an output outside it",
                                   o, owner->dir.string()));
    if (!force)
      throw UsageError(fmt::format("prepare -o {}: it already holds prepared data; pass --force to replace it (the runs "
                                   "trained on it then read the new data), or choose another -o",
                                   o));
    if (const std::string foreign = foreign_entry(destination); !foreign.empty())
      throw UsageError(fmt::format("prepare -o {} --force: the data directory holds {}, which nibble prepare did not "
                                   "write and replacing the directory would delete: move it out first, or choose "
                                   "another -o",
                                   o, (destination / foreign).string()));
    return;
  }
  std::error_code ec;
  const auto status = fs::status(destination, ec);
  if (fs::is_symlink(fs::symlink_status(output, ec)) && !fs::exists(status))
    throw UsageError(fmt::format("prepare -o {}: a symlink to nothing: give the directory itself", o));
  if (!fs::exists(status)) return;
  if (!fs::is_directory(status))
    throw UsageError(fmt::format("prepare -o {}: exists and is not a directory; prepare writes a directory: give a new "
                                 "name",
                                 o));
  if (!fs::is_empty(destination, ec))
    throw UsageError(fmt::format("prepare -o {}: a directory that holds other files and no prepare.json, so it is no "
                                 "data directory; prepare writes a directory of its own: give a name that does not "
                                 "exist yet, or an empty directory",
                                 o));
}

std::vector<fs::path> remove_stale_prepare_directories(const fs::path& destination) {
  const std::string name = destination.filename().string();
  std::vector<fs::path> stale;
  std::error_code ec;
  fs::directory_iterator it(destination.parent_path(), ec);
  for (const fs::directory_iterator end; !ec && it != end; it.increment(ec)) {
    const std::string entry = it->path().filename().string();
    auto pid = io::temporary_owner_pid(entry, name);
    if (!pid) pid = io::temporary_owner_pid(entry, name + ".old");
    std::error_code type_error;
    if (pid && !io::process_is_alive(*pid) && !it->is_symlink(type_error) && it->is_directory(type_error) &&
        foreign_entry(it->path()).empty())
      stale.push_back(it->path());
  }
  std::vector<fs::path> removed;
  for (const fs::path& p : stale) {
    std::error_code remove_error;
    fs::remove_all(p, remove_error);
    if (!remove_error) removed.push_back(p);
  }
  return removed;
}

StagedDataDirectory::StagedDataDirectory(fs::path destination) : destination_(std::move(destination)) {
  const fs::path parent = destination_.parent_path();
  std::error_code ec;
  for (fs::path p = parent; !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    first_created_parent_ = p;
    if (p == p.root_path()) break;
  }
  if (!first_created_parent_.empty() && !fs::create_directories(parent, ec) && ec)
    throw UsageError(fmt::format("cannot create the directory {}: {}", parent.string(), ec.message()));
  staging_ = sibling(destination_, ".tmp.");
  int err = ::mkdir(staging_.c_str(), 0777) == 0 ? 0 : errno;
  if (err == EEXIST && foreign_entry(staging_).empty()) {
    // Left by an earlier process that had this pid (pids repeat, in containers especially).
    fs::remove_all(staging_, ec);
    err = ::mkdir(staging_.c_str(), 0777) == 0 ? 0 : errno;
  }
  if (err != 0) {
    remove_created_parents();
    throw UsageError(fmt::format("cannot create {}: {}", staging_.string(), std::strerror(err)));
  }
}

StagedDataDirectory::~StagedDataDirectory() {
  if (committed_) return;
  std::error_code ignored;
  fs::remove_all(staging_, ignored);
  remove_created_parents();
}

void StagedDataDirectory::remove_created_parents() noexcept {
  if (first_created_parent_.empty()) return;
  for (fs::path p = destination_.parent_path(); !p.empty(); p = p.parent_path()) {
    std::error_code ignored;
    fs::remove(p, ignored);  // only an empty directory goes
    if (p == first_created_parent_ || p == p.root_path()) break;
  }
}

bool StagedDataDirectory::commit(bool force) {
  sync_directory(staging_);
  std::error_code ec;
  const bool replacing = fs::exists(fs::symlink_status(destination_, ec));
  if (replacing && !force && !fs::is_empty(destination_, ec))
    throw UsageError(appeared_message(destination_));
  if (replacing)
    replace_existing();
  else
    move_into_place();
  sync_directory(destination_.parent_path());
  return replacing;
}

void StagedDataDirectory::move_into_place() {
  // RENAME_NOREPLACE: a DEST made since the check above (by another prepare) is not replaced.
  int rc = ::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, destination_.c_str(), RENAME_NOREPLACE);
  if (rc != 0 && (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP))
    rc = ::rename(staging_.c_str(), destination_.c_str());
  if (rc != 0)
    throw UsageError(errno == EEXIST || errno == ENOTEMPTY
                         ? appeared_message(destination_)
                         : fmt::format("cannot move {} to {}: {}", staging_.string(), destination_.string(),
                                       std::strerror(errno)));
  committed_ = true;
}

void StagedDataDirectory::replace_existing() {
  // Checked again: the tokenizer may have trained for minutes since check_prepare_output.
  if (const std::string foreign = foreign_entry(destination_); !foreign.empty())
    throw UsageError(fmt::format("{} now holds {}, which nibble prepare did not write: it changed while preparing, "
                                 "so nothing was replaced",
                                 destination_.string(), (destination_ / foreign).string()));
  std::error_code ignored;
  if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, destination_.c_str(), RENAME_EXCHANGE) == 0) {
    committed_ = true;
    fs::remove_all(staging_, ignored);  // now the old directory; should this fail, the next prepare removes it
    return;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
    throw UsageError(fmt::format("cannot replace {}: {}", destination_.string(), std::strerror(errno)));
  // No RENAME_EXCHANGE here (some network and FUSE filesystems): the old directory moves aside
  // first, so for a moment DEST does not exist; a prepare killed then leaves both directories as
  // temporaries, and the next prepare of DEST removes them.
  const fs::path aside = sibling(destination_, ".old.tmp.");
  if (::rename(destination_.c_str(), aside.c_str()) != 0)
    throw UsageError(fmt::format("cannot move {} aside: {}", destination_.string(), std::strerror(errno)));
  if (::rename(staging_.c_str(), destination_.c_str()) != 0) {
    const int err = errno;
    ::rename(aside.c_str(), destination_.c_str());
    throw UsageError(
        fmt::format("cannot move {} to {}: {}", staging_.string(), destination_.string(), std::strerror(err)));
  }
  committed_ = true;
  fs::remove_all(aside, ignored);
}

}  // namespace nibble::train
