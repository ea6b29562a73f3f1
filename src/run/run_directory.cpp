#include "run/run_directory.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <string_view>

#include "common/error.h"
#include "data/tokenizer.h"
#include "io/write_rules.h"
#include "run/checkpoint.h"
#include "run/run.h"

namespace nibble::train {

namespace fs = std::filesystem;

namespace {

// The files nibble writes at the top of a run directory (run.h; the tokenizer's, data/tokenizer.h),
// and its directories there.
constexpr std::array<std::string_view, 6> kRunFiles = {kRunConfigFile,     kRunMetricsFile, kTokenizerFile,
                                                       kSentencePieceFile, kTiktokenFile,   kNibbleTokenizerFile};
constexpr std::array<std::string_view, 3> kRunSubdirectories = {"checkpoints", "abandoned", kRunTensorBoardDir};

bool is_run_file_temporary(std::string_view name) {
  return std::any_of(kRunFiles.begin(), kRunFiles.end(),
                     [&](std::string_view file) { return io::is_temporary_name(name, file); });
}

bool written_by_nibble_train(std::string_view name) {
  return std::find(kRunFiles.begin(), kRunFiles.end(), name) != kRunFiles.end() ||
         std::find(kRunSubdirectories.begin(), kRunSubdirectories.end(), name) != kRunSubdirectories.end() ||
         is_run_file_temporary(name);
}

bool same_directory(const fs::path& a, const fs::path& b) {
  std::error_code ec;
  return fs::equivalent(a, b, ec);
}

bool overrides_run_dir(std::span<const std::string> overrides) {
  return std::any_of(overrides.begin(), overrides.end(), [](const std::string& w) { return w.starts_with("run.dir="); });
}

}  // namespace

std::string settle_run_dir(RunConfig& config, const fs::path& config_file, std::span<const std::string> overrides) {
  const fs::path dir = config_file.has_parent_path() ? config_file.parent_path() : fs::path(".");
  if (config_file.filename() != kRunConfigFile || io::directory_kind(dir) != io::DirectoryKind::run) return "";
  if (overrides_run_dir(overrides)) {
    if (same_directory(config.run_dir, dir)) return "";
    return fmt::format("note: {} is the config of the run directory {}; training in run.dir={}, as the command line "
                       "says\n",
                       config_file.string(), dir.string(), config.run_dir);
  }
  if (same_directory(config.run_dir, dir)) return "";
  const std::string saved = config.run_dir;
  config.run_dir = dir.string();
  return fmt::format("note: {} names run.dir {}, but it is the config of the run directory {} (moved or copied): "
                     "continuing in {} (run.dir= on the command line would choose another directory)\n",
                     config_file.string(), saved, dir.string(), dir.string());
}

void refuse_owned_location(const fs::path& run_dir) {
  if (io::directory_kind(run_dir) == io::DirectoryKind::data)
    throw UsageError(fmt::format("run.dir '{}' is a data directory (made by nibble prepare): a run there would replace "
                                 "its tokenizer files. Choose another run.dir (e.g. runs/NAME) and keep data.dir={}",
                                 run_dir.string(), run_dir.string()));
  if (const auto owner = io::enclosing_owned_directory(io::resolved_path(run_dir).parent_path()))
    throw UsageError(fmt::format("run.dir '{}' lies inside the {} {}: only {} writes there. Choose a run.dir outside "
                                 "it (e.g. runs/NAME)",
                                 run_dir.string(), io::to_string(owner->kind), owner->dir.string(),
                                 owner->kind == io::DirectoryKind::run ? "the run's own trainer" : "nibble prepare"));
}

void refuse_redirected_entries(const fs::path& run_dir, bool tensorboard) {
  for (std::string_view name : kRunSubdirectories) {
    const fs::path sub = run_dir / name;
    std::error_code ec;
    const fs::file_status st = fs::symlink_status(sub, ec);
    if (ec || !fs::exists(st)) continue;
    if (fs::is_symlink(st))
      throw UsageError(fmt::format(
          "{} is a symlink (to {}): nibble writes, rotates and deletes checkpoints only inside the run directory, so "
          "{}/ must be a directory of it. To keep a run on another disk, move the whole run directory there and "
          "symlink the run directory itself (ln -s /other/disk/NAME {}), which nibble locks and follows; put the "
          "contents of {} back in place of the symlink first",
          sub.string(), fs::read_symlink(sub, ec).string(), name, run_dir.string(), sub.string()));
    // A file named abandoned is refused where a --checkpoint would move checkpoints into it.
    const bool needed = name == "checkpoints" || (name == kRunTensorBoardDir && tensorboard);
    if (needed && !fs::is_directory(st))
      throw UsageError(fmt::format("{} is not a directory, which nibble needs there: move it out of the way (or "
                                   "choose another run.dir)",
                                   sub.string()));
  }
  for (std::string_view name : kRunFiles) {
    const fs::path file = run_dir / name;
    std::error_code ec;
    if (fs::is_symlink(fs::symlink_status(file, ec)))
      throw UsageError(fmt::format("{} is a symlink (to {}): nibble writes only regular files inside the run "
                                   "directory. Replace it by a copy of the file it names (cp --remove-destination "
                                   "\"$(readlink -f {})\" {}), or symlink the whole run directory instead",
                                   file.string(), fs::read_symlink(file, ec).string(), file.string(), file.string()));
  }
}

void refuse_foreign_directory(const fs::path& run_dir) {
  std::error_code ec;
  if (!fs::exists(run_dir, ec) || io::directory_kind(run_dir) == io::DirectoryKind::run) return;
  for (fs::directory_iterator it(run_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!written_by_nibble_train(name))
      throw UsageError(fmt::format("run.dir '{}' is an existing directory that is not a run directory: it holds {}, "
                                   "which nibble train did not write. A new run goes into a new or empty directory: "
                                   "choose another run.dir (e.g. runs/NAME)",
                                   run_dir.string(), it->path().string()));
  }
  if (ec) throw UsageError(fmt::format("cannot list run.dir '{}': {}", run_dir.string(), ec.message()));
}

void remove_stray_temporaries(const fs::path& run_dir) {
  std::error_code ec;
  for (fs::directory_iterator it(run_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code status_ec;
    if (!fs::is_regular_file(it->symlink_status(status_ec))) continue;
    for (std::string_view file : kRunFiles) {
      const auto pid = io::temporary_owner_pid(name, file);
      if (!pid || io::process_is_alive(*pid)) continue;
      std::error_code ignored;
      fs::remove(it->path(), ignored);
    }
  }
}

}  // namespace nibble::train
