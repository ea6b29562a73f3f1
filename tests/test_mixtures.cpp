// Data mixtures (data.sources): the config's forms and refusals, the row -> source assignment
// (determinism, rank slices, proportions within the bound of its low-discrepancy sequence), and
// `nibble train` / `nibble eval` on a two-source mixture end to end: per-source validation in
// metrics.jsonl, bitwise resume, and a one-source data.sources run equal to the data.dir run.
#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/mixture.h"
#include "run/config.h"
#include "support/check.h"
#include "support/cli.h"
#include "support/temp_dir.h"

using namespace nibble;
using namespace nibble::train;
namespace fs = std::filesystem;
using cli_test::contains;
using cli_test::Result;
using nibble_test::error_of;

namespace {

RunConfig from_yaml(const std::string& yaml) {
  RunConfig c;
  apply_config_yaml(c, yaml, "test.yaml");
  return c;
}

// ---- config ---------------------------------------------------------------------------------

TEST(MixtureConfig, YamlListAndCommandLineFormAgree) {
  const RunConfig yaml = from_yaml(
      "data:\n  sources:\n    - {dir: data/edu, weight: 0.7}\n    - {name: web, dir: /x/crawl/, weight: 0.3, format: "
      "llmc, train_files: 'a*.bin', val_files: 'v*.bin'}\n");
  ASSERT_EQ(yaml.sources.size(), 2u);
  EXPECT_EQ(yaml.sources[0].name, "edu");  // the directory's base name
  EXPECT_EQ(yaml.sources[0].weight, 0.7);
  EXPECT_FALSE(yaml.sources[0].format.has_value());
  EXPECT_EQ(yaml.sources[1].name, "web");
  EXPECT_EQ(yaml.sources[1].format, TokenFormat::llmc);
  EXPECT_EQ(yaml.sources[1].train_files, "a*.bin");

  RunConfig line;
  apply_config_overrides(line, {"data.sources=data/edu:0.7,web=/x/crawl/:0.3"});
  ASSERT_EQ(line.sources.size(), 2u);
  EXPECT_EQ(line.sources[0].name, "edu");
  EXPECT_EQ(line.sources[0].dir, "data/edu");
  EXPECT_EQ(line.sources[1].name, "web");
  EXPECT_EQ(line.sources[1].dir, "/x/crawl/");
  EXPECT_EQ(line.sources[1].weight, 0.3);
  // A name defaults to the base name even with a trailing slash.
  RunConfig slash;
  apply_config_overrides(slash, {"data.sources=/x/crawl/:1"});
  EXPECT_EQ(slash.sources[0].name, "crawl");
}

TEST(MixtureConfig, SavedConfigReadsBackTheSameSources) {
  RunConfig c = from_yaml(
      "data:\n  sources:\n    - {name: 'a', dir: 'd \"q\"', weight: 0.1}\n    - {dir: e, weight: 3, format: "
      "nanogpt, train_files: t.bin, val_files: v.bin}\nmodel:\n  vocab: 50257\n");
  c.validate();
  const RunConfig back = from_yaml(config_to_yaml(c));
  ASSERT_EQ(back.sources.size(), 2u);
  EXPECT_EQ(back.sources[0].dir, "d \"q\"");
  EXPECT_EQ(back.sources[0].weight, 0.1);
  EXPECT_EQ(back.sources[1].format, TokenFormat::nanogpt);
  EXPECT_EQ(back.sources[1].val_files, "v.bin");
  EXPECT_EQ(config_values(back), config_values(c));
  // data.dir is not written beside data.sources (it would read back as an empty directory).
  EXPECT_FALSE(contains(config_to_yaml(c), "  dir: \"\""));
}

TEST(MixtureConfig, RefusalsNameTheValueAndTheFix) {
  auto yaml_error = [](const std::string& sources) {
    return error_of([&] { from_yaml("data:\n  sources:\n" + sources); });
  };
  std::string e = yaml_error("    - {dir: a, wieght: 0.3}\n");
  EXPECT_TRUE(contains(e, "unknown key 'wieght'") && contains(e, "dir, weight, name")) << e;
  e = yaml_error("    - {dir: a, weight: 0}\n");
  EXPECT_TRUE(contains(e, "weight '0'") && contains(e, "positive")) << e;
  e = yaml_error("    - {dir: a, weight: -1}\n");
  EXPECT_TRUE(contains(e, "weight '-1'")) << e;
  e = yaml_error("    - {dir: a, weight: lots}\n");
  EXPECT_TRUE(contains(e, "weight 'lots'") && contains(e, "e.g. 0.3")) << e;
  e = yaml_error("    - {dir: a}\n");
  EXPECT_TRUE(contains(e, "source 'a' has no weight")) << e;
  e = yaml_error("    - {dir: x/a, weight: 1}\n    - {dir: y/a, weight: 1}\n");
  EXPECT_TRUE(contains(e, "two sources are named 'a'") && contains(e, "name: NAME")) << e;
  e = yaml_error("    - {name: 'a b', dir: x, weight: 1}\n");
  EXPECT_TRUE(contains(e, "'a b' cannot name a source")) << e;
  e = yaml_error("    - [a, 1]\n");
  EXPECT_TRUE(contains(e, "each entry is a map")) << e;

  auto line_error = [](const std::string& value) {
    return error_of([&] {
      RunConfig c;
      apply_config_overrides(c, {"data.sources=" + value});
    });
  };
  e = line_error("data/a");
  EXPECT_TRUE(contains(e, "'data/a' has no weight") && contains(e, "[NAME=]DIR:WEIGHT")) << e;
  e = line_error("data/a:0.5,data/b:x");
  EXPECT_TRUE(contains(e, "weight 'x' of source 'data/b'")) << e;
  e = line_error("a=:1");
  EXPECT_TRUE(contains(e, "names no directory")) << e;

  RunConfig both = from_yaml("data:\n  dir: d\n  sources:\n    - {dir: a, weight: 1}\n");
  e = error_of([&] { both.validate(); });
  EXPECT_TRUE(contains(e, "data.sources and data.dir are both set (data.dir=d)") && contains(e, "remove one")) << e;
  RunConfig globs = from_yaml("data:\n  format: llmc\n  train_files: '*.bin'\n  sources:\n    - {dir: a, weight: 1}\n");
  e = error_of([&] { globs.validate(); });
  EXPECT_TRUE(contains(e, "give each source its own train_files")) << e;
  RunConfig nibble_globs = from_yaml("data:\n  sources:\n    - {dir: a, weight: 1, train_files: 'x*'}\n");
  e = error_of([&] { nibble_globs.validate(); });
  EXPECT_TRUE(contains(e, "source 'a': train_files and val_files are for format llmc")) << e;
}

// ---- row -> source ---------------------------------------------------------------------------

// The bound of the golden-ratio Kronecker sequence (data/mixture.h): every arc of the circle holds
// within 2 (3 + (1/ln phi + 1/ln 2) ln N) of its share of the first N rows (Niederreiter's
// N D*_N bound, doubled for an arc not anchored at 0).
double discrepancy_bound(double n) {
  const double phi = (1 + std::sqrt(5.0)) / 2;
  return 2 * (3 + (1 / std::log(phi) + 1 / std::log(2.0)) * std::log(n));
}

TEST(SourceMix, ProportionsHoldWithinTheSequencesBoundAtEveryPrefix) {
  for (const std::vector<double>& weights : {std::vector<double>{0.7, 0.3}, std::vector<double>{5, 3, 2},
                                             std::vector<double>{0.01, 0.99}}) {
    for (uint64_t seed : {1337ull, 7ull}) {
      const SourceMix mix(weights, seed);
      double total = 0;
      for (double w : weights) total += w;
      std::vector<double> count(weights.size(), 0.0);
      double worst = 0;
      for (uint64_t n = 1; n <= 200000; ++n) {
        count[mix.source_of(n - 1)] += 1;
        for (size_t s = 0; s < weights.size(); ++s) {
          EXPECT_NEAR(mix.share(s), weights[s] / total, 1e-15);
          const double deviation = std::fabs(count[s] - static_cast<double>(n) * weights[s] / total);
          worst = std::max(worst, deviation);
          ASSERT_LE(deviation, discrepancy_bound(static_cast<double>(n)))
              << "source " << s << " of " << weights.size() << " after " << n << " rows, seed " << seed;
        }
      }
      std::printf("weights %zu, seed %llu: largest deviation %.2f rows over 200000 (bound %.1f)\n", weights.size(),
                  static_cast<unsigned long long>(seed), worst, discrepancy_bound(200000));
    }
  }
}

TEST(SourceMix, DependsOnlyOnTheSeedAndTheRow) {
  const SourceMix a({0.5, 0.5}, 1337), b({0.5, 0.5}, 1337), other({0.5, 0.5}, 1338);
  int differ = 0;
  for (uint64_t n = 0; n < 1000; ++n) {
    EXPECT_EQ(a.source_of(n), b.source_of(n));
    differ += a.source_of(n) != other.source_of(n);
  }
  EXPECT_GT(differ, 0) << "another seed shifts the sequence";
  const SourceMix one({3.0}, 1337);
  for (uint64_t n = 0; n < 100; ++n) EXPECT_EQ(one.source_of(n), 0u);
}

std::vector<int32_t> ramp(int32_t first, int n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = first + i;
  return v;
}

TEST(MixtureSampler, RowsComeFromTheirSourcesSamplerAndRankSlicesEqualTheWholeBatch) {
  const std::vector<int32_t> a = ramp(0, 500), b = ramp(10000, 700), c = ramp(20000, 300);
  const int64_t seq = 8, batch = 6;
  const std::vector<double> weights{0.5, 0.3, 0.2};
  const MixtureSampler mixture({TokenStream::view(a), TokenStream::view(b), TokenStream::view(c)}, weights, seq, 42,
                               batch);
  const BatchSampler own[3] = {BatchSampler(&a, seq, 42), BatchSampler(&b, seq, 42), BatchSampler(&c, seq, 42)};
  std::vector<int32_t> in, tg, half_in, half_tg, expect_in(static_cast<size_t>(seq)), expect_tg(expect_in.size());
  std::vector<int> used(3, 0);
  for (int64_t k = 0; k < 50; ++k) {
    mixture.sample_rows(k, 0, batch, in, tg);
    for (int64_t r = 0; r < batch; ++r) {
      const size_t s = mixture.mix().source_of(static_cast<uint64_t>(k * batch + r));
      ++used[s];
      own[s].read_row(k, r, expect_in.data(), expect_tg.data());
      EXPECT_TRUE(std::equal(expect_in.begin(), expect_in.end(), in.begin() + r * seq)) << k << " " << r;
      EXPECT_TRUE(std::equal(expect_tg.begin(), expect_tg.end(), tg.begin() + r * seq)) << k << " " << r;
      EXPECT_EQ(in[static_cast<size_t>(r * seq)] / 10000, static_cast<int32_t>(s));  // the source's id range
    }
    // Two "ranks" of 4 and 2 rows draw the same rows as the whole batch.
    for (const auto& [first, rows] : {std::pair<int64_t, int64_t>{0, 4}, {4, 2}}) {
      mixture.sample_rows(k, first, rows, half_in, half_tg);
      EXPECT_TRUE(std::equal(half_in.begin(), half_in.end(), in.begin() + first * seq));
      EXPECT_TRUE(std::equal(half_tg.begin(), half_tg.end(), tg.begin() + first * seq));
    }
  }
  for (int s = 0; s < 3; ++s) EXPECT_NEAR(used[s], 300 * weights[s], discrepancy_bound(300)) << s;
}

TEST(MixtureSampler, OneSourceIsItsBatchSamplerRowForRow) {
  const std::vector<int32_t> a = ramp(0, 400);
  const MixtureSampler mixture({TokenStream::view(a)}, {2.0}, 16, 9, 4);
  const BatchSampler plain(&a, 16, 9);
  std::vector<int32_t> in, tg, pin, ptg;
  for (int64_t k = 0; k < 20; ++k) {
    mixture.sample_rows(k, 1, 3, in, tg);
    plain.sample_rows(k, 1, 3, pin, ptg);
    EXPECT_EQ(in, pin);
    EXPECT_EQ(tg, ptg);
  }
}

// ---- end to end ------------------------------------------------------------------------------

fs::path work_dir() { return nibble_test::process_dir("test_mixtures"); }

// Two prepared sources of the same character tokenizer: different halves of tinyshakespeare, each
// followed by the whole corpus's alphabet so that both directories get the same vocabulary.
class MixtureCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    fs::remove_all(work_dir());
    fs::create_directories(work_dir());
    const std::string text = read_text_file(std::string(NIBBLE_SOURCE_DIR) + "/data/tinyshakespeare.txt");
    std::string alphabet;
    for (int c = 0; c < 256; ++c)
      if (text.find(static_cast<char>(c)) != std::string::npos) alphabet.push_back(static_cast<char>(c));
    std::ofstream(work_dir() / "a.txt") << text.substr(0, 40000) << alphabet;
    std::ofstream(work_dir() / "b.txt") << text.substr(text.size() - 40000) << alphabet;
    std::ofstream(work_dir() / "c.txt") << text.substr(0, 40000);  // another alphabet: another tokenizer
    for (const char* name : {"a", "b", "c"}) {
      const Result p = cli_test::run("prepare " + (work_dir() / (std::string(name) + ".txt")).string() + " -o " +
                                     (work_dir() / name).string());
      ASSERT_EQ(p.exit_code, 0) << p.output;
    }
    std::ofstream(work_dir() / "mix.yaml")
        << "data:\n  sources:\n    - {name: shakes, dir: " << (work_dir() / "a").string()
        << ", weight: 0.7}\n    - {dir: " << (work_dir() / "b").string() << ", weight: 0.3}\n"
        << "steps: 12\nbatch: 4\nquantization: nvfp4\nmodel:\n  layers: 1\n  heads: 2\n  width: 32\n  context: 32\n"
           "schedule:\n  lr: 0.003\n  warmup_steps: 2\neval:\n  interval: 4\n  batches: 2\n"
           "checkpoint:\n  interval: 4\n  keep: 5\nlog:\n  interval: 1\nthreads: 2\n";
  }
  static std::string train(const fs::path& dir, const std::string& extra = "") {
    return "train " + (work_dir() / "mix.yaml").string() + " run.dir=" + dir.string() + " " + extra;
  }
};

TEST_F(MixtureCli, PerSourceValidationIsInMetricsAndResumeIsBitwise) {
  const fs::path whole = work_dir() / "whole";
  const Result r = cli_test::run(train(whole));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "val loss")) << r.output;
  EXPECT_TRUE(contains(r.output, "(weight-averaged over the sources) | shakes ")) << r.output;
  EXPECT_TRUE(contains(r.output, "source     b: weight 0.3 (30.0% of the rows)")) << r.output;
  std::ifstream in(whole / "metrics.jsonl");
  int evals = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] != "eval") continue;
    ++evals;
    ASSERT_TRUE(j.contains("val_loss.shakes") && j.contains("val_loss.b")) << line;
    // The overall loss is the weight-averaged mean of the per-source ones, summed in source order.
    const double overall = 0.0 + 0.7 * j["val_loss.shakes"].get<double>() + 0.3 * j["val_loss.b"].get<double>();
    EXPECT_EQ(j["val_loss"].get<double>(), overall) << line;
    EXPECT_NE(j["val_loss.shakes"].get<double>(), j["val_loss.b"].get<double>());
  }
  EXPECT_EQ(evals, 3);

  // Killed in the middle of the step-8 checkpoint, then resumed on one thread: bitwise the same.
  const fs::path killed = work_dir() / "killed";
  const Result k = cli_test::run_with_faults("--fault kill_during_checkpoint=8", train(killed));
  ASSERT_TRUE(k.exit_code == -SIGKILL || k.exit_code == 128 + SIGKILL) << k.output;
  const Result resumed = cli_test::run(train(killed, "resume=true threads=1"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "resuming from")) << resumed.output;
  EXPECT_EQ(cli_test::loss_curve(killed), cli_test::loss_curve(whole));
  EXPECT_EQ(cli_test::file_bytes(killed / "metrics.jsonl").size() > 0, true);

  // eval prints the per-source table and the overall loss, and says what the overall averages.
  const Result e = cli_test::run("eval " + whole.string() + " --max-windows 8");
  ASSERT_EQ(e.exit_code, 0) << e.output;
  EXPECT_TRUE(contains(e.output, "shakes ") && contains(e.output, "b ") &&
              contains(e.output, "the weight-averaged mean of the per-source losses"))
      << e.output;
  const Result ej = cli_test::run("eval " + whole.string() + " --max-windows 8 --json");
  ASSERT_EQ(ej.exit_code, 0) << ej.output;
  const auto j = nlohmann::json::parse(ej.output);
  ASSERT_EQ(j["sources"].size(), 2u);
  EXPECT_EQ(j["sources"][0]["name"], "shakes");
  EXPECT_EQ(j["loss"].get<double>(), 0.0 + 0.7 * j["sources"][0]["loss"].get<double>() +
                                         0.3 * j["sources"][1]["loss"].get<double>());
}

TEST_F(MixtureCli, OneSourceEqualsTheDataDirRunBitwise) {
  const fs::path by_dir = work_dir() / "by-dir", by_source = work_dir() / "by-source";
  const std::string a = (work_dir() / "a").string();
  std::ofstream(work_dir() / "one.yaml") << "steps: 8\nbatch: 4\nquantization: nvfp4\nmodel:\n  layers: 1\n  heads: 2\n"
                                            "  width: 32\n  context: 32\nschedule:\n  warmup_steps: 2\n"
                                            "eval:\n  interval: 4\n  batches: 2\nlog:\n  interval: 1\nthreads: 2\n";
  const std::string config = (work_dir() / "one.yaml").string();
  const Result d = cli_test::run("train " + config + " run.dir=" + by_dir.string() + " data.dir=" + a);
  ASSERT_EQ(d.exit_code, 0) << d.output;
  // A weight other than 1: normalised, so the one source's loss is the overall loss exactly.
  const Result s = cli_test::run("train " + config + " run.dir=" + by_source.string() + " data.sources=" + a + ":2.5");
  ASSERT_EQ(s.exit_code, 0) << s.output;
  EXPECT_EQ(cli_test::loss_curve(by_source), cli_test::loss_curve(by_dir));
  EXPECT_EQ(cli_test::file_bytes(by_source / "checkpoints" / "step_00000008" / "model.safetensors"),
            cli_test::file_bytes(by_dir / "checkpoints" / "step_00000008" / "model.safetensors"));

  // A source mixed with a copy of itself: every row's window is drawn from (seed, step, row) by the
  // source's own sampler, so the training is the source's alone, bit for bit, whatever the split.
  fs::copy(a, work_dir() / "a-copy", fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  const fs::path by_copies = work_dir() / "by-copies";
  const Result m = cli_test::run("train " + config + " run.dir=" + by_copies.string() + " data.sources=" + a +
                                 ":0.7," + (work_dir() / "a-copy").string() + ":0.3");
  ASSERT_EQ(m.exit_code, 0) << m.output;
  auto train_records = [](const fs::path& run) {
    std::vector<std::string> train;
    for (const std::string& r : cli_test::loss_curve(run))
      if (r.starts_with("train ")) train.push_back(r);
    return train;
  };
  EXPECT_EQ(train_records(by_copies), train_records(by_dir));
  EXPECT_EQ(cli_test::file_bytes(by_copies / "checkpoints" / "step_00000008" / "model.safetensors"),
            cli_test::file_bytes(by_dir / "checkpoints" / "step_00000008" / "model.safetensors"));
}

TEST_F(MixtureCli, BadSourcesAreRefusedNamingTheSource) {
  const std::string a = (work_dir() / "a").string(), c = (work_dir() / "c").string();
  auto refused = [&](const std::string& sources, const std::vector<std::string>& parts) {
    const fs::path dir = work_dir() / "refused";
    const Result r = cli_test::run(train(dir, "'data.sources=" + sources + "'"));
    EXPECT_EQ(r.exit_code, 2) << r.output;
    for (const auto& p : parts) EXPECT_TRUE(contains(r.output, p)) << p << "\n" << r.output;
    EXPECT_FALSE(fs::exists(dir)) << "a refused run writes nothing";
  };
  refused("a=" + a + ":1,gone=" + (work_dir() / "nowhere").string() + ":1",
          {"source 'gone'", "does not exist", "nibble prepare"});
  refused("a=" + a + ":1,txt=" + work_dir().string() + ":1", {"source 'txt'", "is not a `nibble prepare` directory"});
  refused("a=" + a + ":1,c=" + c + ":1", {"source 'a' (char tokenizer of", "source 'c' (char tokenizer of",
                                          "different tokenizers"});
  refused("a=" + a + ":1,a=" + c + ":1", {"two sources are named 'a'"});
  refused("a=" + a + ":0", {"weight '0' of source 'a'"});
  // llm.c files without validation files.
  fs::create_directories(work_dir() / "llmc");
  fs::copy_file(work_dir() / "a" / "train-00000.bin", work_dir() / "llmc" / "x_train_000.bin",
                fs::copy_options::overwrite_existing);
  std::ofstream(work_dir() / "llmc.yaml") << "data:\n  format: nanogpt\n  sources:\n    - {name: nv, dir: "
                                          << (work_dir() / "llmc").string()
                                          << ", weight: 1, train_files: 'x_*.bin', val_files: 'y_*.bin'}\n"
                                          << "    - {dir: " << a << ", weight: 1, format: nibble}\nmodel:\n  vocab: 65\n";
  const Result nv = cli_test::run("train " + (work_dir() / "llmc.yaml").string() + " run.dir=" +
                                  (work_dir() / "refused").string());
  EXPECT_EQ(nv.exit_code, 2) << nv.output;
  EXPECT_TRUE(contains(nv.output, "source 'nv'") && contains(nv.output, "y_*.bin")) << nv.output;
}

}  // namespace

namespace {

// The shipped mixture preset parses and validates, with its two sources.
TEST(MixtureConfig, TheLlamaPresetLoads) {
  const RunConfig c = load_run_config(std::string(NIBBLE_SOURCE_DIR) + "/configs/llama-125m.yaml", {});
  ASSERT_EQ(c.sources.size(), 2u);
  EXPECT_EQ(c.sources[0].name, "edu");
  EXPECT_EQ(c.sources[1].name, "wiki");
  EXPECT_EQ(c.sources[0].weight + c.sources[1].weight, 1.0);
  EXPECT_EQ(c.train.recipe.quantization, Quantization::nvfp4);
  EXPECT_EQ(c.train.model.kv_heads, 4);
}

}  // namespace
