// nibble_bench_train: training tokens/s of the `nibble bench train` model under each recipe, on the
// CPU or a GPU, as a program of its own: a NIBBLE_CUDA_ONLY build (an offline GPU machine,
// scripts/gpu-check.sh) has no nibble command. Random tokens (speed does not depend on them);
// bench/torch_train.py --vs-nibble FILE prints PyTorch's rates on the same model next to these.
//   nibble_bench_train [--device cpu|cuda] [--recipes none,bf16,nvfp4] [--layers 6] [--width 384]
//                      [--heads 6] [--context 256] [--batch 8] [--warmup 3] [--timed-steps 10] [--json FILE]
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "train/experiment.h"
#include "train/trainer.h"

namespace {

using namespace nibble;

constexpr const char* kUsage =
    "usage: nibble_bench_train [--device cpu|cuda] [--recipes none,bf16,fp8,mxfp4,nvfp4] [--layers N] [--width N] "
    "[--heads N] [--context N] [--batch N] [--warmup N] [--timed-steps N] [--json FILE]";

int64_t count(std::string_view flag, std::string_view text, int64_t min = 1) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < min || v > (int64_t{1} << 30))
    throw UsageError(std::string(flag) + " '" + std::string(text) + "' is not a count from " + std::to_string(min) +
                     " to 2^30: " + kUsage);
  return v;
}

int run(int argc, char** argv) {
  train::TrainConfig base;
  base.model.vocab = 65;  // char-level tinyshakespeare's vocabulary, as nibble bench train
  base.model.layers = 6;
  base.model.heads = 6;
  base.model.width = 384;
  base.model.context = 256;
  base.batch = 8;
  base.schedule.total_steps = 1000;
  base.schedule.warmup_steps = 10;
  std::string recipes = "none,bf16,nvfp4", json;
  int64_t warmup = 3, timed = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      std::printf("%s\n", kUsage);
      return 0;
    }
    if (i + 1 >= argc) throw UsageError(std::string(flag) + " needs a value: " + kUsage);
    const std::string_view value = argv[++i];
    if (flag == "--device") base.device = ops::parse_device(value);
    else if (flag == "--recipes") recipes = value;
    else if (flag == "--layers") base.model.layers = count(flag, value);
    else if (flag == "--width") base.model.width = count(flag, value);
    else if (flag == "--heads") base.model.heads = count(flag, value);
    else if (flag == "--context") base.model.context = count(flag, value);
    else if (flag == "--batch") base.batch = count(flag, value);
    else if (flag == "--warmup") warmup = count(flag, value, 0);
    else if (flag == "--timed-steps") timed = count(flag, value);
    else if (flag == "--json") json = value;
    else throw UsageError("unknown option '" + std::string(flag) + "': " + kUsage);
  }
  (void)ops::backend(base.device);  // no usable GPU: the fix, before anything is printed
  std::mt19937 rng(1337);
  std::vector<int32_t> corpus(200000);
  for (auto& t : corpus) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(base.model.vocab));

  const std::string device(ops::to_string(base.device));
  std::printf("nibble_bench_train: %lld layers x width %lld x %lld heads, context %lld, batch %lld (%lld tokens/step) "
              "on %s; %lld warm-up + %lld timed steps\n",
              static_cast<long long>(base.model.layers), static_cast<long long>(base.model.width),
              static_cast<long long>(base.model.heads), static_cast<long long>(base.model.context),
              static_cast<long long>(base.batch), static_cast<long long>(base.batch * base.model.context),
              device.c_str(), static_cast<long long>(warmup), static_cast<long long>(timed));
  std::printf("%-8s %10s %9s\n", "recipe", "tokens/s", "step ms");
  std::string results;
  size_t start = 0;
  while (start <= recipes.size()) {
    const size_t comma = std::min(recipes.find(',', start), recipes.size());
    const std::string name = recipes.substr(start, comma - start);
    start = comma + 1;
    if (name.empty()) continue;
    train::TrainConfig c = base;
    c.recipe.quantization = parse_quantization(name);
    const train::SpeedResult r = train::measure_training_speed(c, corpus, warmup, timed);
    std::printf("%-8s %10.0f %9.1f\n", name.c_str(), r.tokens_per_s, 1e3 * r.step_s);
    std::fflush(stdout);
    char line[256];
    std::snprintf(line, sizeof(line), "%s{\"recipe\": \"%s\", \"tokens_per_s\": %.1f, \"step_ms\": %.3f}",
                  results.empty() ? "" : ", ", name.c_str(), r.tokens_per_s, 1e3 * r.step_s);
    results += line;
  }
  if (!json.empty()) {
    // Written to a temporary name and renamed: a reader never sees half a file.
    const std::string tmp = json + ".tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "w");
    if (!f) throw UsageError("cannot write '" + tmp + "': " + std::strerror(errno));
    std::fprintf(f, "{\"device\": \"%s\", \"results\": [%s]}\n", device.c_str(), results.c_str());
    const bool ok = std::fclose(f) == 0;
    std::error_code ec;
    if (ok) std::filesystem::rename(tmp, json, ec);
    if (!ok || ec) throw UsageError("cannot write '" + json + "'" + (ec ? ": " + ec.message() : std::string()));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
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
