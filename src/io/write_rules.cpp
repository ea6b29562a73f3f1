#include "io/write_rules.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <charconv>
#include <fstream>
#include <string>

#include "common/error.h"
#include "io/atomic_file.h"

namespace nibble::io {

namespace fs = std::filesystem;

namespace {

bool is_regular(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}
bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

bool is_within(const fs::path& inner, const fs::path& outer) {
  auto o = outer.begin(), i = inner.begin();
  for (; o != outer.end(); ++o, ++i) {
    if (o->empty()) continue;  // a trailing separator
    if (i == inner.end() || *i != *o) return false;
  }
  return true;
}

// An owned directory somewhere below `dir` (not `dir` itself), `depth` levels down at most.
std::optional<OwnedDirectory> owned_directory_below(const fs::path& dir, int depth) {
  if (depth <= 0) return std::nullopt;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_symlink(ec) || !it->is_directory(ec)) continue;
    if (const DirectoryKind k = directory_kind(it->path()); k != DirectoryKind::other) return OwnedDirectory{it->path(), k};
    if (auto below = owned_directory_below(it->path(), depth - 1)) return below;
  }
  return std::nullopt;
}

std::string fix_for(DirectoryKind kind) {
  return kind == DirectoryKind::run ? "only nibble train writes into a run directory: choose an output outside it"
                                    : "only nibble prepare writes into a data directory: choose an output outside it";
}

}  // namespace

DirectoryKind directory_kind(const fs::path& dir) {
  if (is_regular(dir / "config.yaml") && (is_regular(dir / "metrics.jsonl") || is_dir(dir / "checkpoints")))
    return DirectoryKind::run;
  if (is_regular(dir / "prepare.json")) return DirectoryKind::data;
  return DirectoryKind::other;
}

std::string_view to_string(DirectoryKind kind) {
  switch (kind) {
    case DirectoryKind::run: return "run directory";
    case DirectoryKind::data: return "data directory";
    case DirectoryKind::other: break;
  }
  return "directory";
}

std::optional<OwnedDirectory> enclosing_owned_directory(const fs::path& path) {
  for (fs::path p = resolved_path(path); !p.empty(); p = p.parent_path()) {
    if (const DirectoryKind k = directory_kind(p); k != DirectoryKind::other) return OwnedDirectory{p, k};
    if (p == p.root_path()) break;
  }
  return std::nullopt;
}

void refuse_output_in_owned_directory(const fs::path& output, std::string_view command, int depth) {
  if (auto owner = enclosing_owned_directory(output)) {
    const bool is_it = resolved_path(output) == owner->dir;
    throw UsageError(std::string(command) + " -o " + output.string() + ": " + (is_it ? "is" : "lies inside") +
                     " the " + std::string(to_string(owner->kind)) + " " + owner->dir.string() + "; " +
                     fix_for(owner->kind));
  }
  if (is_dir(output) && !fs::is_symlink(output))
    if (auto below = owned_directory_below(output, depth))
      throw UsageError(std::string(command) + " -o " + output.string() + ": it holds the " +
                       std::string(to_string(below->kind)) + " " + below->dir.string() +
                       ", which the output would replace; " + fix_for(below->kind));
}

void refuse_output_overlapping_inputs(const fs::path& output, std::span<const fs::path> inputs,
                                      std::string_view command) {
  const fs::path out = resolved_path(output);
  for (const fs::path& input : inputs) {
    const fs::path in = resolved_path(input);
    std::error_code ec;
    const bool same = in == out || fs::equivalent(input, output, ec);
    const char* relation = same ? "is" : is_within(in, out) ? "holds" : is_within(out, in) ? "lies inside" : nullptr;
    if (relation)
      throw UsageError(std::string(command) + " -o " + output.string() + ": the output " + relation + " the input " +
                       input.string() + ", which writing it would destroy; choose an output that is not among the inputs");
  }
}

OutputFile resolve_output_file(const fs::path& output) {
  struct stat st{};
  if (::stat(output.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode))
      throw UsageError("-o " + output.string() + " is a directory: give a file name in it, or another path");
    if (!S_ISREG(st.st_mode)) return {OutputFile::Mode::direct, output};
    std::error_code ec;
    const fs::path target = fs::canonical(output, ec);
    return {OutputFile::Mode::atomic, ec ? output : target};
  }
  std::error_code ec;
  if (fs::is_symlink(output, ec)) {  // dangling: create the file it names, if its directory exists
    const fs::path link = fs::read_symlink(output, ec);
    const fs::path target = link.is_absolute() ? link : output.parent_path() / link;
    if (!is_dir(target.parent_path().empty() ? fs::path(".") : target.parent_path()))
      throw UsageError("-o " + output.string() + " is a symlink to " + target.string() +
                       ", whose directory does not exist: create it or give another -o");
    return {OutputFile::Mode::atomic, target};
  }
  return {OutputFile::Mode::atomic, output};
}

namespace {

// A device node or FIFO takes the bytes where it is: opened without O_CREAT or O_TRUNC (nothing is
// created or cut), written to the end, and never removed, whatever fails.
void write_in_place(const fs::path& path, std::span<const uint8_t> bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) throw UsageError("cannot open -o " + path.string() + " for writing: " + std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      throw UsageError("cannot write -o " + path.string() + ": " + std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
}

}  // namespace

void write_output_file(const fs::path& output, std::span<const uint8_t> bytes) {
  const OutputFile out = resolve_output_file(output);
  if (out.mode == OutputFile::Mode::direct)
    write_in_place(out.path, bytes);
  else
    write_file_atomically(out.path, bytes);
}

std::optional<long> temporary_owner_pid(std::string_view file_name, std::string_view of_name) {
  const std::string prefix = std::string(of_name) + ".tmp.";
  if (!file_name.starts_with(prefix) || file_name.size() == prefix.size()) return std::nullopt;
  const std::string_view digits = file_name.substr(prefix.size());
  long pid = 0;
  auto [end, err] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
  if (err != std::errc() || end != digits.data() + digits.size() || pid <= 0) return std::nullopt;
  return pid;
}

bool is_temporary_name(std::string_view file_name, std::string_view of_name) {
  return temporary_owner_pid(file_name, of_name).has_value();
}

bool process_is_alive(long pid) {
  if (pid <= 0 || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM)) return false;
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  if (!status) return !fs::exists("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.starts_with("VmSize:")) return true;
  return false;
}

fs::path resolved_path(const fs::path& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  if (ec) p = fs::absolute(path).lexically_normal();
  return p.has_filename() ? p : p.parent_path();
}

}  // namespace nibble::io
