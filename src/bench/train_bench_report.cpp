#include "bench/train_bench_report.h"

#include "bench/gpu_step_model.h"

#include <fmt/format.h>
#include <omp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "common/wait_policy.h"
#include "data/data.h"
#include "kernels/cpu/common/cpu_features.h"
#include "kernels/cpu/gemm/gemm.h"
#include "kernels/cpu/quantize/quantize.h"
#include "train/experiment.h"

namespace nibble::bench {

namespace {

// Best GFLOP/s of a 1024^3 GEMM in the precision a recipe's fprop uses (a quantized one summed as
// training sums it), over at least 5 runs and 0.5 s: a handful of runs can all fall in a slow moment
// of a shared machine, and a peak measured low makes the ideal step look unreachable.
double measured_peak_flops(Quantization q, Summation summation) {
  const int64_t n = 1024;
  std::vector<float> a(n * n), b(n * n), c(n * n);
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto& x : a) x = d(rng);
  for (auto& x : b) x = d(rng);
  LinearRecipe r = Recipe::operands(q, Nvfp4Knobs{});
  QuantizedTensor qa, qb;
  if (r.fprop.precision == GemmPrecision::quantized) {
    qa = cpu::quantize(a, n, n, r.fprop.a);
    qb = cpu::quantize(b, n, n, r.fprop.b);
  }
  double best = 1e30;
  const auto start = std::chrono::steady_clock::now();
  for (int rep = 0; rep < 5 || (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(500) && rep < 200);
       ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    switch (r.fprop.precision) {
      case GemmPrecision::fp32:
        cpu::gemm_f32(cpu::Trans::no, cpu::Trans::yes, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
        break;
      case GemmPrecision::bf16:
        cpu::gemm_bf16(cpu::Trans::no, cpu::Trans::yes, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
        break;
      case GemmPrecision::quantized: cpu::gemm(qa, qb, c.data(), n, 1.0f, Output::overwrite, summation); break;
    }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * n * n * n / best;
}

// The best GFLOP/s seen for each precision (keyed by the recipe whose forward kernel it is, none =
// FP32, and for a quantized one by its summation: on an AMX-BF16 CPU fp32_products and block_exact
// run on different tile units) over every measurement of the run: a peak is a maximum, and a shared
// machine's slow moments only ever lower a measurement.
struct Peaks {
  using Kernel = std::pair<Quantization, Summation>;
  std::map<Kernel, double> best;
  // FP32 and BF16 GEMMs have one summation: their key ignores s.
  static Kernel kernel(Quantization q, Summation s) { return {q, is_quantized(q) ? s : Summation::block_exact}; }
  double measure(Quantization q, Summation s = Summation::block_exact) {
    double& b = best[kernel(q, s)];
    b = std::max(b, measured_peak_flops(q, s));
    return b;
  }
  double of(Quantization q, Summation s = Summation::block_exact) const {
    const auto it = best.find(kernel(q, s));
    return it == best.end() ? 0.0 : it->second;
  }
  double fp32() const { return of(Quantization::none); }
  double bf16() const { return of(Quantization::bf16); }
};

std::vector<int32_t> load_corpus(const std::string& path, int64_t& vocab) {
  std::string text = train::read_text_file(path);
  train::CharTokenizer tok(text);
  vocab = tok.vocab_size();
  return tok.encode(text);
}

int run_quality(const TrainBenchOptions& o) {
  const auto recipes = resolve_recipes(o);
  int64_t vocab = 0;
  auto corpus = load_corpus(o.corpus, vocab);
  const train::TrainConfig base = quality_config(o, vocab);
  fmt::print("quality: {} layers x width {} x {} heads, context {}, batch {}, {} steps, lr {}, {} threads, "
             "val = mean of {} fixed batches\n",
             base.model.layers, base.model.width, base.model.heads, base.model.context, base.batch,
             base.schedule.total_steps, o.lr, omp_get_max_threads(), base.eval_batches);
  std::vector<std::pair<std::string, train::QualityResult>> results;
  for (const auto& [name, recipe] : recipes) {
    train::TrainConfig c = base;
    c.recipe = recipe;
    fmt::print("{}\n", describe(c.recipe));
    std::fflush(stdout);
    auto r = train::train_and_evaluate(c, corpus, o.eval_interval, [](const std::string& l) {
      fmt::print("{}\n", l);
      std::fflush(stdout);
    });
    results.emplace_back(name, r);
  }
  double bf16_loss = 0;
  for (auto& [n, r] : results)
    if (n == "bf16") bf16_loss = r.val_loss;
  fmt::print("\n{:<10} {:>10} {:>11} {:>12} {:>9}\n", "recipe", "val loss", "train loss", "vs bf16", "time");
  for (auto& [n, r] : results)
    fmt::print("{:<10} {:>10.4f} {:>11.4f} {:>12} {:>8.0f}s\n", n, r.val_loss, r.train_loss,
               bf16_loss > 0 ? fmt::format("{:+.2f}%", 100.0 * (r.val_loss / bf16_loss - 1.0)) : std::string("-"),
               r.seconds);
  return 0;
}

// Best-of-5 bytes/s of a parallel memcpy of 64 MiB (read + write counted), the bandwidth the
// ideal step charges the non-GEMM ops with.
double measured_copy_bandwidth() {
  const size_t n = size_t{64} << 20;
  std::vector<char> src(n, 1), dst(n, 0);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel
    {
      const size_t threads = static_cast<size_t>(omp_get_num_threads()), t = static_cast<size_t>(omp_get_thread_num());
      const size_t begin = n * t / threads, end = n * (t + 1) / threads;
      std::memcpy(dst.data() + begin, src.data() + begin, end - begin);
    }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * static_cast<double>(n) / best;
}

// Runs argv (no shell) and returns its exit status (-1: killed or not started); output goes where ours does.
int run_process(std::vector<std::string> args, bool quiet) {
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    forget_default_wait_policy();  // PyTorch runs with its own libgomp's defaults, as for a user
    if (quiet) {
      std::FILE* null = std::fopen("/dev/null", "w");
      if (null) ::dup2(::fileno(null), 1), ::dup2(::fileno(null), 2);
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "cannot run %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// --contended: `processes` single-threaded processes that compute until this object goes, on the
// cores training uses (as the threads of another run or a test suite do). Processes rather than
// threads of a child: a forked child of this multi-threaded program may only compute, not start
// threads. Each dies with its parent (PR_SET_PDEATHSIG), so an interrupted benchmark leaves none.
class BusyProcesses {
 public:
  explicit BusyProcesses(int processes) {
    std::fflush(stdout);
    for (int i = 0; i < processes; ++i) {
      const pid_t pid = ::fork();
      if (pid < 0) throw std::runtime_error(std::string("--contended: cannot start a busy process: ") + std::strerror(errno));
      if (pid == 0) spin();
      pids_.push_back(pid);
    }
  }
  ~BusyProcesses() {
    for (const pid_t pid : pids_) ::kill(pid, SIGKILL);
    for (const pid_t pid : pids_)
      while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
      }
  }
  BusyProcesses(const BusyProcesses&) = delete;
  BusyProcesses& operator=(const BusyProcesses&) = delete;

 private:
  [[noreturn]] static void spin() {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    volatile double x = 1.0;
    for (;;) x = x * 1.0000001 + 1e-9;
  }
  std::vector<pid_t> pids_;
};

// --vs-torch: refuses a missing script or a Python without PyTorch before minutes go into nibble's runs.
void check_torch(const TrainBenchOptions& o) {
  if (!std::filesystem::is_regular_file(o.torch_script))
    throw UsageError("--vs-torch: the PyTorch benchmark " + o.torch_script +
                     " is not there (it ships in nibble's source tree, bench/torch_train.py): pass --torch-script PATH");
  if (run_process({o.torch_python, "-c", "import torch"}, true) != 0)
    throw UsageError("--vs-torch: " + o.torch_python + " cannot import torch: install PyTorch (pip install torch, or "
                     "apt-get install python3-torch) or name another interpreter with --torch-python /path/to/bin/python");
  if (o.device == "cuda" &&
      run_process({o.torch_python, "-c", "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"}, true) != 0)
    throw UsageError("--vs-torch --device cuda: " + o.torch_python + "'s PyTorch sees no GPU: install a CUDA build of "
                     "PyTorch (pip install torch) or name its interpreter with --torch-python");
}

struct TorchResult {
  std::string mode;
  double tokens_per_s = 0;
};

// Runs bench/torch_train.py with the model, batch and thread count of this run; its table goes to
// the terminal, its results come back through a JSON file. UsageError naming the fix when Python or
// PyTorch is missing or the script fails.
std::vector<TorchResult> run_torch(const TrainBenchOptions& o, const train::TrainConfig& c, std::string& version) {
  const std::string json = (std::filesystem::temp_directory_path() /
                            ("nibble-torch-bench-" + std::to_string(::getpid()) + ".json")).string();
  const std::vector<std::string> args = torch_command(o, c, omp_get_max_threads(), json);
  struct RemoveOnExit {
    const std::string& path;
    ~RemoveOnExit() {
      std::error_code ec;
      std::filesystem::remove(path, ec);
    }
  } remove_json{json};
  const int status = run_process(args, false);
  std::ifstream in(json);
  if (status != 0 || !in) {
    throw UsageError("--vs-torch: " + o.torch_python + " " + o.torch_script + " failed (" +
                     (status >= 0 ? "exit " + std::to_string(status) : std::string("killed")) +
                     "; its output is above): --torch-modes takes fp32, bf16, fp32-compile, bf16-compile");
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw UsageError(std::string("--vs-torch: the PyTorch benchmark's results are not JSON: ") + e.what());
  }
  version = j.value("torch", "?");
  std::vector<TorchResult> out;
  for (const auto& r : j.at("results")) out.push_back({r.at("mode").get<std::string>(), r.at("tokens_per_s").get<double>()});
  return out;
}

// Runs PyTorch (run_torch) and prints each of nibble's recipes against its best BF16 mode and its
// best mode of all.
void print_torch_ratios(const TrainBenchOptions& o, const train::TrainConfig& base,
                        const std::vector<std::pair<std::string, double>>& nibble_rates) {
  std::string version;
  const auto torch = run_torch(o, base, version);
  const TorchResult* best_bf16 = nullptr;
  const TorchResult* best_any = nullptr;
  for (const auto& t : torch) {
    if (t.mode.starts_with("bf16") && (!best_bf16 || t.tokens_per_s > best_bf16->tokens_per_s)) best_bf16 = &t;
    if (!best_any || t.tokens_per_s > best_any->tokens_per_s) best_any = &t;
  }
  fmt::print("\n{:<8} {:>10} {:>22} {:>22}\n", "recipe", "tokens/s",
             best_bf16 ? fmt::format("vs torch {}", best_bf16->mode) : std::string("vs torch bf16"),
             best_any ? fmt::format("vs torch best ({})", best_any->mode) : std::string("vs torch best"));
  for (const auto& [name, tps] : nibble_rates)
    fmt::print("{:<8} {:>10.0f} {:>22} {:>22}\n", name, tps,
               best_bf16 ? fmt::format("{:.2f}x", tps / best_bf16->tokens_per_s) : std::string("-"),
               best_any ? fmt::format("{:.2f}x", tps / best_any->tokens_per_s) : std::string("-"));
  fmt::print("(PyTorch {}: {}; best BF16 = the faster of its bf16 modes; best = the fastest of all its modes)\n",
             version, [&] {
               std::string s;
               for (const auto& t : torch) s += (s.empty() ? "" : ", ") + fmt::format("{} {:.0f} tok/s", t.mode, t.tokens_per_s);
               return s;
             }());
}

// The ideal step (seconds) by kind: GEMMs, attention, quantization bytes, other bytes; each kind of
// work over the best measured peak of the kernel that runs it. (The quantized peak is the recipe's
// own kernel's with training's summation; none and bf16 have no quantized FLOPs.)
struct CpuRow {
  std::string name;
  Quantization quantization;
  double tokens_per_s, step_s;
  train::StepWork work;
  double contended_step_s = 0;  // --contended: the step with a busy process per thread beside it
};

// Parts: GEMMs, attention, quantization in fused passes (quantize_both), the other quantizations,
// other bytes.
std::array<double, 5> ideal_parts(const CpuRow& row, const Peaks& peaks, double copy_bandwidth) {
  const train::StepWork& w = row.work;
  const double quantized_peak = peaks.of(row.quantization, w.quantized_summation);
  return std::array<double, 5>{
      w.gemm_flops[0] / peaks.fp32() + w.gemm_flops[1] / peaks.bf16() + w.gemm_flops[2] / quantized_peak,
      w.attention_flops / (w.attention_bf16 ? peaks.bf16() : peaks.fp32()), w.fused_quantize_bytes / copy_bandwidth,
      (w.quantize_bytes - w.fused_quantize_bytes) / copy_bandwidth, w.other_bytes / copy_bandwidth};
}

double sum(const std::array<double, 5>& parts) { return parts[0] + parts[1] + parts[2] + parts[3] + parts[4]; }

// The run's first lines on the CPU: the model, the measured peaks and bandwidth, the kernels each
// kind of GEMM runs. Returns the memcpy bandwidth.
double print_cpu_preamble(const TrainBenchOptions& o, const train::TrainConfig& base, Peaks& peaks) {
  const int64_t tokens = base.batch * base.model.context;
  fmt::print("speed: {} layers x width {} x {} heads, context {}, batch {} ({} tokens/step), {} threads; "
             "{} warm-up + {} timed steps\n",
             base.model.layers, base.model.width, base.model.heads, base.model.context, base.batch, tokens,
             omp_get_max_threads(), o.warmup, o.timed_steps);
  peaks.measure(Quantization::none);
  peaks.measure(Quantization::bf16);
  const double copy_bandwidth = measured_copy_bandwidth();
  fmt::print("measured: 1024^3 GEMM peak fp32 {:.1f}, bf16 {:.1f} GFLOP/s; memcpy {:.1f} GB/s (read + write)\n",
             peaks.fp32() / 1e9, peaks.bf16() / 1e9, copy_bandwidth / 1e9);
  fmt::print("OpenMP waits: {}\n", describe_wait_policy());
  // Pair order by vdpbf16ps or by two FMAs (the faster on this CPU: cpu::bf16_pair_kernel), the same bits.
  const bool dpbf16 = cpu::bf16_pair_kernel() == cpu::Bf16PairKernel::dpbf16;
  const char* pairs = dpbf16 ? "with AVX512-BF16 vdpbf16ps in pair order"
                      : cpu::active_isa() >= cpu::Isa::avx512bf16
                          ? "FMA in pair order on BF16-rounded operands (vdpbf16ps's bits; on Intel the FMAs are faster)"
                          : "FMA in pair order on BF16-rounded operands";
  fmt::print("kernels ({}): NVFP4/MXFP4 GEMMs {}; FP8 GEMMs {} (gemm_summation=auto unless --set); BF16 GEMMs (bf16 "
             "recipe, BF16-kept layers) {}; attention's BF16 products (every recipe but none) {}; GEMM outputs of 1 MiB "
             "and more written {} (cpu::c_stores)\n",
             cpu::to_string(cpu::active_isa()),
             cpu::fp32_products_available(Format::nvfp4) ? "sum element products in FP32 on the AMX-BF16 tiles"
                                                         : "sum exact 16-block products (no AMX-BF16 here)",
             cpu::amx_bf16_active()                           ? "on the AMX-BF16 tiles"
             : cpu::fp32_products_available(Format::fp8_e4m3) ? pairs
                                                              : "decoded exactly, FMA in k order",
             cpu::amx_bf16_active() ? "on the AMX-BF16 tiles" : pairs,
             cpu::amx_bf16_active() ? "on the AMX-BF16 tiles (their own FP32 summation)" : pairs,
             cpu::c_stores() == cpu::CStores::streaming ? "with non-temporal stores" : "through the caches");
  return copy_bandwidth;
}

// Times every recipe, one table row each as it finishes.
std::vector<CpuRow> time_recipes_on_cpu(const TrainBenchOptions& o, const train::TrainConfig& base,
                                        const std::vector<int32_t>& corpus,
                                        const std::vector<std::pair<std::string, RecipeConfig>>& recipes, Peaks& peaks,
                                        double copy_bandwidth) {
  fmt::print("\n{:<8} {:>10} {:>9} {:>7} {:>7} {:>7} {:>10} {:>11} {:>9} {:>9} {:>8}\n", "recipe", "tokens/s", "step ms",
             "gemm", "quant", "rest", "vs none", "MFU(fp32)", "MFU(own)", "ideal ms", "reached");
  double none_tps = 0;
  std::vector<CpuRow> rows;
  for (const auto& [name, recipe] : recipes) {
    train::TrainConfig c = base;
    c.recipe = recipe;
    auto r = train::measure_training_speed(c, corpus, o.warmup, o.timed_steps);
    // After the steps: the quantized kernel's peak is the one of the summation training resolved.
    const double own_peak = peaks.measure(c.recipe.quantization, r.work.quantized_summation);
    if (c.recipe.quantization == Quantization::none) none_tps = r.tokens_per_s;
    rows.push_back({name, c.recipe.quantization, r.tokens_per_s, r.step_s, r.work});
    if (o.contended) {  // right after the quiet measurement, so that both see the same machine
      const BusyProcesses busy(omp_get_max_threads());
      rows.back().contended_step_s = train::measure_training_speed(c, corpus, o.warmup, o.timed_steps).step_s;
    }
    const double ideal = sum(ideal_parts(rows.back(), peaks, copy_bandwidth));
    fmt::print("{:<8} {:>10.0f} {:>9.1f} {:>6.0f}% {:>6.0f}% {:>6.0f}% {:>10} {:>10.1f}% {:>8.1f}% {:>9.1f} {:>7.0f}%\n", name,
               r.tokens_per_s, 1e3 * r.step_s, 100 * r.gemm_s / r.step_s, 100 * r.quantize_s / r.step_s,
               100 * r.rest_s / r.step_s, none_tps > 0 ? fmt::format("{:.2f}x", r.tokens_per_s / none_tps) : "-",
               100 * r.achieved_flops / peaks.fp32(), 100 * r.achieved_flops / own_peak, 1e3 * ideal,
               100 * ideal / r.step_s);
    std::fflush(stdout);
  }
  return rows;
}

// The ideal step by kind for every recipe, with the best peaks of the whole run.
void print_ideal_steps(const std::vector<CpuRow>& rows, Peaks& peaks, double copy_bandwidth) {
  // Once more at the end, so a peak that fell in a slow moment of a shared machine at the start
  // (this happens: one run measured the BF16 kernel at half the FP32 kernel it is built on) does not
  // decide the ideal step.
  for (const auto& entry : peaks.best) peaks.measure(entry.first.first, entry.first.second);
  fmt::print("\nMFU(fp32): training FLOPs (6N + 12 L d T per token) per second over the FP32 GEMM peak;\n"
             "MFU(own): over the peak of the GEMM precision the recipe's forward uses.\n"
             "ideal: the step if every GEMM ran at the measured 1024^3 peak of its precision (the recipe's own kernel,\n"
             "summed as training sums it, for its quantized GEMMs, BF16 for kept layers, FP32 for the LM head), causal\n"
             "attention's six products at the BF16 peak (FP32 for none), and every other op moved each FP32 tensor it\n"
             "reads and writes once at the memcpy bandwidth; reached = ideal / measured step. A peak is the best of every\n"
             "measurement in the run (before the recipes, after each, after all); above, the best so far.\n"
             "With the best of the whole run:\n");
  std::string peak_line;
  for (const auto& [kernel, best] : peaks.best) {
    const auto [q, summation] = kernel;
    const bool fp32_products = is_quantized(q) && summation == Summation::fp32_products;
    peak_line += fmt::format("{}{}{} {:.1f}", peak_line.empty() ? "" : ", ", q == Quantization::none ? "fp32" : to_string(q),
                             fp32_products ? " (fp32_products)" : "", best / 1e9);
  }
  fmt::print("peaks (GFLOP/s): {}\n", peak_line);
  fmt::print("quant fused: operands whose row-wise and transposed NVFP4 copies one pass encodes (read twice: the amax\n"
             "pass, then the encode pass, or once where RMSNorm or SwiGLU (forward, backward) gathered the amax as they wrote\n"
             "it; both copies written); quant other: every other quantized operand, read once.\n");
  fmt::print("{:<8} {:>9} {:>10} {:>12} {:>12} {:>12} {:>9} {:>8}\n", "recipe", "gemms", "attention", "quant fused",
             "quant other", "other bytes", "ideal ms", "reached");
  for (const auto& row : rows) {
    const auto parts = ideal_parts(row, peaks, copy_bandwidth);
    fmt::print("{:<8} {:>9.1f} {:>10.1f} {:>12.1f} {:>12.1f} {:>12.1f} {:>9.1f} {:>7.0f}%\n", row.name, 1e3 * parts[0],
               1e3 * parts[1], 1e3 * parts[2], 1e3 * parts[3], 1e3 * parts[4], 1e3 * sum(parts),
               100 * sum(parts) / row.step_s);
  }
}

int run_speed_on_gpu(const TrainBenchOptions& o, const train::TrainConfig& base, const std::vector<int32_t>& corpus,
                     const std::vector<std::pair<std::string, RecipeConfig>>& recipes, const ops::Backend& gpu);

// --contended: each recipe's step beside a busy process per training thread, against its quiet step.
void print_contended_steps(const std::vector<CpuRow>& rows) {
  const int threads = omp_get_max_threads();
  const double fair = std::max(1.0, 2.0 * threads / std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  fmt::print("\ncontended: each recipe again with {} busy single-threaded processes on the same cores ({} online);\n"
             "a fair share of the cores makes the step {:.1f}x the quiet one. OpenMP waits: {}\n",
             threads, ::sysconf(_SC_NPROCESSORS_ONLN), fair, describe_wait_policy());
  fmt::print("{:<8} {:>10} {:>14} {:>9} {:>13}\n", "recipe", "quiet ms", "contended ms", "slowdown", "vs fair share");
  for (const auto& row : rows)
    fmt::print("{:<8} {:>10.1f} {:>14.1f} {:>8.2f}x {:>12.2f}x\n", row.name, 1e3 * row.step_s,
               1e3 * row.contended_step_s, row.contended_step_s / row.step_s, row.contended_step_s / row.step_s / fair);
}

int run_speed(const TrainBenchOptions& o) {
  const auto recipes = resolve_recipes(o);
  ops::Backend& backend = ops::backend(ops::parse_device(o.device));  // no usable GPU: the fix, before anything is measured
  if (o.vs_torch) check_torch(o);
  int64_t vocab = 0;
  auto corpus = load_corpus(o.corpus, vocab);
  const train::TrainConfig base = speed_config(o, vocab);
  if (base.device == ops::Device::cuda) return run_speed_on_gpu(o, base, corpus, recipes, backend);
  Peaks peaks;
  const double copy_bandwidth = print_cpu_preamble(o, base, peaks);
  const std::vector<CpuRow> rows = time_recipes_on_cpu(o, base, corpus, recipes, peaks, copy_bandwidth);
  print_ideal_steps(rows, peaks, copy_bandwidth);
  if (o.contended) print_contended_steps(rows);
  if (o.vs_torch) {
    fmt::print("\nPyTorch on the same model, batch and threads, right after ({} {}):\n", o.torch_python, o.torch_script);
    if (o.torch_modes.find("bf16") != std::string::npos && cpu::active_isa() < cpu::Isa::avx512bf16)
      fmt::print("(this CPU has no BF16 instructions: PyTorch emulates bf16 autocast here, which can be many times\n"
                 " slower than its fp32 (20x at the default shape on a Zen 3); --torch-modes fp32,fp32-compile skips it)\n");
    std::vector<std::pair<std::string, double>> rates;
    for (const auto& row : rows) rates.push_back({row.name, row.tokens_per_s});
    print_torch_ratios(o, base, rates);
  }
  return 0;
}

// --device cuda: tokens/s per recipe on the GPU (the step is timed to the loss read back each step);
// the CPU's split by kind and ideal step do not apply. --vs-torch: PyTorch on the same GPU.
int run_speed_on_gpu(const TrainBenchOptions& o, const train::TrainConfig& base, const std::vector<int32_t>& corpus,
                     const std::vector<std::pair<std::string, RecipeConfig>>& recipes, const ops::Backend& gpu) {
  fmt::print("speed: {} layers x width {} x {} heads, context {}, batch {} ({} tokens/step) on {}; {} warm-up + {} "
             "timed steps\n",
             base.model.layers, base.model.width, base.model.heads, base.model.context, base.batch,
             base.batch * base.model.context, gpu.describe(), o.warmup, o.timed_steps);
  fmt::print("\n{:<8} {:>10} {:>9} {:>10}\n", "recipe", "tokens/s", "step ms", "vs none");
  double none_tps = 0;
  std::vector<std::pair<std::string, double>> rows;
  for (const auto& [name, recipe] : recipes) {
    train::TrainConfig c = base;
    c.recipe = recipe;
    const auto r = train::measure_training_speed(c, corpus, o.warmup, o.timed_steps);
    if (c.recipe.quantization == Quantization::none) none_tps = r.tokens_per_s;
    rows.push_back({name, r.tokens_per_s});
    fmt::print("{:<8} {:>10.0f} {:>9.1f} {:>10}\n", name, r.tokens_per_s, 1e3 * r.step_s,
               none_tps > 0 ? fmt::format("{:.2f}x", r.tokens_per_s / none_tps) : "-");
    std::fflush(stdout);
  }
  if (o.vs_torch) {
    fmt::print("\nPyTorch on the same model, batch and GPU, right after ({} {}):\n", o.torch_python, o.torch_script);
    print_torch_ratios(o, base, rows);
  }
  return 0;
}

}  // namespace

// --predict: each recipe's step on the modelled GPU, from the speed shape (or the given one).
int run_predict(const TrainBenchOptions& o) {
  const GpuSpec& gpu = gpu_spec(o.gpu);
  const train::TrainConfig base = speed_config(o, o.vocab > 0 ? o.vocab : kCharVocab);
  const int64_t seq = base.seq > 0 ? base.seq : base.model.context;
  fmt::print("predicted training step on {} (a model of the kernels, bench/gpu_step_model.h): {} blocks x width {}, {} "
             "heads, context {}, batch {}, vocab {}\n",
             gpu.name, base.model.layers, base.model.width, base.model.heads, seq, base.batch, base.model.vocab);
  for (const auto& [name, rc] : resolve_recipes(o)) {
    const Recipe recipe(rc, static_cast<int>(base.model.layers), model::block_linear_shapes(base.model),
                        base.batch * seq, ops::cpu());
    fmt::print("\n{}", prediction_table(name, predict_step(base.model, recipe, base.batch, seq, gpu), gpu));
  }
  return 0;
}

int run_train_bench(const TrainBenchOptions& o) {
  if (!o.predict && (o.vocab > 0 || o.gpu != "h200"))
    throw UsageError("--gpu and --vocab shape the prediction: add --predict");
  if (o.predict && (o.quality || o.vs_torch || o.contended || o.device != "cpu"))
    throw UsageError("--predict models a GPU step without training: drop --quality, --vs-torch, --contended and --device");
  if (o.predict) return run_predict(o);
  if (o.vs_torch && o.quality) throw UsageError("--vs-torch measures speed: drop --quality");
  if (o.device != "cpu" && o.quality) throw UsageError("--device measures speed: drop --quality");
  if (o.contended && (o.quality || o.device != "cpu"))
    throw UsageError("--contended measures CPU training speed beside busy processes: drop --quality and --device");
  return o.quality ? run_quality(o) : run_speed(o);
}

}  // namespace nibble::bench
