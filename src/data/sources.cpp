#include "data/sources.h"

#include <fmt/format.h>

#include <filesystem>

#include "common/error.h"

namespace nibble::train {

std::string default_source_name(const std::string& dir) {
  std::filesystem::path p = std::filesystem::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "data/web/" names "web"
  return p.filename().string();
}

void check_source_name(std::string_view name, std::string_view fix) {
  bool plain = !name.empty() && name != "." && name != "..";
  for (char c : name)
    plain = plain && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                      c == '-' || c == '.');
  if (!plain)
    throw UsageError(fmt::format("data.sources: '{}' cannot name a source: a name is letters, digits, '_', '-' or '.' "
                                 "(it becomes the metrics key val_loss.NAME); {}",
                                 name, fix));
}

namespace {

std::string tokenizer_of(const LoadedSource& s) {
  if (s.data.tokenizer)
    return fmt::format("{} tokenizer of {} ids, identity {}", to_string(s.data.tokenizer->kind()), s.data.vocab_size,
                       s.data.tokenizer_identity);
  return fmt::format("no tokenizer, {}", s.data.tokenizer_identity);
}

}  // namespace

std::vector<LoadedSource> load_sources(const std::vector<DataSource>& sources) {
  std::vector<LoadedSource> loaded;
  for (const DataSource& source : sources) {
    LoadedSource s{source.name, source.weight, {}};
    try {
      s.data = load_dataset(source.spec);
    } catch (const UsageError& e) {
      if (sources.size() == 1) throw;
      throw UsageError(fmt::format("data.sources: source '{}': {}", source.name, e.what()));
    }
    if (sources.size() > 1 && s.data.val.empty())
      throw UsageError(fmt::format("data.sources: source '{}' has no validation tokens: give it validation files "
                                   "(val_files, or a directory with them) so that its loss can be measured",
                                   source.name));
    if (!loaded.empty() && s.data.tokenizer_identity != loaded[0].data.tokenizer_identity)
      throw UsageError(fmt::format("data.sources: source '{}' ({}) and source '{}' ({}) have different tokenizers: "
                                   "token ids mean one thing in a run, so prepare every source with the same "
                                   "tokenizer (`nibble prepare --tokenizer ...`)",
                                   loaded[0].name, tokenizer_of(loaded[0]), s.name, tokenizer_of(s)));
    loaded.push_back(std::move(s));
  }
  return loaded;
}

}  // namespace nibble::train
