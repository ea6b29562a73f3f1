// `nibble train / prepare / eval / generate / compare` end to end through the binary, on tiny
// models: bitwise resume after a kill -9 in the middle of a checkpoint, refusals of bad input,
// eval and generation, the comparison PNG and the demo config in a shortened form. Plus the
// KV-cache decoder against the model's own forward pass.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <regex>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <map>
#include <random>

#include "model/kv_cache.h"
#include "model/transformer.h"
#include "data/data.h"
#include "run/generate.h"
#include "run/metrics.h"
#include "run/open_run.h"
#include "run/run.h"
#include "support/cli.h"
#include "support/random.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"

namespace fs = std::filesystem;
using namespace nibble;

namespace {

using cli_test::contains;
using cli_test::Result;
using cli_test::run;
using cli_test::run_with_faults;

// The PID a backgrounded shell command writes to `pid_file` (`echo $! > FILE`), waiting up to 6 s
// for it; 0 if it never appears.
long pid_written_to(const fs::path& pid_file) {
  long pid = 0;
  for (int i = 0; i < 600 && pid == 0; ++i) {
    std::ifstream(pid_file) >> pid;
    if (pid == 0) ::usleep(10000);
  }
  return pid;
}

// Starts `nibble ARGS` as a child of this process, its stdout and stderr into `log`, with SIGINT
// and SIGTERM at their defaults: a shell may have started the test with SIGINT ignored (background
// jobs are), which a child would inherit, and nibble leaves an ignored signal ignored.
pid_t start_nibble(const std::vector<std::string>& args, const fs::path& log) {
  const std::string binary = std::string(NIBBLE_BINARY_DIR) + "/nibble", log_path = log.string();
  std::vector<std::string> words = {binary};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {  // only async-signal-safe calls until exec
    const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) ::_exit(126);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    ::sigaction(SIGINT, &default_action, nullptr);
    ::sigaction(SIGTERM, &default_action, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

// One directory per process: ctest runs each test of this file as its own process, in parallel.
fs::path work_dir() { return nibble_test::process_dir("test_train_cli"); }

using cli_test::file_bytes;
using cli_test::loss_curve;

// Every file under `dir` with its bytes: a refused command must leave this exactly as it was.
std::map<std::string, std::vector<uint8_t>> snapshot(const fs::path& dir) {
  std::map<std::string, std::vector<uint8_t>> files;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    files[fs::relative(e.path(), dir).string()] = e.is_regular_file() ? file_bytes(e.path()) : std::vector<uint8_t>{};
  return files;
}

void flip_bytes(const fs::path& file, size_t at, size_t count) {
  auto bytes = file_bytes(file);
  ASSERT_LE(at + count, bytes.size()) << file;
  for (size_t i = at; i < at + count; ++i) bytes[i] ^= 0x5A;
  std::ofstream(file, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(bytes.data()),
                                                                static_cast<std::streamsize>(bytes.size()));
}

std::vector<fs::path> list_checkpoints_of(const fs::path& run_dir) {
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(run_dir / "checkpoints"))
    if (e.path().filename().string().starts_with("step_")) found.push_back(e.path());
  std::sort(found.begin(), found.end());
  return found;
}

class TrainCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cli_test::set_up_tiny_run(work_dir(), data(), config(), /*steps=*/12, /*layers=*/2);
  }
  static void TearDownTestSuite() {
    if (!::testing::Test::HasFailure()) fs::remove_all(work_dir());  // kept for inspection on failure
  }
  static fs::path data() { return work_dir() / "data"; }
  // Data prepared from the same corpus with one letter replaced by a character it lacks: a
  // tokenizer with the same vocabulary size as data()'s and different ids.
  static fs::path other_data() {
    static const fs::path dir = [] {
      const fs::path d = work_dir() / "other-data";
      std::string text = train::read_text_file((work_dir() / "corpus.txt").string());
      EXPECT_EQ(text.find('#'), std::string::npos);
      std::replace(text.begin(), text.end(), 'z', '#');
      std::ofstream(work_dir() / "other-corpus.txt") << text;
      const Result p = run("prepare " + (work_dir() / "other-corpus.txt").string() + " -o " + d.string());
      EXPECT_EQ(p.exit_code, 0) << p.output;
      return d;
    }();
    return dir;
  }
  // A copy of the reference run to damage.
  static fs::path copy_of_reference(const std::string& name) {
    const fs::path dir = work_dir() / name;
    fs::remove_all(dir);
    fs::copy(reference(), dir, fs::copy_options::recursive);
    return dir;
  }
  static fs::path config() { return work_dir() / "tiny.yaml"; }
  static std::string train(const fs::path& run_dir, const std::string& extra = "") {
    return "train " + config().string() + " run.dir=" + run_dir.string() + " " + extra;
  }
  // The uninterrupted reference run, trained once for the suite.
  static const fs::path& reference() {
    static const fs::path dir = [] {
      const fs::path d = work_dir() / "reference";
      const Result r = run(train(d));
      EXPECT_EQ(r.exit_code, 0) << r.output;
      return d;
    }();
    return dir;
  }
};

}  // namespace

TEST_F(TrainCli, TrainWritesConfigMetricsCheckpointsAndReport) {
  const fs::path& ref = reference();
  EXPECT_TRUE(fs::exists(ref / "config.yaml"));
  EXPECT_TRUE(fs::exists(ref / "nibble_tokenizer.json"));  // char's own description: no Hugging Face tokenizer.json
  EXPECT_FALSE(fs::exists(ref / "tokenizer.json"));
  EXPECT_TRUE(fs::exists(ref / "checkpoints" / "step_00000012" / "model.safetensors"));
  EXPECT_TRUE(fs::exists(ref / "checkpoints" / "step_00000012" / "optimizer.safetensors"));
  EXPECT_EQ(loss_curve(ref).size(), 12u + 3u);  // 12 step records, evals at 4, 8, 12
  const Result again = run(train(ref));
  EXPECT_EQ(again.exit_code, 2);
  EXPECT_NE(again.output.find("pass resume=true"), std::string::npos) << again.output;
}

TEST_F(TrainCli, KillDuringCheckpointKeepsThePreviousAndResumeIsBitwise) {
  const fs::path dir = work_dir() / "interrupted";
  const Result killed = run_with_faults("--fault kill_during_checkpoint=8", train(dir));
  // popen's shell reports the child's SIGKILL as exit status 128 + 9.
  ASSERT_TRUE(killed.exit_code == -SIGKILL || killed.exit_code == 128 + SIGKILL) << killed.output;
  // The step-8 checkpoint never appeared; step 4 is complete and loadable.
  EXPECT_FALSE(fs::exists(dir / "checkpoints" / "step_00000008"));
  ASSERT_TRUE(fs::exists(dir / "checkpoints" / "step_00000004" / "state.json"));
  const Result eval4 = run("eval " + dir.string() + " --max-windows 4");
  EXPECT_EQ(eval4.exit_code, 0) << eval4.output;

  const Result resumed = run(train(dir, "resume=true"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming from"), std::string::npos);
  EXPECT_EQ(loss_curve(dir), loss_curve(reference()));
  EXPECT_EQ(file_bytes(dir / "checkpoints" / "step_00000012" / "model.safetensors"),
            file_bytes(reference() / "checkpoints" / "step_00000012" / "model.safetensors"));
  EXPECT_EQ(file_bytes(dir / "checkpoints" / "step_00000012" / "optimizer.safetensors"),
            file_bytes(reference() / "checkpoints" / "step_00000012" / "optimizer.safetensors"));
  // No leftover of the killed write stays around.
  for (const auto& e : fs::directory_iterator(dir / "checkpoints"))
    EXPECT_TRUE(e.path().filename().string().starts_with("step_")) << e.path();
}

// Soak: up to 20 kill -9 at random moments (start-up, steps, evaluation, checkpoint and metrics writes),
// each followed by resume=true, then one uninterrupted resume to the end: every byte of the result
// is the uninterrupted run's.
TEST_F(TrainCli, TwentyRandomKillsThenResumeIsBitwiseTheUninterruptedRun) {
  // 200 steps (50 checkpoints) so that the kills land all along the run; its own uninterrupted twin.
  const std::string steps = "steps=200";
  const fs::path reference = work_dir() / "soak-reference", dir = work_dir() / "soak";
  const Result whole = run(train(reference, steps));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  std::mt19937 rng(2026);
  std::uniform_int_distribution<int> delay_ms(10, 250);
  int killed = 0;
  // Up to 20 kills; a run that reaches the end (exit 0) ends the soak early.
  for (int attempt = 0; killed < 20 && attempt < 60; ++attempt) {
    const int ms = delay_ms(rng);
    const Result r = run(train(dir, steps + " resume=true"), "timeout -s KILL " + std::to_string(ms / 1000.0) + "s");
    ASSERT_TRUE(r.exit_code == 0 || r.exit_code == 128 + SIGKILL || r.exit_code == -SIGKILL)
        << "attempt " << attempt << ", killed after " << ms << " ms: " << r.output;
    if (r.exit_code == 0) break;
    ++killed;
  }
  std::printf("soak: %d kills before the run ended\n", killed);
  const Result finished = run(train(dir, steps + " resume=true"));
  ASSERT_EQ(finished.exit_code, 0) << finished.output;
  EXPECT_GE(killed, 5) << "the delays should mostly land before the run ends";
  EXPECT_EQ(loss_curve(dir), loss_curve(reference));
  for (const char* file : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_EQ(file_bytes(dir / "checkpoints" / "step_00000200" / file),
              file_bytes(reference / "checkpoints" / "step_00000200" / file))
        << file;
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_FALSE(e.path().filename().string().find(".tmp.") != std::string::npos) << "left over: " << e.path();
}

TEST_F(TrainCli, EvalAndGenerateOnATrainedRun) {
  const Result eval = run("eval " + reference().string());
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  EXPECT_NE(eval.output.find("perplexity"), std::string::npos);
  const Result eval_fp32 = run("eval " + reference().string() + " --fp32 --max-windows 8");
  EXPECT_EQ(eval_fp32.exit_code, 0) << eval_fp32.output;

  const std::string args = "generate " + reference().string() + " --prompt ROMEO: --max-tokens 40 --seed 5";
  const Result a = run(args), b = run(args);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(a.output, b.output);
  EXPECT_TRUE(a.output.starts_with("ROMEO:")) << a.output;
  EXPECT_GE(a.output.size(), 6u + 40u);
  const Result greedy = run("generate " + reference().string() + " --prompt ROMEO: --max-tokens 40 --temperature 0");
  EXPECT_EQ(greedy.exit_code, 0) << greedy.output;

  const Result bad_prompt = run("generate " + reference().string() + " --prompt '\xE2\x82\xAC'");
  EXPECT_EQ(bad_prompt.exit_code, 2);
  EXPECT_NE(bad_prompt.output.find("tokenizer"), std::string::npos) << bad_prompt.output;
  EXPECT_EQ(run("generate " + reference().string() + " --temperature -1").exit_code, 2);
  EXPECT_EQ(run("eval " + (work_dir() / "no-such-run").string()).exit_code, 2);
}

TEST_F(TrainCli, CompareWritesATableAndAPng) {
  const fs::path bf16 = work_dir() / "bf16";
  const Result r = run(train(bf16, "quantization=bf16 steps=8 schedule.warmup_steps=2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const fs::path png = work_dir() / "plot.png";
  const Result c = run("compare " + reference().string() + " " + bf16.string() + " -o " + png.string());
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_NE(c.output.find("(ref)"), std::string::npos) << c.output;
  EXPECT_NE(c.output.find("bf16"), std::string::npos) << c.output;
  const auto bytes = file_bytes(png);
  ASSERT_GT(bytes.size(), 1000u);
  EXPECT_EQ(std::string(bytes.begin() + 1, bytes.begin() + 4), "PNG");
  EXPECT_EQ(run("compare " + (work_dir() / "nothing").string()).exit_code, 2);
}

TEST_F(TrainCli, BadInputIsRefusedWithoutDamage) {
  const Result missing = run("train " + (work_dir() / "missing.yaml").string());
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.output.find("missing.yaml"), std::string::npos) << missing.output;

  const Result typo = run(train(work_dir() / "typo", "model.widht=64"));
  EXPECT_EQ(typo.exit_code, 2);
  EXPECT_NE(typo.output.find("did you mean 'model.width'"), std::string::npos) << typo.output;

  // Resuming a run with another model shape names the tensors and leaves the run as it was.
  const fs::path copy = work_dir() / "reshaped";
  fs::copy(reference(), copy, fs::copy_options::recursive);
  const auto before = loss_curve(copy);
  const Result reshaped = run(train(copy, "resume=true steps=16 schedule.rewarm=true model.width=64"));
  EXPECT_EQ(reshaped.exit_code, 2);
  EXPECT_NE(reshaped.output.find("has shape"), std::string::npos) << reshaped.output;
  EXPECT_EQ(loss_curve(copy), before);

  // A damaged checkpoint is named when loaded.
  const fs::path weights = copy / "checkpoints" / "step_00000012" / "model.safetensors";
  fs::resize_file(weights, fs::file_size(weights) / 2);
  const Result damaged = run("eval " + copy.string());
  EXPECT_EQ(damaged.exit_code, 2);
  EXPECT_NE(damaged.output.find("model.safetensors"), std::string::npos) << damaged.output;

  const Result no_data = run(train(work_dir() / "nodata", "data.dir=" + (work_dir() / "absent").string()));
  EXPECT_EQ(no_data.exit_code, 2);
  EXPECT_NE(no_data.output.find("nibble prepare"), std::string::npos) << no_data.output;

  // device=cuda where no GPU can be used (no GPU, no driver, or a build without CUDA): refused naming
  // the fix; a new run leaves no directory, a resumed one every byte as it was. (With a usable GPU
  // both train; test_cuda_training checks that.)
  const Result bad_device = run(train(work_dir() / "gpu", "device=gpu"));
  EXPECT_EQ(bad_device.exit_code, 2);
  EXPECT_NE(bad_device.output.find("use cpu or cuda"), std::string::npos) << bad_device.output;
  const Result cuda_new = run(train(work_dir() / "cuda", "device=cuda"));
  if (cuda_new.exit_code != 0) {
    EXPECT_EQ(cuda_new.exit_code, 2) << cuda_new.output;
    EXPECT_NE(cuda_new.output.find("device=cpu"), std::string::npos) << cuda_new.output;
    EXPECT_FALSE(fs::exists(work_dir() / "cuda"));
    const fs::path resumed = work_dir() / "cuda-resumed";
    fs::copy(reference(), resumed, fs::copy_options::recursive);
    const auto curve = loss_curve(resumed);
    const Result cuda_resume = run(train(resumed, "resume=true steps=16 schedule.rewarm=true device=cuda"));
    EXPECT_EQ(cuda_resume.exit_code, 2) << cuda_resume.output;
    EXPECT_EQ(loss_curve(resumed), curve);
  }
}

TEST_F(TrainCli, DivergenceStopsNamingTheStepAndTheLastCheckpoint) {
  const Result r = run(train(work_dir() / "diverged", "quantization=none schedule.lr=1e4 optimizer.clip_norm=0"));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("at step"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("last good checkpoint"), std::string::npos) << r.output;
}

TEST_F(TrainCli, DemoConfigRunsInShortenedForm) {
  const fs::path dir = work_dir() / "demo";
  const Result r = run("train " + std::string(NIBBLE_SOURCE_DIR) + "/configs/shakespeare.yaml data.dir=" + data().string() +
                       " run.dir=" + dir.string() +
                       " steps=3 schedule.warmup_steps=1 eval.batches=1 log.interval=1 threads=2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("quantization=nvfp4"), std::string::npos);
  EXPECT_NE(r.output.find("parameters"), std::string::npos);
  EXPECT_NE(r.output.find("FLOPs/token"), std::string::npos);
  EXPECT_NE(r.output.find("activations"), std::string::npos);
  const Result g = run("generate " + dir.string() + " --max-tokens 20");
  EXPECT_EQ(g.exit_code, 0) << g.output;
}

TEST(KvCache, DecoderMatchesTheFullForwardPass) {
  const model::ModelConfig m = nibble_test::tiny_model({.vocab = 50, .layers = 2, .width = 64, .context = 24});
  model::Transformer model(m, ops::cpu());
  model.init_weights(3);
  // Larger weights than the initialisation so attention is far from uniform.
  for (float& v : model.params().values()) v *= 8.0f;
  std::mt19937 rng(4);
  const std::vector<int32_t> tokens = nibble_test::random_tokens(m.context, m.vocab, rng);
  const std::vector<int32_t> targets = nibble_test::random_tokens(m.context, m.vocab, rng);
  model::ModelStep step;  // no recipe: FP32 GEMMs, as the decoder computes
  const double full = model.forward(tokens, targets, 1, m.context, step);

  model::KvCacheDecoder decoder(model);
  double sum = 0;
  for (int64_t t = 0; t < m.context; ++t) {
    const auto logits = decoder.step(tokens[t]);
    double mx = -INFINITY, z = 0;
    for (float l : logits) mx = std::max(mx, static_cast<double>(l));
    for (float l : logits) z += std::exp(l - mx);
    sum += -(logits[targets[t]] - mx - std::log(z));
  }
  EXPECT_NEAR(sum / m.context, full, 1e-4 * std::fabs(full));
  EXPECT_THROW(decoder.step(0), UsageError);  // the context is full
  decoder.reset();
  EXPECT_THROW(decoder.step(50), UsageError);
}

TEST(Sampling, TemperatureZeroAndTopOneAreGreedyAndSeedsReproduce) {
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.9f};
  std::mt19937_64 rng(1);
  train::SamplingOptions greedy;
  greedy.temperature = 0;
  EXPECT_EQ(train::sample_token(logits, greedy, rng), 1);
  train::SamplingOptions top1;
  top1.top_k = 1;
  for (int i = 0; i < 20; ++i) EXPECT_EQ(train::sample_token(logits, top1, rng), 1);
  train::SamplingOptions top2;
  top2.top_k = 2;
  top2.temperature = 1;
  std::mt19937_64 a(9), b(9);
  int seen[4] = {};
  for (int i = 0; i < 200; ++i) {
    const int32_t x = train::sample_token(logits, top2, a);
    EXPECT_EQ(x, train::sample_token(logits, top2, b));
    ++seen[x];
  }
  EXPECT_EQ(seen[0] + seen[2], 0);  // outside the top 2
  EXPECT_GT(seen[1], 50);
  EXPECT_GT(seen[3], 50);
}

namespace {
uint32_t read_u32(const std::vector<uint8_t>& b, size_t at) {
  return b[at] | b[at + 1] << 8 | b[at + 2] << 16 | static_cast<uint32_t>(b[at + 3]) << 24;
}
uint32_t masked(std::span<const uint8_t> bytes) {
  const uint32_t crc = train::crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}
// Splits a TFRecord stream into payloads, checking both CRCs of every record.
std::vector<std::vector<uint8_t>> tfrecords(const std::vector<uint8_t>& b) {
  std::vector<std::vector<uint8_t>> out;
  size_t at = 0;
  while (at < b.size()) {
    EXPECT_LE(at + 12, b.size());
    uint64_t length = 0;
    for (int i = 0; i < 8; ++i) length |= static_cast<uint64_t>(b[at + i]) << (8 * i);
    EXPECT_EQ(read_u32(b, at + 8), masked(std::span(b.data() + at, 8)));
    EXPECT_LE(at + 12 + length + 4, b.size());
    std::vector<uint8_t> payload(b.begin() + static_cast<std::ptrdiff_t>(at + 12),
                                 b.begin() + static_cast<std::ptrdiff_t>(at + 12 + length));
    EXPECT_EQ(read_u32(b, at + 12 + length), masked(payload));
    out.push_back(std::move(payload));
    at += 12 + length + 4;
  }
  return out;
}
}  // namespace

TEST(TensorBoard, EventsAreFramedAndEncodedAsTensorFlowReadsThem) {
  const std::string check = "123456789";
  EXPECT_EQ(train::crc32c(std::span(reinterpret_cast<const uint8_t*>(check.data()), check.size())), 0xE3069283u);
  const auto event = train::tensorboard_scalar_event(1.5, 300, "train/loss", 2.25f);
  // wall_time (field 1, double), step (field 2, varint 300 = AC 02), summary (field 5).
  ASSERT_GE(event.size(), 12u);
  EXPECT_EQ(event[0], 0x09);
  double wall;
  std::memcpy(&wall, event.data() + 1, 8);
  EXPECT_EQ(wall, 1.5);
  EXPECT_EQ(event[9], 0x10);
  EXPECT_EQ(event[10], 0xAC);
  EXPECT_EQ(event[11], 0x02);
  EXPECT_EQ(event[12], 0x2A);
  const std::string bytes(event.begin(), event.end());
  EXPECT_NE(bytes.find("train/loss"), std::string::npos);
  float value;
  std::memcpy(&value, event.data() + event.size() - 4, 4);
  EXPECT_EQ(value, 2.25f);
  EXPECT_EQ(event[event.size() - 5], 0x15);  // simple_value: field 2, 32-bit
  const auto frame = train::tfrecord_frame(event);
  const auto records = tfrecords(frame);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0], event);
}

// A run started with device=cuda has the CPU's run directory (config.yaml then says device: cuda; the
// checkpoints hold host copies of the weights and moments): eval reads it on the CPU, and it resumes
// there with device=cpu, saying that the continuation differs. The GPU half is test_cuda_training's.
TEST_F(TrainCli, ARunStartedOnAGpuContinuesOnTheCpu) {
  const fs::path dir = work_dir() / "from-gpu";
  fs::remove_all(dir);
  fs::copy(reference(), dir, fs::copy_options::recursive);
  {
    std::ofstream yaml(dir / "config.yaml", std::ios::app);
    yaml << "device: cuda\n";
  }
  const Result eval = run("eval " + dir.string() + " --max-windows 4");
  EXPECT_EQ(eval.exit_code, 0) << eval.output;
  // --device cuda evaluates and samples on a GPU; without a usable one, exit 2 naming the fix.
  for (const std::string& command : {"eval " + dir.string() + " --max-windows 4 --device cuda",
                                    "generate " + dir.string() + " --max-tokens 8 --device cuda"}) {
    const Result on_gpu = run(command);
    if (on_gpu.exit_code != 0) {
      EXPECT_EQ(on_gpu.exit_code, 2) << on_gpu.output;
      // The command's flag, not the config key of `nibble train`.
      EXPECT_NE(on_gpu.output.find("--device cpu"), std::string::npos) << on_gpu.output;
      EXPECT_EQ(on_gpu.output.find("device="), std::string::npos) << on_gpu.output;
    }
  }
  const Result resumed =
      run("train " + (dir / "config.yaml").string() + " run.dir=" + dir.string() + " resume=true steps=14 schedule.rewarm=true device=cpu");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("note: resuming on device=cpu (the run was started on cuda)"), std::string::npos)
      << resumed.output;
  EXPECT_NE(resumed.output.find("device     cpu"), std::string::npos) << resumed.output;
  EXPECT_TRUE(fs::exists(dir / "checkpoints" / "step_00000014" / "model.safetensors"));
}

TEST_F(TrainCli, TensorBoardEventFilesAreWritten) {
  const fs::path dir = work_dir() / "tensorboard-run";
  const Result r = run(train(dir, "steps=4 log.tensorboard=true"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir / "tensorboard")) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_TRUE(files[0].filename().string().starts_with("events.out.tfevents."));
  const auto records = tfrecords(file_bytes(files[0]));
  // The version event, 5 train scalars per step and 2 eval scalars at step 4.
  EXPECT_EQ(records.size(), 1u + 4u * 5u + 2u);
  EXPECT_NE(std::string(records[0].begin(), records[0].end()).find("brain.Event:2"), std::string::npos);
}

// Issue 13: a run directory nothing can damage.

TEST_F(TrainCli, RefusedResumeLeavesEveryByteOfTheRunDirectory) {
  const fs::path dir = copy_of_reference("refused-resume");
  const auto before = snapshot(dir);
  const Result reshaped = run(train(dir, "resume=true steps=16 schedule.rewarm=true model.width=64"));
  EXPECT_EQ(reshaped.exit_code, 2) << reshaped.output;
  EXPECT_TRUE(contains(reshaped.output, "has shape")) << reshaped.output;
  EXPECT_EQ(snapshot(dir), before);  // config.yaml and tokenizer.json were overwritten before the fix

  // A different tokenizer with the same vocabulary size: refused, naming the fix.
  const Result retokenized = run(train(dir, "resume=true steps=16 schedule.rewarm=true data.dir=" + other_data().string()));
  EXPECT_EQ(retokenized.exit_code, 2) << retokenized.output;
  EXPECT_TRUE(contains(retokenized.output, "another tokenizer")) << retokenized.output;
  EXPECT_EQ(snapshot(dir), before);
  // The run still evaluates and samples.
  EXPECT_EQ(run("eval " + dir.string() + " --max-windows 2").exit_code, 0);
  EXPECT_EQ(run("generate " + dir.string() + " --max-tokens 5").exit_code, 0);
}

// eval --precision: any run's weights under another recipe's forward (post-training quantization).
// The NVFP4 reference under --precision nvfp4 (the same default knobs) is its own recipe's loss
// bit for bit; a BF16 run has no NVFP4 weights for --weights-only-quantized until --precision nvfp4
// gives them, and its post-training NVFP4 loss differs from its own.
TEST_F(TrainCli, EvalPrecisionQuantizesAnyRunAfterTraining) {
  auto loss = [](const std::string& args) {
    const Result r = run("eval " + args + " --max-windows 16 --json");
    EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.output;
    return nlohmann::json::parse(r.output.substr(r.output.find('{'))).at("loss").get<double>();
  };
  const std::string ref = reference().string();
  EXPECT_EQ(loss(ref + " --precision nvfp4"), loss(ref));
  EXPECT_NE(loss(ref + " --precision bf16"), loss(ref));

  const fs::path bf16 = work_dir() / "bf16-run";
  const Result trained = run(train(bf16, "quantization=bf16"));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const Result refused = run("eval " + bf16.string() + " --weights-only-quantized");
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_TRUE(contains(refused.output, "add --precision nvfp4")) << refused.output;
  EXPECT_NE(loss(bf16.string() + " --precision nvfp4"), loss(bf16.string()));
  EXPECT_NE(loss(bf16.string() + " --precision nvfp4 --weights-only-quantized"), loss(bf16.string()));
  const Result text = run("eval " + bf16.string() + " --precision nvfp4 --max-windows 4");
  EXPECT_TRUE(contains(text.output, "post-training quantization")) << text.output;
  // The QAT run and the PTQ of its BF16 twin in one table: each row is the single evaluation's loss.
  const Result table = run("eval " + ref + " " + bf16.string() + " --precision recipe,nvfp4 --max-windows 16 --json");
  ASSERT_EQ(table.exit_code, 0) << table.output;
  const auto rows = nlohmann::json::parse(table.output.substr(table.output.find('{'))).at("rows");
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].at("loss").get<double>(), loss(ref));
  EXPECT_EQ(rows[1].at("loss").get<double>(), loss(ref + " --precision nvfp4"));
  EXPECT_EQ(rows[2].at("loss").get<double>(), loss(bf16.string()));
  EXPECT_EQ(rows[3].at("loss").get<double>(), loss(bf16.string() + " --precision nvfp4"));
  EXPECT_EQ(rows[3].at("evaluated").get<std::string>(), "nvfp4 (PTQ)");
  EXPECT_EQ(rows[1].at("evaluated").get<std::string>(), "nvfp4");
  const Result text_table = run("eval " + ref + " " + bf16.string() + " --precision recipe,nvfp4 --max-windows 16");
  EXPECT_TRUE(contains(text_table.output, "vs the first row")) << text_table.output;
  EXPECT_EQ(run("eval " + ref + " --precision nvfp4,nvfp4").exit_code, 2);
  EXPECT_EQ(run("eval " + bf16.string() + " --precision nvfp4 --fp32").exit_code, 2);
  EXPECT_EQ(run("eval " + bf16.string() + " --precision fp4").exit_code, 2);
}

// A precision map is resolved before the first step: the report names every module's quantization
// and the rule that chose it; a rule that decides nothing is refused before the run directory exists.
TEST_F(TrainCli, PrecisionMapIsPrintedModuleByModuleAndRefusedWhenItDecidesNothing) {
  const fs::path dir = work_dir() / "mapped";
  const Result r = run(train(dir, "steps=2 quantization=bf16 \"precision_map=block1.*=nvfp4; lm_head=bf16\""));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "block 0:     qkv bf16, attn_out bf16, gate_up bf16, down bf16")) << r.output;
  EXPECT_TRUE(contains(r.output, "block 1:     qkv nvfp4 (rule 1), attn_out nvfp4 (rule 1), gate_up nvfp4 (rule 1), "
                                 "down nvfp4 (rule 1)"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "lm_head:     bf16 (rule 2)")) << r.output;
  EXPECT_TRUE(contains(r.output, "GEMM FLOPs (linears and LM head): ")) << r.output;
  const Result resumed = run(train(dir, "resume=true steps=3 schedule.rewarm=true quantization=bf16 \"precision_map=block1.*=nvfp4; lm_head=bf16\""));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;

  const fs::path refused_dir = work_dir() / "mapped-refused";
  const Result refused = run(train(refused_dir, "precision_map=block*.attention=bf16"));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_TRUE(contains(refused.output, "rule 1 'block*.attention' matches no module")) << refused.output;
  EXPECT_FALSE(fs::exists(refused_dir));
}

// Extending a finished cosine run with more steps would raise its learning rate from min_lr: refused
// before anything is written, naming both rates and the choices; schedule.rewarm=true re-warms with a
// warning; holding the rate it has says nothing.
TEST_F(TrainCli, ExtendingAFinishedScheduleIsRefusedNamingTheChoices) {
  const fs::path dir = copy_of_reference("extended");
  const auto before = snapshot(dir);
  const Result refused = run(train(dir, "resume=true steps=16"));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_TRUE(contains(refused.output, "resuming at step 12 with this schedule raises the learning rate from 0.0001 "
                                       "(the run's cosine schedule over steps=12)"))
      << refused.output;
  EXPECT_TRUE(contains(refused.output, "schedule.kind=constant schedule.lr=0.0001")) << refused.output;
  EXPECT_TRUE(contains(refused.output, "schedule.rewarm=true")) << refused.output;
  EXPECT_EQ(snapshot(dir), before);
  const Result rewarmed = run(train(dir, "resume=true steps=16 schedule.rewarm=true"));
  ASSERT_EQ(rewarmed.exit_code, 0) << rewarmed.output;
  EXPECT_TRUE(contains(rewarmed.output, "the run re-warms (schedule.rewarm=true)")) << rewarmed.output;
  EXPECT_FALSE(contains(train::read_text_file((dir / "config.yaml").string()), "rewarm"));  // decided per resume
  const fs::path held = copy_of_reference("held");
  const Result hold = run(train(held, "resume=true steps=16 schedule.kind=constant schedule.lr=0.0001"));
  ASSERT_EQ(hold.exit_code, 0) << hold.output;
  EXPECT_FALSE(contains(hold.output, "re-warms")) << hold.output;
}

// A WSD run extended from a checkpoint of its stable phase holds its rate, then decays at the new
// end: bitwise the run planned with the longer schedule from the start. The refusal names that
// checkpoint.
TEST_F(TrainCli, AWsdRunExtendsFromItsStablePhaseBitwiseAsIfPlannedLonger) {
  const std::string wsd = "schedule.kind=wsd schedule.wsd_decay_fraction=0.5 schedule.min_lr=0.0003";
  const fs::path dir = work_dir() / "wsd-extended", planned = work_dir() / "wsd-planned";
  ASSERT_EQ(run(train(dir, wsd)).exit_code, 0);
  const Result refused = run(train(dir, "resume=true steps=16 " + wsd));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_TRUE(contains(refused.output, "continue from --checkpoint step_00000004, where the new schedule takes over "
                                       "without a jump"))
      << refused.output;
  const Result extended = run(train(dir, "steps=16 --checkpoint step_00000004 " + wsd));
  ASSERT_EQ(extended.exit_code, 0) << extended.output;
  EXPECT_FALSE(contains(extended.output, "re-warm")) << extended.output;
  ASSERT_EQ(run(train(planned, "steps=16 " + wsd)).exit_code, 0);
  EXPECT_EQ(loss_curve(dir), loss_curve(planned));
}

// Directories an earlier nibble wrote describe their char tokenizer in tokenizer.json: such a run
// directory resumes (same tokenizer identity in its checkpoints) and keeps that one file, and such a
// data directory (its prepare.json naming tokenizer.json) trains a new run, which gets
// nibble_tokenizer.json.
TEST_F(TrainCli, DirectoriesWithTheEarlierTokenizerJsonStillWork) {
  const fs::path dir = copy_of_reference("earlier-run");
  fs::rename(dir / "nibble_tokenizer.json", dir / "tokenizer.json");
  EXPECT_EQ(run("eval " + dir.string() + " --max-windows 2").exit_code, 0);
  const Result resumed = run(train(dir, "resume=true steps=14 schedule.rewarm=true"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "resuming from")) << resumed.output;
  EXPECT_TRUE(fs::exists(dir / "tokenizer.json"));
  EXPECT_FALSE(fs::exists(dir / "nibble_tokenizer.json"));

  const fs::path earlier = work_dir() / "earlier-data";
  fs::remove_all(earlier);
  fs::copy(data(), earlier, fs::copy_options::recursive);
  fs::rename(earlier / "nibble_tokenizer.json", earlier / "tokenizer.json");
  nlohmann::json record = nlohmann::json::parse(std::ifstream(earlier / "prepare.json"));
  ASSERT_TRUE(record["files"].contains("nibble_tokenizer.json")) << record.dump();
  record["files"]["tokenizer.json"] = record["files"]["nibble_tokenizer.json"];
  record["files"].erase("nibble_tokenizer.json");
  std::ofstream(earlier / "prepare.json", std::ios::trunc) << record.dump();
  const fs::path fresh = work_dir() / "from-earlier-data";
  fs::remove_all(fresh);
  const Result trained = run(train(fresh, "steps=2 data.dir=" + earlier.string()));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_TRUE(fs::exists(fresh / "nibble_tokenizer.json"));
  EXPECT_FALSE(fs::exists(fresh / "tokenizer.json"));
}

TEST_F(TrainCli, EvalRefusesATokenFileOfAnotherTokenizerWithTheSameVocabularySize) {
  const Result r = run("eval " + reference().string() + " --tokens " + (other_data() / "val-00000.bin").string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "another tokenizer")) << r.output;
  // A run whose tokenizer was replaced no longer matches its checkpoints' tokenizer identity.
  const fs::path dir = copy_of_reference("replaced-tokenizer");
  fs::copy_file(other_data() / "nibble_tokenizer.json", dir / "nibble_tokenizer.json", fs::copy_options::overwrite_existing);
  const Result e = run("eval " + dir.string());
  EXPECT_EQ(e.exit_code, 2) << e.output;
  EXPECT_TRUE(contains(e.output, "another tokenizer")) << e.output;
}

TEST_F(TrainCli, SecondTrainerIsRefusedNamingThePidAndReadersStillWork) {
  const fs::path dir = copy_of_reference("locked");
  const fs::path log = work_dir() / "locked.log", pid_file = work_dir() / "locked.pid";
  // A long resume in the background holds the lock (killed below).
  const std::string cmd = std::string(NIBBLE_BINARY_DIR) + "/nibble " + train(dir, "resume=true steps=100000000 schedule.rewarm=true") +
                          " > " + log.string() + " 2>&1 & echo $! > " + pid_file.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const long pid = pid_written_to(pid_file);
  ASSERT_GT(pid, 0);
  struct KillAtEnd {
    long pid;
    ~KillAtEnd() {
      if (pid <= 0) return;
      ::kill(static_cast<pid_t>(pid), SIGKILL);
      for (int i = 0; i < 500 && ::kill(static_cast<pid_t>(pid), 0) == 0; ++i) ::usleep(10000);
    }
  } kill_at_end{pid};
  auto log_text = [&] {
    const auto bytes = file_bytes(log);  // empty until the shell has made the file
    return std::string(bytes.begin(), bytes.end());
  };
  // Wait until it trains (the lock is held from its start; the first step line comes later).
  for (int i = 0; i < 3000 && !contains(log_text(), " 13/100000000"); ++i) ::usleep(10000);
  ASSERT_TRUE(contains(log_text(), " 13/100000000")) << log_text();

  const Result second = run(train(dir, "resume=true steps=100000000 schedule.rewarm=true"));
  EXPECT_EQ(second.exit_code, 2) << second.output;
  EXPECT_TRUE(contains(second.output, "PID " + std::to_string(pid))) << second.output;
  const Result fresh = run(train(dir));  // without resume=true: refused too, for the lock or the checkpoints
  EXPECT_EQ(fresh.exit_code, 2) << fresh.output;
  const Result eval = run("eval " + dir.string() + " --max-windows 2");  // readers take no lock
  EXPECT_EQ(eval.exit_code, 0) << eval.output;

  ::kill(static_cast<pid_t>(pid), SIGKILL);
  for (int i = 0; i < 500 && ::kill(static_cast<pid_t>(pid), 0) == 0; ++i) ::usleep(10000);
  kill_at_end.pid = -1;
  // The kernel released the lock with the process: the run continues.
  const Result after = run(train(dir, "resume=true steps=16 schedule.rewarm=true"));
  EXPECT_EQ(after.exit_code, 0) << after.output;
}

TEST_F(TrainCli, DamagedCheckpointFilesAreNamedAndResumeFallsBackBitwise) {
  for (const std::string file : {"model.safetensors", "optimizer.safetensors", "config.json", "state.json"}) {
    SCOPED_TRACE(file);
    const fs::path dir = copy_of_reference("damaged-" + file);
    const fs::path damaged = dir / "checkpoints" / "step_00000012" / file;
    flip_bytes(damaged, fs::file_size(damaged) / 2, std::min<size_t>(400, fs::file_size(damaged) / 4));
    if (file != "optimizer.safetensors") {  // eval and generate do not read the optimizer state
      const Result eval = run("eval " + dir.string());
      EXPECT_EQ(eval.exit_code, 2) << eval.output;
      EXPECT_TRUE(contains(eval.output, damaged.string())) << eval.output;
      EXPECT_EQ(run("generate " + dir.string() + " --max-tokens 5").exit_code, 2);
    }
    // Resume names the damaged checkpoint, falls back to step 8, and retrains steps 9-12 bitwise.
    const Result resumed = run(train(dir, "resume=true"));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_TRUE(contains(resumed.output, damaged.string())) << resumed.output;
    EXPECT_TRUE(contains(resumed.output, "falling back to " + (dir / "checkpoints" / "step_00000008").string()))
        << resumed.output;
    EXPECT_EQ(loss_curve(dir), loss_curve(reference()));
    EXPECT_EQ(file_bytes(dir / "checkpoints" / "step_00000012" / "model.safetensors"),
              file_bytes(reference() / "checkpoints" / "step_00000012" / "model.safetensors"));
  }
}

TEST_F(TrainCli, CheckpointsFromBeforeChecksumsLoadUnverifiedAndPartialOnesAreDamage) {
  // A run in progress when nibble started recording checksums: its state.json has neither key.
  const auto strip = [](const fs::path& state, bool both) {
    std::ifstream in(state);
    nlohmann::json s = nlohmann::json::parse(in);
    in.close();
    s.erase("checksums");
    if (both) s.erase("checksum");
    std::ofstream(state) << s.dump(2);
  };
  const fs::path old = copy_of_reference("pre-checksum");
  for (const char* step : {"step_00000008", "step_00000012"}) strip(old / "checkpoints" / step / "state.json", true);
  const Result eval = run("eval " + old.string());
  EXPECT_EQ(eval.exit_code, 0) << eval.output;
  EXPECT_TRUE(contains(eval.output, "loading it unverified")) << eval.output;
  const fs::path partial = copy_of_reference("partial-checksum");
  strip(partial / "checkpoints" / "step_00000012" / "state.json", false);
  const Result damaged = run("eval " + partial.string());
  EXPECT_EQ(damaged.exit_code, 2) << damaged.output;
  EXPECT_TRUE(contains(damaged.output, "only part of its checksums")) << damaged.output;
}

TEST_F(TrainCli, OutOfMemoryIsAMessageAndANewRunLeavesNoDirectory) {
  // batch=2000000 of the tiny model needs ~100 GB of activations, past a 3 GB address-space limit.
  const fs::path dir = work_dir() / "out-of-memory";
  const Result r = run(train(dir, "batch=2000000"), "ulimit -v 3000000;");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "out of memory")) << r.output;  // was "std::bad_alloc"
  EXPECT_FALSE(contains(r.output, "std::bad_alloc")) << r.output;
  EXPECT_FALSE(fs::exists(dir));  // was an empty run directory (config.yaml, metrics.jsonl)
}

TEST_F(TrainCli, NonFiniteWeightsInACheckpointAreRefused) {
  const fs::path dir = copy_of_reference("nan-weights");
  {
    // A checkpoint saved with a NaN weight and valid checksums: what the checksums cannot catch.
    auto loaded = train::load_run(dir, std::nullopt);
    loaded.model->params().values()[7] = std::nanf("");
    train::CheckpointOptions options;
    options.keep = 5;
    options.tokenizer_identity = loaded.tokenizer->identity();
    train::save_checkpoint(dir, *loaded.model, nullptr, loaded.state, options);
  }
  const Result eval = run("eval " + dir.string() + " --fp32");
  EXPECT_EQ(eval.exit_code, 2) << eval.output;  // was exit 0 with "loss nan"
  EXPECT_TRUE(contains(eval.output, "non-finite")) << eval.output;
  const Result generate = run("generate " + dir.string() + " --max-tokens 5");
  EXPECT_EQ(generate.exit_code, 2) << generate.output;  // was exit 0 printing ZZZZZ
  const Result resumed = run(train(dir, "resume=true"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "falling back to")) << resumed.output;
  EXPECT_EQ(loss_curve(dir), loss_curve(reference()));
}

TEST_F(TrainCli, StrayTemporariesAreRemovedAtTheNextStart) {
  const fs::path dir = copy_of_reference("stray");
  std::ofstream(dir / "metrics.jsonl.tmp.999999999") << "half a rewrite";
  const Result r = run(train(dir, "resume=true steps=13 schedule.rewarm=true"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(dir / "metrics.jsonl.tmp.999999999"));
}

TEST_F(TrainCli, SigtermFinishesTheStepWritesACheckpointAndSaysHowToResume) {
  const fs::path dir = copy_of_reference("sigterm");
  const fs::path log = work_dir() / "sigterm.log", pid_file = work_dir() / "sigterm.pid", rc_file = work_dir() / "sigterm.rc";
  // sh -c: `wait` there gives the trainer's exit status, which the test reads from rc_file.
  const std::string cmd = "sh -c '" + std::string(NIBBLE_BINARY_DIR) + "/nibble " + train(dir, "resume=true steps=100000000 schedule.rewarm=true") +
                          " > " + log.string() + " 2>&1 & echo $! > " + pid_file.string() + "; wait $!; echo $? > " +
                          rc_file.string() + "' &";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const long pid = pid_written_to(pid_file);
  ASSERT_GT(pid, 0);
  auto log_text = [&] {
    const auto bytes = file_bytes(log);
    return std::string(bytes.begin(), bytes.end());
  };
  for (int i = 0; i < 3000 && !contains(log_text(), " 14/100000000"); ++i) ::usleep(10000);
  ::kill(static_cast<pid_t>(pid), SIGTERM);
  int rc = -1;
  for (int i = 0; i < 1000 && rc < 0; ++i) {
    std::ifstream(rc_file) >> rc;
    if (rc < 0) ::usleep(10000);
  }
  if (rc < 0) ::kill(static_cast<pid_t>(pid), SIGKILL);
  ASSERT_EQ(rc, 128 + SIGTERM) << log_text();
  const std::string out = log_text();
  EXPECT_TRUE(contains(out, "stopped by SIGTERM after step")) << out;
  EXPECT_TRUE(contains(out, "resume=true")) << out;
  // The checkpoint of the last step is complete: resuming continues from it.
  const auto newest = list_checkpoints_of(dir);
  ASSERT_FALSE(newest.empty());
  EXPECT_TRUE(contains(out, "checkpoint " + newest.back().string() + " written")) << out;
  const int64_t step = std::stoll(newest.back().filename().string().substr(5));
  const Result resumed = run("train " + (dir / "config.yaml").string() + " resume=true schedule.rewarm=true steps=" + std::to_string(step + 1));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "resuming from " + newest.back().string())) << resumed.output;
}

TEST_F(TrainCli, SmallRefusalsNameTheValueAndChangeNothing) {
  struct Case {
    std::string args, expected;
  };
  const fs::path run_copy = copy_of_reference("small-refusals");
  const auto before = snapshot(run_copy);
  const fs::path npy = work_dir() / "x.npy";
  {
    // 16 x 16 float32, little-endian, C order.
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (16, 16), }";
    while ((10 + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    std::ofstream f(npy, std::ios::binary);
    f.write("\x93NUMPY\x01\x00", 8);
    const uint16_t n = static_cast<uint16_t>(header.size());
    f.write(reinterpret_cast<const char*>(&n), 2);
    f << header;
    for (int i = 0; i < 256; ++i) {
      const float v = static_cast<float>(i % 7) - 3;
      f.write(reinterpret_cast<const char*>(&v), 4);
    }
  }
  const fs::path st = work_dir() / "x.safetensors";
  ASSERT_EQ(run("quantize " + npy.string() + " -o " + st.string() + " --format nvfp4").exit_code, 0);
  const auto npy_bytes = file_bytes(npy), st_bytes = file_bytes(st);
  const std::vector<Case> cases = {
      {"train " + run_copy.string(), "is a directory, not a config file"},
      {"train " + (work_dir() / "missing.yaml").string(), "config file '" + (work_dir() / "missing.yaml").string() + "' does not exist"},
      {"quantize " + npy.string() + " -o " + npy.string() + " --format nvfp4", "is the input file itself"},
      {"quantize " + npy.string() + " -o " + (work_dir() / "." / "x.npy").string() + " --format nvfp4", "is the input file itself"},
      {"dequantize " + st.string() + " -o " + st.string(), "is the input file"},
      {"compare " + run_copy.string() + " -o " + (run_copy / "metrics.jsonl").string(), "lies inside the run directory"},
      {train(work_dir() / "rope", "model.rope_theta=0"), "rope_theta=0"},
      {train(work_dir() / "rope", "model.rope_theta=-5"), "rope_theta=-5"},
      {train(work_dir() / "init", "model.init_std=0"), "init_std=0"},
      {train(work_dir() / "warmup", "steps=1"), "schedule.warmup_steps=2 must lie in [0, steps=1]"},
      {train(work_dir() / "kv", "model.kv_heads=3"), "model.kv_heads=3 must divide model.heads=2"},
      {train(work_dir() / "rows-rht", "quantization=nvfp4 nvfp4.row_scaled_activations=true"),
       "nvfp4.row_scaled_activations=true does not combine with nvfp4.rht=true"},
      {train(work_dir() / "rows-fp8", "quantization=fp8 nvfp4.row_scaled_activations=true"),
       "nvfp4.row_scaled_activations=true applies to quantization=nvfp4"},
      {train(work_dir() / "data-file", "data.dir=" + npy.string()), "is a file, not a directory"},
      {"prepare " + run_copy.string() + " -o " + (work_dir() / "prepared").string(),
       "input '" + run_copy.string() + "' is the run directory"},
      {"generate " + run_copy.string() + " --top-k -5", "--top-k -5"},
      {"eval " + run_copy.string() + " --max-windows -3", "--max-windows -3"},
      {"quantize " + npy.string() + " -o " + (work_dir() / "y.st").string() + " --format nvfp4 --rounding sr --seed -1", "-1"},
      {"generate " + run_copy.string() + " --seed -1", "-1"},
      {"bench train --timed-steps 0", "--timed-steps"},
      {"bench train --timed-steps -3", "--timed-steps"},
      {"bench train --layers 0", "--layers"},
      {"bench train --vs-torch --quality", "--vs-torch measures speed: drop --quality"},
      {"bench train --vs-torch --torch-script " + (work_dir() / "missing.py").string(),
       "the PyTorch benchmark " + (work_dir() / "missing.py").string() + " is not there"},
      {"bench train --vs-torch --torch-python /bin/false", "/bin/false cannot import torch: install PyTorch"},
  };
  for (const auto& c : cases) {
    const Result r = run(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, c.expected)) << c.args << "\n" << r.output;
  }
  // Without a usable GPU, `bench train --device cuda` names its own flag (on a GPU it would run).
  const Result gpu = run("bench train --device cuda --timed-steps 1 --layers 1 --width 64 --heads 2 --context 16 --batch 2");
  if (gpu.exit_code == 2) {
    EXPECT_TRUE(contains(gpu.output, "--device cpu")) << gpu.output;
    EXPECT_FALSE(contains(gpu.output, "device=cpu")) << gpu.output;
  }
  EXPECT_EQ(snapshot(run_copy), before);
  EXPECT_EQ(file_bytes(npy), npy_bytes);
  EXPECT_EQ(file_bytes(st), st_bytes);
  EXPECT_FALSE(fs::exists(work_dir() / "rope"));
  EXPECT_FALSE(fs::exists(work_dir() / "init"));
  EXPECT_FALSE(fs::exists(work_dir() / "warmup"));
  EXPECT_FALSE(fs::exists(work_dir() / "rows-rht"));
  EXPECT_FALSE(fs::exists(work_dir() / "rows-fp8"));
  EXPECT_FALSE(fs::exists(work_dir() / "prepared"));
  EXPECT_FALSE(fs::exists(work_dir() / "y.st"));
}

// Issue 14: `nibble bench train --vs-torch` runs PyTorch on the same model after nibble's recipes and
// prints the ratios, next to the ideal-step column. A tiny model, one timed step each, Debian's
// python3-torch (installed by scripts/install-deps.sh for the twin test).
TEST_F(TrainCli, BenchTrainVsTorchPrintsTheIdealStepAndTheRatiosToPytorch) {
  const std::string corpus = std::string(NIBBLE_SOURCE_DIR) + "/data/tinyshakespeare.txt";
  const Result r = run("bench train --recipes none,nvfp4 --layers 1 --width 64 --heads 2 --context 16 --batch 2 "
                       "--warmup 0 --timed-steps 1 --corpus " + corpus +
                       " --vs-torch --torch-python /usr/bin/python3 --torch-modes fp32");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* part : {"ideal ms", "reached", "With the best of the whole run", "peaks (GFLOP/s): fp32 ",
                           "quant fused", "quant other", "vs torch best (fp32)", "torch ", "1 layers x width 64 x 2 heads, context 16, batch 2"})
    EXPECT_TRUE(contains(r.output, part)) << part << "\n" << r.output;
  // One ratio line per recipe: "<recipe> <tokens/s> - <ratio>x" (no bf16 mode ran: that column is "-").
  for (const char* recipe : {"none", "nvfp4"}) {
    const size_t line = r.output.rfind(std::string("\n") + recipe + " ");
    ASSERT_NE(line, std::string::npos) << recipe << "\n" << r.output;
    const std::string text = r.output.substr(line + 1, r.output.find('\n', line + 1) - line - 1);
    EXPECT_TRUE(text.ends_with("x")) << text;
  }
}

// Issue 13: resuming from a chosen checkpoint, loss spikes, a second signal.

TEST_F(TrainCli, ResumeFromAnOlderCheckpointIsBitwiseAndSetsTheNewerOnesAside) {
  const fs::path dir = copy_of_reference("branch");
  const auto step = [&](const char* name) { return dir / "checkpoints" / name; };
  const Result r = run(train(dir, "resume=true --checkpoint step_00000004"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "resuming from " + step("step_00000004").string())) << r.output;
  for (const char* name : {"step_00000008", "step_00000012"}) {
    EXPECT_TRUE(contains(r.output, step(name).string() + " is newer than the checkpoint resumed from: moved to " +
                                       (dir / "abandoned" / name).string()))
        << r.output;
    // Moved intact, and the run wrote its own in their place.
    EXPECT_EQ(file_bytes(dir / "abandoned" / name / "model.safetensors"),
              file_bytes(reference() / "checkpoints" / name / "model.safetensors"));
    EXPECT_TRUE(fs::exists(step(name) / "state.json"));
  }
  // metrics.jsonl was cut at step 4 and continued: bitwise the uninterrupted run.
  EXPECT_EQ(loss_curve(dir), loss_curve(reference()));
  EXPECT_EQ(file_bytes(step("step_00000012") / "optimizer.safetensors"),
            file_bytes(reference() / "checkpoints" / "step_00000012" / "optimizer.safetensors"));
  const Result eval = run("eval " + dir.string() + " --max-windows 2");  // the newest is the new branch's
  EXPECT_EQ(eval.exit_code, 0) << eval.output;
  EXPECT_TRUE(contains(eval.output, step("step_00000012").string())) << eval.output;

  // By path, resume implied; a second abandoned step_00000012 does not replace the first.
  const Result again = run(train(dir, "--checkpoint " + step("step_00000008").string()));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_TRUE(contains(again.output, "moved to " + (dir / "abandoned" / "step_00000012-2").string())) << again.output;
  EXPECT_TRUE(fs::exists(dir / "abandoned" / "step_00000012" / "state.json"));
  EXPECT_EQ(loss_curve(dir), loss_curve(reference()));
  // Resuming from the newest sets nothing aside.
  const Result newest = run(train(dir, "resume=true steps=13 schedule.rewarm=true --checkpoint step_00000012"));
  ASSERT_EQ(newest.exit_code, 0) << newest.output;
  EXPECT_FALSE(contains(newest.output, "moved to")) << newest.output;
}

TEST_F(TrainCli, ACheckpointThatIsNotTheRunsOrDoesNotVerifyIsRefusedWithoutDamage) {
  const fs::path dir = copy_of_reference("branch-refusals");
  const fs::path weights = dir / "checkpoints" / "step_00000008" / "model.safetensors";
  flip_bytes(weights, fs::file_size(weights) / 2, 64);
  const auto before = snapshot(dir);
  const std::string listed = "step_00000004, step_00000008, step_00000012";
  struct Case {
    std::string extra, expected;
  };
  const std::vector<Case> cases = {
      {"resume=true --checkpoint step_00000005", "'step_00000005'"},
      {"resume=true --checkpoint " + (reference() / "checkpoints" / "step_00000004").string(),
       "is not a checkpoint of run.dir '" + dir.string() + "'"},
      {"resume=true --checkpoint step_00000008", "'step_00000008' does not verify"},
      {"resume=false --checkpoint step_00000004", "resume=false"},
  };
  for (const auto& c : cases) {
    const Result r = run(train(dir, c.extra));
    EXPECT_EQ(r.exit_code, 2) << c.extra << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, c.expected)) << c.extra << "\n" << r.output;
    if (c.extra.starts_with("resume=true")) {  // the fix: the run's own checkpoints
      EXPECT_TRUE(contains(r.output, listed)) << c.extra << "\n" << r.output;
    }
    EXPECT_EQ(snapshot(dir), before) << c.extra;
  }
  const fs::path fresh = work_dir() / "branch-new";
  const Result none = run(train(fresh, "--checkpoint step_00000004"));
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_TRUE(contains(none.output, "holds no checkpoint yet")) << none.output;
  EXPECT_FALSE(fs::exists(fresh));
  const Result help = run("train --help");
  EXPECT_EQ(help.exit_code, 0) << help.output;
  EXPECT_TRUE(contains(help.output, "--checkpoint")) << help.output;
}

TEST_F(TrainCli, ALossSpikeKeepsTheCheckpointBeforeItAsTheLastGoodOne) {
  // Checkpoints every 2 steps, the newest 2 kept; the loss spikes from step 25 (10 added to it by
  // an injected fault) and is NaN at step 31. The last good checkpoint is step 24's, not the newest
  // (30), and rotation kept it although 26, 28 and 30 came after it.
  const std::string options = "steps=40 checkpoint.interval=2 checkpoint.keep=2 eval.interval=100";
  const fs::path dir = work_dir() / "spike";
  const fs::path before_spike = dir / "checkpoints" / "step_00000024";
  const Result r = run_with_faults("--fault loss_spike_from=25 --fault loss_nan_at=31", train(dir, options));
  ASSERT_EQ(r.exit_code, 3) << r.output;
  EXPECT_TRUE(contains(r.output, "warning: loss spike at step 25: ")) << r.output;
  EXPECT_TRUE(contains(r.output, "the last checkpoint before it is " + before_spike.string() + "\n")) << r.output;
  EXPECT_TRUE(contains(r.output, "the training loss is nan at step 31")) << r.output;
  EXPECT_TRUE(contains(r.output, "last good checkpoint: " + before_spike.string() + "\n")) << r.output;
  EXPECT_TRUE(contains(r.output, "--checkpoint step_00000024")) << r.output;
  std::vector<std::string> kept;
  for (const auto& c : list_checkpoints_of(dir)) kept.push_back(c.filename().string());
  EXPECT_EQ(kept, (std::vector<std::string>{"step_00000024", "step_00000028", "step_00000030"}));
  // The step that fails inside the model (non-finite activations) names it too.
  const fs::path failed = work_dir() / "spike-then-fails";
  const Result f = run_with_faults("--fault loss_spike_from=25 --fault rank_step_fails=0:31", train(failed, options));
  ASSERT_EQ(f.exit_code, 3) << f.output;
  EXPECT_TRUE(contains(f.output, "last good checkpoint: " + (failed / "checkpoints" / "step_00000024").string() + "\n"))
      << f.output;
  // What the message advises works: the run continues from step 24, the spiking branch set aside.
  const Result resumed = run(train(dir, options + " resume=true --checkpoint step_00000024"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_FALSE(contains(resumed.output, "loss spike")) << resumed.output;
  EXPECT_TRUE(fs::exists(dir / "abandoned" / "step_00000030" / "state.json"));
}

TEST_F(TrainCli, ASecondSigintEndsTheTrainerAtOnceLeavingOnlyCompleteCheckpoints) {
  // A model whose step takes about a second or more here (8 blocks, attention over 256 tokens x batch
  // 48; 4 blocks x batch 12, then 8 blocks x batch 24, had become 0.47 s on a 2-core EPYC, under the
  // 0.5 s this test needs), so that "at once" can be told from "after the step".
  const fs::path dir = work_dir() / "second-sigint", log = work_dir() / "second-sigint.log";
  const pid_t pid = start_nibble({"train", config().string(), "run.dir=" + dir.string(), "steps=1000000",
                                  "model.width=128", "model.layers=8", "model.heads=4", "model.context=256", "batch=48",
                                  "checkpoint.interval=2", "eval.interval=1000000", "log.interval=1"},
                                 log);
  ASSERT_GT(pid, 0);
  int status = 0;
  bool ended = false;
  struct KillAtEnd {
    pid_t pid;
    bool& ended;
    ~KillAtEnd() {
      if (ended) return;
      ::kill(pid, SIGKILL);
      int ignored;
      ::waitpid(pid, &ignored, 0);
    }
  } kill_at_end{pid, ended};
  auto log_text = [&] {
    const auto bytes = file_bytes(log);
    return std::string(bytes.begin(), bytes.end());
  };
  const std::string first_checkpoint = "checkpoint " + (dir / "checkpoints" / "step_00000002").string() + "\n";
  // Two steps and their checkpoint; minutes allowed for a machine busy with other tests.
  for (int i = 0; i < 60000 && !contains(log_text(), first_checkpoint); ++i) {
    ended = ::waitpid(pid, &status, WNOHANG) == pid;
    ASSERT_FALSE(ended) << "the trainer ended early:\n" << log_text();
    ::usleep(10000);
  }
  ASSERT_TRUE(contains(log_text(), first_checkpoint)) << log_text();
  // The trainer's own measure of step 2 (step 1 also allocates the activations).
  std::smatch m;
  const std::string text = log_text();
  ASSERT_TRUE(std::regex_search(text, m, std::regex(R"(step +2/1000000 \|[^\n]*\| (\d+) ms/step)"))) << text;
  const double step_seconds = std::stod(m[1].str()) / 1000;
  ASSERT_GT(step_seconds, 0.5) << "the model is meant to take over a second per step: enlarge it for this machine";
  // The line was printed at the end of step 2, just before the check for a stop request; a tenth
  // of a step later the trainer is inside step 3 (a first signal before that check would end the
  // run after step 2) and 100 ms after that still in it.
  ::usleep(static_cast<useconds_t>(step_seconds / 10 * 1e6));
  ASSERT_EQ(::kill(pid, SIGINT), 0);
  ::usleep(100000);
  ended = ::waitpid(pid, &status, WNOHANG) == pid;
  ASSERT_FALSE(ended) << "the first SIGINT must only ask for a stop after the step:\n" << log_text();
  ASSERT_EQ(::kill(pid, SIGINT), 0);
  using clock = std::chrono::steady_clock;
  const auto second_signal = clock::now();
  while (!ended && clock::now() - second_signal < std::chrono::minutes(5)) {
    ended = ::waitpid(pid, &status, WNOHANG) == pid;
    if (!ended) ::usleep(1000);
  }
  ASSERT_TRUE(ended) << log_text();
  const double exit_seconds = std::chrono::duration<double>(clock::now() - second_signal).count();
  std::printf("second SIGINT: the trainer ended %.3f s after it; a step takes %.3f s\n", exit_seconds, step_seconds);
  // Ended by the signal itself, not by finishing step 3 and exiting with 130.
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit status " << WEXITSTATUS(status) << "\n" << log_text();
  EXPECT_EQ(WTERMSIG(status), SIGINT);
  EXPECT_LT(exit_seconds, step_seconds / 2) << "a step takes " << step_seconds << " s";
  EXPECT_FALSE(contains(log_text(), "stopped by SIGINT")) << log_text();
  // Only complete checkpoints: step 2's is the newest, nothing half-written beside it, and it loads.
  std::vector<std::string> entries;
  for (const auto& e : fs::directory_iterator(dir / "checkpoints")) entries.push_back(e.path().filename().string());
  EXPECT_EQ(entries, std::vector<std::string>{"step_00000002"});
  const Result eval = run("eval " + dir.string() + " --max-windows 1");
  EXPECT_EQ(eval.exit_code, 0) << eval.output;
  EXPECT_TRUE(contains(eval.output, (dir / "checkpoints" / "step_00000002").string())) << eval.output;
}

TEST_F(TrainCli, CheckpointOptionEdgesAreRefusedOrResolvedLikeTrains) {
  const fs::path dir = copy_of_reference("checkpoint-edges");
  const auto before = snapshot(dir);
  // An empty value (an unset shell variable) is not "the newest".
  const Result empty = run(train(dir, "") + " --checkpoint ''");
  EXPECT_EQ(empty.exit_code, 2) << empty.output;
  EXPECT_TRUE(contains(empty.output, "--checkpoint: is empty")) << empty.output;
  const Result empty_eval = run("eval " + dir.string() + " --checkpoint ''");
  EXPECT_EQ(empty_eval.exit_code, 2) << empty_eval.output;
  // Going back to step 4 with steps=4 would train nothing and still set steps 8 and 12 aside.
  const Result nothing = run(train(dir, "steps=4") + " --checkpoint step_00000004");
  EXPECT_EQ(nothing.exit_code, 2) << nothing.output;
  EXPECT_TRUE(contains(nothing.output, "nothing would be trained")) << nothing.output;
  EXPECT_EQ(snapshot(dir), before);
  // RUN/abandoned taken by a file: refused before config.yaml is rewritten (was: after it).
  std::ofstream(dir / "abandoned") << "not a folder";
  const auto with_file = snapshot(dir);
  const Result blocked = run(train(dir) + " --checkpoint step_00000004");
  EXPECT_EQ(blocked.exit_code, 2) << blocked.output;
  EXPECT_TRUE(contains(blocked.output, "which is not a directory")) << blocked.output;
  EXPECT_EQ(snapshot(dir), with_file);
  fs::remove(dir / "abandoned");
  // eval and generate take a bare name as train does, and name the run's checkpoints when it is wrong.
  const Result by_name = run("eval " + dir.string() + " --checkpoint step_00000004 --max-windows 2");
  EXPECT_EQ(by_name.exit_code, 0) << by_name.output;
  EXPECT_TRUE(contains(by_name.output, "step_00000004 (step 4)")) << by_name.output;
  const Result missing = run("generate " + dir.string() + " --checkpoint step_00000099 --max-tokens 3");
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_TRUE(contains(missing.output, "step_00000004, step_00000008, step_00000012")) << missing.output;
  EXPECT_EQ(snapshot(dir), before);
}

// `nibble bench train --predict` models a GPU step without a GPU: one table per recipe with the three
// columns and the step line; options that train are refused beside it, and --gpu/--vocab without it.
TEST(BenchPredict, PrintsEachRecipesKernelTableAndRefusesTrainingOptions) {
  const Result r = run("bench train --predict --recipes bf16,nvfp4 --gpu h200 --layers 2 --width 128 --heads 2 --context 64 "
                       "--batch 2 --vocab 1000");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "nvfp4 on h200 (NVFP4 GEMMs emulated in BF16):")) << r.output;
  EXPECT_TRUE(contains(r.output, "design ms  written ms   torch ms")) << r.output;
  EXPECT_TRUE(contains(r.output, "quantize (amax, cast)")) << r.output;
  EXPECT_FALSE(contains(r.output, "dequantize to BF16")) << r.output;  // the cast writes Hopper's BF16 operand
  EXPECT_TRUE(contains(r.output, "x PyTorch BF16), as written")) << r.output;
  EXPECT_TRUE(contains(r.output, "vocab 1000")) << r.output;
  EXPECT_EQ(run("bench train --predict --device cuda").exit_code, 2);
  EXPECT_EQ(run("bench train --predict --vs-torch").exit_code, 2);
  const Result gpu = run("bench train --gpu b200 --recipes none --timed-steps 1 --warmup 0");
  EXPECT_EQ(gpu.exit_code, 2) << gpu.output;
  EXPECT_TRUE(contains(gpu.output, "add --predict")) << gpu.output;
  const Result unknown = run("bench train --predict --gpu a100");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_TRUE(contains(unknown.output, "use h200, b200")) << unknown.output;
}
