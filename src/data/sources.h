// The sources of a data mixture (`data.sources`, docs/data-directory.md "Mixtures"): each a
// directory or file list of its own (data/token_files.h's DataSpec), loaded by load_dataset and
// checked to share one tokenizer, so that the run, its checkpoints and eval/generate/export see one
// vocabulary whichever source a row came from.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "data/token_files.h"

namespace nibble::train {

struct DataSource {
  std::string name;  // [A-Za-z0-9_.-]+: a metrics key (val_loss.NAME) and a TensorBoard tag
  double weight = 0;  // positive; the weights are normalised to sum to 1
  DataSpec spec;
};

// The name a source gets when its entry gives none: the base name of its directory.
std::string default_source_name(const std::string& dir);
// UsageError unless `name` can serve as a source name; `fix` says how to give another.
void check_source_name(std::string_view name, std::string_view fix);

struct LoadedSource {
  std::string name;
  double weight = 0;
  Dataset data;
};
// Every source loaded (errors name the source when there are several), then refused unless all
// share the first's tokenizer identity, naming both sources and both tokenizers.
std::vector<LoadedSource> load_sources(const std::vector<DataSource>& sources);

}  // namespace nibble::train
