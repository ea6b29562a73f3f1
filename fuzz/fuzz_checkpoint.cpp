// libFuzzer target for checkpoint loading: the input is split into the three files of a checkpoint
// (model.safetensors, optimizer.safetensors, state.json) and loaded into a tiny model; a damaged
// or foreign checkpoint must be refused with UsageError, never crash or half-load silently.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>

#include "common/error.h"
#include "run/checkpoint.h"

namespace {
namespace fs = std::filesystem;

struct TinyRun {
  nibble::model::ModelConfig config;
  std::unique_ptr<nibble::model::Transformer> model;
  std::unique_ptr<nibble::train::AdamW> optimizer;
  fs::path dir;
  TinyRun() {
    config.vocab = 8;
    config.layers = 1;
    config.heads = 2;
    config.width = 16;
    config.mlp_hidden = 32;
    config.context = 8;
    model = std::make_unique<nibble::model::Transformer>(config, nibble::ops::cpu());
    optimizer = std::make_unique<nibble::train::AdamW>(model->params(), nibble::train::AdamWConfig{}, model->backend());
    dir = fs::temp_directory_path() / ("nibble-fuzz-checkpoint-" + std::to_string(getpid()));
    fs::create_directories(dir);
  }
};

void write(const fs::path& p, const uint8_t* data, size_t n) {
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n));
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static TinyRun run;
  // Two little-endian u16 lengths split the rest of the input into the three files.
  if (size < 4) return 0;
  const size_t model_len = std::min<size_t>(data[0] | data[1] << 8, size - 4);
  const size_t opt_len = std::min<size_t>(data[2] | data[3] << 8, size - 4 - model_len);
  const uint8_t* p = data + 4;
  write(run.dir / "model.safetensors", p, model_len);
  write(run.dir / "optimizer.safetensors", p + model_len, opt_len);
  write(run.dir / "state.json", p + model_len + opt_len, size - 4 - model_len - opt_len);
  try {
    nibble::train::load_checkpoint(run.dir, *run.model, run.optimizer.get());
  } catch (const nibble::UsageError&) {
  }
  return 0;
}
