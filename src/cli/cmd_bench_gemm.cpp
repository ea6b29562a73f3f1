// `nibble bench gemm`: GFLOP/s (2*M*N*K per GEMM) of nibble's quantized GEMMs against oneDNN FP32
// and BF16 and OpenBLAS SGEMM, on square sizes and the GEMM shapes of a small transformer layer,
// in one run and one table: ratios against oneDNN FP32, and each kernel's share of the measured
// instruction peak of its kind (int8 dot products for the 4-bit/FP8 kernels, FP32 FMA otherwise).
// Times are the best of several calls: on a shared machine the best is the least disturbed.
#include <fmt/core.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cli/bench_cuda.h"
#include "cli/command.h"
#include "format/quantized_tensor.h"
#include "kernels/cpu/common/cpu_features.h"
#include "kernels/cpu/gemm/gemm.h"
#include "kernels/cpu/gemm/gemm_peaks.h"
#include "kernels/cpu/quantize/quantize.h"

#ifdef NIBBLE_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace nibble::cli {
namespace {

struct GemmShape {
  std::string name;
  int64_t M, N, K;
};

struct BenchOptions {
  std::vector<int64_t> sizes{512, 1024, 2048, 4096};
  bool quick = false;
  bool transformer = true;
  double min_seconds = 0.5;  // per kernel and shape
};

// Best seconds per call of `fn` over at least 3 calls and about `min_seconds` (after one warm-up).
double best_seconds(const std::function<void()>& fn, double min_seconds) {
  using clock = std::chrono::steady_clock;
  fn();
  double best = 1e30, total = 0.0;
  for (int i = 0; total < min_seconds || i < 3; ++i) {
    auto t0 = clock::now();
    fn();
    double dt = std::chrono::duration<double>(clock::now() - t0).count();
    best = std::min(best, dt);
    total += dt;
  }
  return best;
}

std::vector<float> random_matrix(int64_t rows, int64_t cols, uint64_t seed) {
  std::vector<float> x(static_cast<size_t>(rows * cols));
#pragma omp parallel
  {
    std::mt19937_64 rng(seed + 7919 * static_cast<uint64_t>(omp_get_thread_num()));
    std::normal_distribution<float> normal(0.0f, 1.0f);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows * cols; ++i) x[i] = normal(rng);
  }
  return x;
}

struct Column {
  std::string name;
  bool int8_kind;  // judged against the int8 dot-product peak (else the FP32 FMA peak)
};

// Column indices, in table order.
enum Col : size_t { kNvfp4, kNvfp4Fp32Sum, kMxfp4, kFp8, kOneDnnF32, kNibbleF32, kOneDnnBf16, kNibbleBf16, kOpenBlas,
                   kNvfp4QGemm, kNvfp4Avx512 };

const std::vector<Column>& columns() {
  static const std::vector<Column> c = {{"nvfp4", true},        {"nvfp4 fp32sum", true}, {"mxfp4", true},
                                        {"fp8", false},         {"onednn f32", false},   {"nibble f32", false},
                                        {"onednn bf16", false},
                                        {"nibble bf16", false}, {"openblas", false},    {"nvfp4 q+gemm", true},  {"nvfp4 avx512", true}};
  return c;
}

// What each column runs on this CPU (after NIBBLE_ISA), or "n/a: <why>" where it cannot run here.
const char* int8_kernel_name(cpu::Isa isa) {
  switch (isa) {
    case cpu::Isa::amx: return "AMX-INT8 tdpbssd";
    case cpu::Isa::avx512bf16:
    case cpu::Isa::avx512: return "AVX-512 VNNI vpdpbusd";
    case cpu::Isa::avx2: return "AVX2 vpmaddubsw";
    case cpu::Isa::scalar: return "scalar";
  }
  return "?";
}
const char* fma_kernel_name(cpu::Isa isa) {
  return isa >= cpu::Isa::avx512 ? "AVX-512 FMA" : isa == cpu::Isa::avx2 ? "AVX2 FMA" : "scalar";
}
constexpr const char* kNotAvailable = "n/a";

std::vector<std::string> column_kernels() {
  const cpu::Isa isa = cpu::active_isa();
  const bool fp32sum = cpu::fp32_products_available(Format::nvfp4);
  const bool dpbf16 = cpu::bf16_pair_kernel() == cpu::Bf16PairKernel::dpbf16;
  const std::string fma_pairs = fmt::format("{} on widened BF16 pairs, pair order{}", fma_kernel_name(isa),
                                            isa >= cpu::Isa::avx512bf16 ? " (vdpbf16ps's bits; on Intel the FMAs are faster)" : "");
  std::vector<std::string> k(columns().size());
  k[kNvfp4] = fmt::format("block_exact on {}", int8_kernel_name(isa));
  k[kNvfp4Fp32Sum] = fp32sum ? "fp32_products on AMX-BF16 tdpbf16ps"
                             : "n/a: needs AMX-BF16 (fp32_products runs block_exact on this CPU)";
  k[kMxfp4] = fmt::format("block_exact on {}", int8_kernel_name(isa));
  k[kFp8] = fp32sum                        ? "fp32_products on AMX-BF16 tdpbf16ps"
            : dpbf16                       ? "fp32_products with AVX512-BF16 vdpbf16ps"
            : isa >= cpu::Isa::avx512bf16 ? "fp32_products: " + fma_pairs
                                           : fmt::format("E4M3 decoded exactly, {} in k order", fma_kernel_name(isa));
  k[kOneDnnF32] = "oneDNN f32 matmul";
  k[kNibbleF32] = fmt::format("gemm_f32: {} on FP32 panels, k in order", fma_kernel_name(isa));
  k[kOneDnnBf16] = "oneDNN bf16 matmul (its f32 matmul on BF16-rounded copies where it has no BF16 kernel)";
  k[kNibbleBf16] = fp32sum  ? "gemm_bf16 on AMX-BF16 tdpbf16ps"
                  : dpbf16 ? "gemm_bf16 with AVX512-BF16 vdpbf16ps"
                           : "gemm_bf16: " + fma_pairs;
#ifdef NIBBLE_HAVE_OPENBLAS
  k[kOpenBlas] = "OpenBLAS cblas_sgemm";
#else
  k[kOpenBlas] = "n/a: OpenBLAS was not found at build time";
#endif
  k[kNvfp4QGemm] = fmt::format("quantize both operands + {}", fp32sum ? "fp32_products" : "block_exact");
  k[kNvfp4Avx512] = isa == cpu::Isa::amx ? "block_exact on AVX-512 VNNI vpdpbusd (bitwise the nvfp4 column)"
                                         : "n/a: only beside AMX-INT8 (without AMX the nvfp4 column is the best kernel)";
  return k;
}

// One shape's operands (A [M,K] and B [N,K], both K-contiguous) and output, and the GFLOP/s of a call on them.
struct ShapeBench {
  int64_t M, N, K;
  double min_seconds;
  std::vector<float> a, b, c;

  ShapeBench(const GemmShape& s, double min_seconds)
      : M(s.M), N(s.N), K(s.K), min_seconds(min_seconds), a(random_matrix(M, K, 1)), b(random_matrix(N, K, 2)),
        c(static_cast<size_t>(M * N)) {}
  double rate(const std::function<void()>& fn) const { return 2.0 * M * N * K / best_seconds(fn, min_seconds) * 1e-9; }
  // A as activations (1x16 / 1x32 blocks), B as weights (16x16 tiles where asked and N allows).
  std::pair<QuantizedTensor, QuantizedTensor> quantized(Format f, bool tile) const {
    QuantOptions opt;
    opt.format = f;
    opt.tile_16x16 = tile && N % 16 == 0;
    return std::pair{cpu::quantize(a, M, K, {.format = f}), cpu::quantize(b, N, K, opt)};
  }
};

// nibble's quantized GEMMs: nvfp4 (and its fp32sum and AVX-512 variants), mxfp4, fp8.
void bench_quantized_columns(ShapeBench& s, std::vector<double>& gflops) {
  const int64_t N = s.N;
  float* c = s.c.data();
  const bool fp32sum = cpu::fp32_products_available(Format::nvfp4);
  {
    // The training recipe's forward GEMM: activations 1x16, weights 16x16 tiles.
    auto [qa, qb] = s.quantized(Format::nvfp4, true);
    gflops[kNvfp4] = s.rate([&] { cpu::gemm(qa, qb, c, N); });
    if (fp32sum)
      gflops[kNvfp4Fp32Sum] = s.rate([&] { cpu::gemm(qa, qb, c, N, 1.0f, Output::overwrite, cpu::Summation::fp32_products); });
    if (cpu::active_isa() == cpu::Isa::amx) {
      // The same product on the AVX-512 VNNI kernel, to show what the tile unit adds (bitwise equal).
      cpu::set_isa_limit(cpu::Isa::avx512);
      gflops[kNvfp4Avx512] = s.rate([&] { cpu::gemm(qa, qb, c, N); });
      cpu::set_isa_limit(cpu::Isa::amx);
    }
  }
  {
    auto [qa, qb] = s.quantized(Format::mxfp4, false);
    gflops[kMxfp4] = s.rate([&] { cpu::gemm(qa, qb, c, N); });
  }
  {
    // What the fp8 recipe runs (gemm_summation=auto).
    const cpu::Summation fp8_training = cpu::fp32_products_available(Format::fp8_e4m3) ? cpu::Summation::fp32_products
                                                                                       : cpu::Summation::block_exact;
    auto [qa, qb] = s.quantized(Format::fp8_e4m3, false);
    gflops[kFp8] = s.rate([&] { cpu::gemm(qa, qb, c, N, 1.0f, Output::overwrite, fp8_training); });
  }
}

// The FP32 and BF16 GEMMs: oneDNN's, nibble's and OpenBLAS's, in the same TN layout.
void bench_dense_columns(ShapeBench& s, std::vector<double>& gflops) {
  const int64_t M = s.M, N = s.N, K = s.K;
  const float *a = s.a.data(), *b = s.b.data();
  float* c = s.c.data();
  gflops[kOneDnnF32] = s.rate([&] {
    cpu::gemm_f32_onednn(cpu::Trans::no, cpu::Trans::yes, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N);
  });
  gflops[kNibbleF32] = s.rate([&] {
    cpu::gemm_f32(cpu::Trans::no, cpu::Trans::yes, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N);
  });
  gflops[kOneDnnBf16] = s.rate([&] {
    cpu::gemm_bf16_onednn(cpu::Trans::no, cpu::Trans::yes, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N);
  });
  gflops[kNibbleBf16] = s.rate([&] {
    cpu::gemm_bf16(cpu::Trans::no, cpu::Trans::yes, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N);
  });
#ifdef NIBBLE_HAVE_OPENBLAS
  gflops[kOpenBlas] = s.rate([&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(M), static_cast<int>(N), static_cast<int>(K),
                1.0f, a, static_cast<int>(K), b, static_cast<int>(K), 0.0f, c, static_cast<int>(N));
  });
#endif
}

// GFLOP/s of each column for one shape (NaN where not available).
std::vector<double> bench_shape(const GemmShape& shape, double min_seconds) {
  ShapeBench s(shape, min_seconds);
  std::vector<double> gflops(columns().size(), std::nan(""));
  bench_quantized_columns(s, gflops);
  bench_dense_columns(s, gflops);
  // What a training step pays per linear: quantize both FP32 operands, then the fastest summation.
  const cpu::Summation training =
      cpu::fp32_products_available(Format::nvfp4) ? cpu::Summation::fp32_products : cpu::Summation::block_exact;
  gflops[kNvfp4QGemm] = s.rate([&] {
    QuantOptions weights{.format = Format::nvfp4, .tile_16x16 = s.N % 16 == 0};
    QuantizedTensor qa = cpu::quantize(s.a, s.M, s.K, {.format = Format::nvfp4});
    QuantizedTensor qb = cpu::quantize(s.b, s.N, s.K, weights);
    cpu::gemm(qa, qb, s.c.data(), s.N, 1.0f, Output::overwrite, training);
  });
  return gflops;
}

std::vector<int64_t> parse_sizes(const std::string& text) {
  std::vector<int64_t> sizes;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    int64_t v = 0;
    size_t used = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size())
      throw UsageError("bench gemm: size '" + item + "' is not a whole number (e.g. --sizes 512,1024)");
    if (v > 16384) throw UsageError("bench gemm: size " + item + " is above 16384 (its FP32 operands alone would need " +
                                   std::to_string(3 * v * v * 4 / (1 << 20)) + " MiB)");
    if (v <= 0 || v % 32 != 0) throw UsageError("bench gemm: size " + item + " must be a positive multiple of 32 (K must fit whole MXFP4 blocks)");
    sizes.push_back(v);
  }
  return sizes;
}

// The instruction peaks the tables judge the kernels against, measured here.
struct InstructionPeaks {
  cpu::InstructionPeak fma, dot, tile, tile_bf16;
};

InstructionPeaks measure_and_print_peaks(bool quick, int threads) {
  InstructionPeaks p;
  p.fma = cpu::measure_fma_f32_peak(quick ? 0.1 : 0.3);
  p.dot = cpu::measure_int8_dot_peak(quick ? 0.1 : 0.3);
  p.tile = cpu::measure_amx_int8_peak(quick ? 0.1 : 0.3);
  p.tile_bf16 = cpu::measure_amx_bf16_peak(quick ? 0.1 : 0.3);
  fmt::print("measured peaks per core: {} {:.0f} GFLOP/s, {} {:.0f} GOP/s; x{} threads: {:.0f} / {:.0f}\n",
             p.fma.instruction, p.fma.giga_ops_per_s, p.dot.instruction, p.dot.giga_ops_per_s, threads,
             p.fma.giga_ops_per_s * threads, p.dot.giga_ops_per_s * threads);
  if (p.tile.giga_ops_per_s > 0)
    fmt::print("AMX tile peak per core: {} {:.0f} GOP/s (a 16-element block uses K=16, a quarter of it: {:.0f})\n",
               p.tile.instruction, p.tile.giga_ops_per_s, p.tile.giga_ops_per_s / 4);
  if (p.tile_bf16.giga_ops_per_s > 0)
    fmt::print("AMX-BF16 tile peak per core: {} {:.0f} GFLOP/s\n", p.tile_bf16.instruction, p.tile_bf16.giga_ops_per_s);
  return p;
}

std::vector<GemmShape> shapes_of(const BenchOptions& opt) {
  std::vector<GemmShape> shapes;
  for (int64_t n : opt.sizes) shapes.push_back({fmt::format("{}^3", n), n, n, n});
  if (opt.transformer) {
    // One layer of a small transformer, 4096 tokens, hidden 768, MLP 3072 (C = A . B^T).
    shapes.push_back({"fprop mlp-up", 4096, 3072, 768});
    shapes.push_back({"dgrad mlp-up", 4096, 768, 3072});
    shapes.push_back({"wgrad mlp-up", 768, 3072, 4096});
    shapes.push_back({"attn proj", 4096, 768, 768});
  }
  return shapes;
}

void print_table_header() {
  fmt::print("{:<14} {:>16}", "shape", "M x N x K");
  for (const Column& col : columns()) fmt::print(" {:>15}", col.name);
  fmt::print("\n");
}

void print_shape_cell(const GemmShape& s) { fmt::print("{:<14} {:>16}", s.name, fmt::format("{}x{}x{}", s.M, s.N, s.K)); }

// Measures every shape, printing each row as it is done; returns GFLOP/s [shape][column].
std::vector<std::vector<double>> measure_and_print_gflops(const std::vector<GemmShape>& shapes, double min_seconds) {
  fmt::print("\nGFLOP/s (2MNK / best time) and ratio to oneDNN FP32\n");
  print_table_header();
  std::vector<std::vector<double>> all;
  for (const GemmShape& s : shapes) {
    std::vector<double> g = bench_shape(s, min_seconds);
    all.push_back(g);
    print_shape_cell(s);
    for (double v : g) {
      if (std::isnan(v))
        fmt::print(" {:>15}", kNotAvailable);
      else
        fmt::print(" {:>8.0f} ({:4.2f})", v, v / g[kOneDnnF32]);
    }
    fmt::print("\n");
    std::fflush(stdout);
  }
  return all;
}

// Each entry's share of the all-thread peak of its kind.
void print_peak_shares(const std::vector<GemmShape>& shapes, const std::vector<std::vector<double>>& all,
                       const InstructionPeaks& p, int threads) {
  fmt::print("\n% of the {}-thread peak (int8 kinds vs {}, others vs {})\n", threads, p.dot.instruction, p.fma.instruction);
  print_table_header();
  for (size_t i = 0; i < shapes.size(); ++i) {
    print_shape_cell(shapes[i]);
    for (size_t j = 0; j < columns().size(); ++j) {
      double peak = (columns()[j].int8_kind ? p.dot.giga_ops_per_s : p.fma.giga_ops_per_s) * threads;
      if (std::isnan(all[i][j]) || !(peak > 0))
        fmt::print(" {:>15}", kNotAvailable);
      else
        fmt::print(" {:>14.1f}%", 100.0 * all[i][j] / peak);
    }
    fmt::print("\n");
  }
  if (!(p.tile.giga_ops_per_s > 0 && cpu::active_isa() == cpu::Isa::amx)) return;
  fmt::print("\n% of the {}-thread AMX tile peaks: the int8 kinds vs tdpbssd at K=16 ({:.0f} GOP/s), nvfp4 fp32sum vs "
             "tdpbf16ps ({:.0f} GFLOP/s)\n", threads, p.tile.giga_ops_per_s / 4 * threads, p.tile_bf16.giga_ops_per_s * threads);
  for (size_t i = 0; i < shapes.size(); ++i) {
    print_shape_cell(shapes[i]);
    for (size_t j : {size_t{kNvfp4}, size_t{kMxfp4}})
      fmt::print("  {} {:.1f}%", columns()[j].name, 100.0 * all[i][j] / (p.tile.giga_ops_per_s / 4 * threads));
    if (p.tile_bf16.giga_ops_per_s > 0)
      fmt::print("  {} {:.1f}%", columns()[kNvfp4Fp32Sum].name,
                 100.0 * all[i][kNvfp4Fp32Sum] / (p.tile_bf16.giga_ops_per_s * threads));
    fmt::print("\n");
  }
}

int run_bench_gemm(const BenchOptions& opt) {
  const int threads = omp_get_max_threads();
  fmt::print("nibble bench gemm: ISA {}, {} OpenMP threads, best of >= 3 calls per entry\n",
             cpu::to_string(cpu::active_isa()), threads);
  const InstructionPeaks peaks = measure_and_print_peaks(opt.quick, threads);
  const std::vector<std::string> kernels = column_kernels();
  fmt::print("columns (what each runs on this CPU; n/a: cannot run here):\n");
  for (size_t j = 0; j < columns().size(); ++j) fmt::print("  {:<14} {}\n", columns()[j].name, kernels[j]);

  const std::vector<GemmShape> shapes = shapes_of(opt);
  const auto all = measure_and_print_gflops(shapes, opt.quick ? 0.1 : opt.min_seconds);
  print_peak_shares(shapes, all, peaks, threads);
  fmt::print("\nnvfp4 is the forward GEMM of the recipe (A 1x16, B 16x16 tiles) with Summation::block_exact (each\n"
             "16-block product exact, one FP32 rounding per block); nvfp4 avx512 is the same product on the VNNI\n"
             "kernel beside AMX-INT8 (bitwise equal). nvfp4 fp32sum is Summation::fp32_products (operands decoded\n"
             "exactly to BF16, AMX-BF16 tiles, FP32 accumulation); nvfp4 q+gemm quantizes both FP32 operands and\n"
             "runs the summation training uses.\n");
  fmt::print("\nfp8 (per-tensor E4M3) runs the summation training uses; it is judged against the FMA peak. nibble\n"
             "f32 is what FP32 training runs (its own kernel: bitwise the same for any thread count). onednn\n"
             "bf16 includes rounding both FP32 operands to BF16 each call, and nibble bf16 (what training's BF16\n"
             "GEMMs run, bitwise the same for any thread count) rounds them while packing; on AMX-BF16 tiles their\n"
             "% of the FMA peak can pass 100.\n");
  return 0;
}

const CommandRegistration registration{"bench gemm", [](CLI::App& app, int& exit_code) {
  CLI::App* bench = subcommand_group(app, "bench", "Measure nibble's kernels against libraries");
  CLI::App* cmd = bench->add_subcommand("gemm", "GEMM GFLOP/s: NVFP4/MXFP4/FP8 vs oneDNN FP32/BF16 and OpenBLAS");
  auto opt = std::make_shared<BenchOptions>();
  auto sizes = std::make_shared<std::string>("512,1024,2048,4096");
  cmd->add_option("--sizes", *sizes, "comma-separated square sizes (multiples of 32)")->capture_default_str();
  cmd->add_flag("--quick", opt->quick, "shorter timing (0.1 s per entry) and peaks");
  cmd->add_flag("!--no-transformer", opt->transformer, "skip the transformer-layer shapes");
  auto device = std::make_shared<std::string>("cpu");
  cmd->add_option("--device", *device, "cpu, or cuda: cuBLASLt NVFP4 (native or emulated), FP8, BF16 and the "
                                       "quantization kernels on the GPU (size: the first of --sizes, default 8192)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->callback([opt, sizes, device, cmd, &exit_code] {
    if (*device == "cuda") {
      const bool sizes_given = cmd->count("--sizes") > 0;
      exit_code = run_bench_gemm_cuda(sizes_given ? parse_sizes(*sizes).front() : 8192);
      return;
    }
    opt->sizes = parse_sizes(*sizes);
    exit_code = run_bench_gemm(*opt);
  });
}};

}  // namespace
}  // namespace nibble::cli
