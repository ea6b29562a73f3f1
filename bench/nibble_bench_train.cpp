// nibble_bench_train: training tokens/s of the `nibble bench train` model under each recipe, on the
// CPU or a GPU, as a program of its own: a NIBBLE_CUDA_ONLY build (an offline GPU machine,
// scripts/gpu-check.sh) has no nibble command. The model, the options and the recipes are
// src/bench/train_bench.h's, as `nibble bench train`'s; random tokens (speed does not depend on them).
// bench/torch_train.py --vs-nibble FILE prints PyTorch's rates on the same model next to these.
//   nibble_bench_train [--recipes LIST] [--layers N] [--width N] [--heads N] [--context N] [--batch N]
//                      [--warmup N] [--timed-steps N] [--device cpu|cuda] [--json FILE]
// (defaults: bench::standalone_defaults() and bench::kSpeedShape).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "bench/train_bench.h"
#include "common/wait_policy.h"
#include "train/experiment.h"

namespace {

using namespace nibble;

// {"device": ..., "model": {...}, "results": [...]}, written to a temporary name and renamed: a reader
// never sees half a file. "model" is the shape bench/torch_train.py --vs-nibble runs PyTorch on.
void write_json(const std::string& path, const train::TrainConfig& c, const std::string& results) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) throw UsageError("cannot write '" + tmp + "': " + std::strerror(errno));
  std::fprintf(f,
               "{\"device\": \"%s\", \"model\": {\"layers\": %lld, \"width\": %lld, \"heads\": %lld, \"kv_heads\": %lld, "
               "\"context\": %lld, \"vocab\": %lld, \"batch\": %lld}, \"results\": [%s]}\n",
               std::string(ops::to_string(c.device)).c_str(), static_cast<long long>(c.model.layers),
               static_cast<long long>(c.model.width), static_cast<long long>(c.model.heads),
               static_cast<long long>(c.model.kv_head_count()), static_cast<long long>(c.model.context),
               static_cast<long long>(c.model.vocab), static_cast<long long>(c.batch), results.c_str());
  const bool ok = std::fclose(f) == 0;
  std::error_code ec;
  if (ok) std::filesystem::rename(tmp, path, ec);
  if (!ok || ec) throw UsageError("cannot write '" + path + "'" + (ec ? ": " + ec.message() : std::string()));
}

int run(int argc, char** argv) {
  bench::TrainBenchOptions o = bench::standalone_defaults();
  if (!bench::parse_standalone_args(argc, argv, o)) return 0;
  const train::TrainConfig base = bench::speed_config(o, o.vocab > 0 ? o.vocab : bench::kCharVocab);
  (void)ops::backend(base.device);  // no usable GPU: the fix, before anything is printed
  const auto recipes = bench::resolve_recipes(o);
  std::mt19937 rng(1337);
  std::vector<int32_t> corpus(200000);
  for (auto& t : corpus) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(base.model.vocab));

  const std::string device(ops::to_string(base.device));
  std::printf("nibble_bench_train: %lld layers x width %lld x %lld heads, context %lld, batch %lld (%lld tokens/step) "
              "on %s; %lld warm-up + %lld timed steps\n",
              static_cast<long long>(base.model.layers), static_cast<long long>(base.model.width),
              static_cast<long long>(base.model.heads), static_cast<long long>(base.model.context),
              static_cast<long long>(base.batch), static_cast<long long>(base.batch * base.model.context),
              device.c_str(), static_cast<long long>(o.warmup), static_cast<long long>(o.timed_steps));
  std::printf("%-8s %10s %9s\n", "recipe", "tokens/s", "step ms");
  std::string results;
  for (const auto& [name, recipe] : recipes) {
    train::TrainConfig c = base;
    c.recipe = recipe;
    const train::SpeedResult r = train::measure_training_speed(c, corpus, o.warmup, o.timed_steps);
    std::printf("%-8s %10.0f %9.1f\n", name.c_str(), r.tokens_per_s, 1e3 * r.step_s);
    std::fflush(stdout);
    char line[256];
    std::snprintf(line, sizeof(line), "%s{\"recipe\": \"%s\", \"tokens_per_s\": %.1f, \"step_ms\": %.3f}",
                  results.empty() ? "" : ", ", name.c_str(), r.tokens_per_s, 1e3 * r.step_s);
    results += line;
  }
  if (!o.json.empty()) write_json(o.json, base, results);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  nibble::apply_default_wait_policy(argv);  // may start the program again
  try {
    return run(argc, argv);
  } catch (const nibble::UsageError& e) {
    std::fprintf(stderr, "nibble_bench_train: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nibble_bench_train: error: %s\n", e.what());
    return 1;
  }
}
