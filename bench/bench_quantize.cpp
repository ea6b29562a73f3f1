// Quantize throughput next to a plain copy of the same tensor, measured in the same run.
//
//   bench_quantize [rows cols [repeats]]      default 8192 x 8192 (64M FP32 values, 256 MB), best of 7
//
// The copy (memcpy, and a copy split over all OpenMP threads) moves 8 bytes per element: 4 read,
// 4 written. Its better bandwidth is the floor a memory-bound quantizer is measured against. Each
// quantizer is charged the bytes it must move at minimum: NVFP4 1x16 reads the input twice (amax,
// then quantize) and writes 0.5 byte of codes and 1/16 byte of scales per element, 8.5625 B in all.
// effective GB/s = bytes moved / time; ratio = effective GB/s / copy GB/s. Every timing is the best
// of N runs, because the machine's cores and memory are shared and the noise is one-sided.
// Quantizers write into reused buffers (quantize_into, the training-loop steady state); one line
// shows quantize(), which also pays for a fresh, zero-filled 36 MB result each call.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cpu/common/cpu_features.h"
#include "kernels/cpu/quantize/quantize.h"

using namespace nibble;

namespace {

double process_cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// CPU time / wall time of the best run: how many cores the run really had (other jobs share them).
double g_last_cores_used = 0;

double best_seconds(int repeats, const std::function<void()>& run) {
  run();  // warm-up: page faults, first-touch, lazy OpenMP start
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const double c0 = process_cpu_seconds();
    auto t0 = std::chrono::steady_clock::now();
    run();
    auto t1 = std::chrono::steady_clock::now();
    const double wall = std::chrono::duration<double>(t1 - t0).count();
    if (wall < best) {
      best = wall;
      g_last_cores_used = (process_cpu_seconds() - c0) / wall;
    }
  }
  return best;
}

// Deterministic pseudo-normal values (sum of uniforms), filled in parallel: fast to generate and
// a realistic spread of block maxima.
void fill(std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    uint64_t h = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;
    float s = 0.0f;
    for (int k = 0; k < 4; ++k) {
      h ^= h >> 29;
      h *= 0xBF58476D1CE4E5B9ull;
      h ^= h >> 32;
      s += static_cast<float>(h & 0xFFFFFF) * 0x1p-24f - 0.5f;
    }
    x[static_cast<size_t>(i)] = s * 1.7f;
  }
}

struct Result {
  std::string name;
  double seconds;
  double bytes;
  double cores_used = g_last_cores_used;
};

void print(const Result& r, double floor_gbs, int64_t n) {
  double gbs = r.bytes / r.seconds / 1e9;
  std::printf("%-44s %9.2f ms %8.2f GB/s  %6.1f%% of copy  (%.2f B/elem, %.2f Gelem/s, %.1f cores busy)\n",
              r.name.c_str(), r.seconds * 1e3, gbs, 100.0 * gbs / floor_gbs, r.bytes / static_cast<double>(n),
              static_cast<double>(n) / r.seconds / 1e9, r.cores_used);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 8192, cols = 8192;
  int repeats = 7;
  if (argc >= 3) {
    rows = std::atoll(argv[1]);
    cols = std::atoll(argv[2]);
  }
  if (argc >= 4) repeats = std::atoi(argv[3]);
  if (rows <= 0 || cols <= 0 || cols % 32 != 0 || rows % 16 != 0) {
    std::fprintf(stderr, "usage: bench_quantize [rows cols [repeats]]  (rows %% 16 == 0, cols %% 32 == 0)\n");
    return 2;
  }
  const int64_t n = rows * cols;
  const int threads = omp_get_max_threads();
  std::printf("bench_quantize: [%lld x %lld] = %lld FP32 values (%.0f MB), %d OpenMP threads, best of %d, ISA %s\n",
              static_cast<long long>(rows), static_cast<long long>(cols), static_cast<long long>(n), n * 4.0 / 1e6,
              threads, repeats, std::string(cpu::to_string(cpu::active_isa())).c_str());

  std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
  fill(x);
  fill(y);  // first touch, so the copies below measure bandwidth rather than page faults

  const double copy_bytes = 8.0 * static_cast<double>(n);
  Result memcpy_result{"copy: memcpy (1 thread)", 1e30, copy_bytes};
  Result parallel_copy{"copy: memcpy split over " + std::to_string(threads) + " threads", 1e30, copy_bytes};
  auto keep_best = [](Result& r, double seconds) {
    if (seconds < r.seconds) r.seconds = seconds, r.cores_used = g_last_cores_used;
  };
  auto measure_copies = [&] {
    keep_best(memcpy_result, best_seconds(repeats, [&] { std::memcpy(y.data(), x.data(), n * 4); }));
    keep_best(parallel_copy, best_seconds(repeats, [&] {
#pragma omp parallel
      {
        const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t b = n * t / nt, e = n * (t + 1) / nt;
        std::memcpy(y.data() + b, x.data() + b, static_cast<size_t>(e - b) * 4);
      }
    }));
  };
  // Other jobs share this machine: the copies are measured again after the quantizers and the
  // fastest copy seen is the floor, so a busy moment cannot flatter the ratios.
  auto floor_of = [&] { return std::max(copy_bytes / memcpy_result.seconds, copy_bytes / parallel_copy.seconds) / 1e9; };
  measure_copies();

  // Bytes each quantizer must move per element at minimum (see the header comment).
  const double nvfp4_bytes = 4.0 + 4.0 + 0.5 + 1.0 / 16.0;
  const double mxfp4_bytes = 4.0 + 4.0 + 0.5 + 1.0 / 32.0;
  const double mxfp8_bytes = 4.0 + 4.0 + 1.0 + 1.0 / 32.0;
  const double fp8_bytes = 4.0 + 4.0 + 1.0;
  const double dequant_bytes = 0.5 + 1.0 / 16.0 + 4.0;

  // Steady state, as in training: quantize_into reuses the output buffers of the previous call.
  QuantizedTensor out;
  std::vector<Result> results;
  auto quantize_case = [&](const std::string& name, const QuantOptions& o, double bytes_per_elem) {
    results.push_back({name, best_seconds(repeats, [&] { cpu::quantize_into(x, rows, cols, o, out); }), bytes_per_elem * n});
  };

  results.push_back({"-- NVFP4 1x16 RN quantize (amax + quantize) by ISA variant:", 0, 0});
  const cpu::Isa best_isa = cpu::detected_isa();
  for (cpu::Isa isa : {cpu::Isa::scalar, cpu::Isa::avx2, cpu::Isa::avx512}) {
    if (isa > best_isa) continue;
    cpu::set_isa_limit(isa);
    quantize_case("nvfp4 1x16 rn, " + std::string(cpu::to_string(isa)) + ", " + std::to_string(threads) + " threads",
                  {}, nvfp4_bytes);
  }
  cpu::set_isa_limit(best_isa);
  // quantize() returns a fresh tensor: 36 MB of new pages, faulted in and zero-filled every call.
  Result fresh{"nvfp4 1x16 rn, fresh result (quantize())",
               best_seconds(repeats, [&] { auto q = cpu::quantize(x, rows, cols, {}); }), nvfp4_bytes * n};
  results.push_back(fresh);
  omp_set_num_threads(1);
  quantize_case("nvfp4 1x16 rn, " + std::string(cpu::to_string(best_isa)) + ", 1 thread", {}, nvfp4_bytes);
  omp_set_num_threads(threads);

  results.push_back({"-- Every format, " + std::string(cpu::to_string(best_isa)) + ", " + std::to_string(threads) + " threads:", 0, 0});
  quantize_case("nvfp4 1x16 rn (amax + quantize)", {}, nvfp4_bytes);
  QuantOptions tile;
  tile.tile_16x16 = true;
  quantize_case("nvfp4 16x16 rn", tile, nvfp4_bytes);
  QuantOptions rht_sr;
  rht_sr.rht = true;
  rht_sr.rounding = Rounding::stochastic;
  rht_sr.seed = 42;
  quantize_case("nvfp4 1x16 rht + sr", rht_sr, nvfp4_bytes);
  QuantOptions rht_rn;
  rht_rn.rht = true;
  quantize_case("nvfp4 1x16 rht + rn", rht_rn, nvfp4_bytes);
  QuantOptions sr;
  sr.rounding = Rounding::stochastic;
  sr.seed = 42;
  quantize_case("nvfp4 1x16 sr", sr, nvfp4_bytes);
  QuantOptions fos;
  fos.four_over_six = true;
  quantize_case("nvfp4 1x16 rn four-over-six", fos, nvfp4_bytes);
  QuantOptions rows_scaled;  // TE's row-scaled NVFP4: each row its own amax, global scale and tables
  rows_scaled.row_scaled = true;
  quantize_case("nvfp4 1x16 rn row-scaled", rows_scaled, nvfp4_bytes);
  QuantOptions mxfp4;
  mxfp4.format = Format::mxfp4;
  quantize_case("mxfp4 rn", mxfp4, mxfp4_bytes);
  QuantOptions mxfp8;
  mxfp8.format = Format::mxfp8;
  quantize_case("mxfp8", mxfp8, mxfp8_bytes);
  QuantOptions fp8;
  fp8.format = Format::fp8_e4m3;
  quantize_case("fp8 e4m3 per tensor", fp8, fp8_bytes);

  // The pairs Linear makes of an activation (fprop X rn, wgrad X^T rht) and of a gradient (dgrad dY
  // sr, wgrad dY^T rht + sr): quantize_both_into, then the same pair as two separate calls. Each pair
  // must move the input twice (amax pass, encode pass) and write both copies: 9.125 B/elem.
  results.push_back({"-- Training pairs (row-wise + transposed), " + std::string(cpu::to_string(best_isa)) + ":", 0, 0});
  const double pair_bytes = 4.0 + 4.0 + 2 * (0.5 + 1.0 / 16.0);
  QuantizedTensor out_t;
  const std::pair<QuantOptions, QuantOptions> pairs[] = {{{}, rht_rn}, {sr, rht_sr}};
  const char* pair_names[] = {"X (rn) + X^T (rht)", "dY (sr) + dY^T (rht + sr)"};
  for (int p = 0; p < 2; ++p) {
    const auto& [row_opt, t_opt] = pairs[p];
    results.push_back({std::string(pair_names[p]) + ", quantize_both_into",
                       best_seconds(repeats, [&] { cpu::quantize_both_into(x, rows, cols, row_opt, out, t_opt, out_t); }),
                       pair_bytes * n});
    results.push_back({std::string(pair_names[p]) + ", two calls", best_seconds(repeats, [&] {
                         cpu::quantize_into(x, rows, cols, row_opt, out);
                         cpu::quantize_transposed_into(x, rows, cols, t_opt, out_t);
                       }),
                       pair_bytes * n});
    results.push_back({std::string(pair_names[p]).substr(std::string(pair_names[p]).find('+') + 2) + " alone", best_seconds(repeats, [&] {
                         cpu::quantize_transposed_into(x, rows, cols, t_opt, out_t);
                       }),
                       (pair_bytes - 4.0 - 0.5 - 1.0 / 16.0) * n});
  }

  auto q = cpu::quantize(x, rows, cols, {});
  {
    double seconds = best_seconds(repeats, [&] { cpu::dequantize(q, y); });
    results.push_back({"nvfp4 1x16 dequantize", seconds, dequant_bytes * n});
  }

  // The headline once more, interleaved with the copy round by round, so both see the same
  // moments of a shared machine: the ratio of this pair is the least noisy figure printed.
  Result paired_copy{"copy (memcpy, 1 thread), interleaved", 1e30, copy_bytes};
  Result paired_quantize{"nvfp4 1x16 rn, interleaved with the copy", 1e30, nvfp4_bytes * n};
  for (int round = 0; round < repeats; ++round) {
    keep_best(paired_copy, best_seconds(1, [&] { std::memcpy(y.data(), x.data(), n * 4); }));
    keep_best(paired_quantize, best_seconds(1, [&] { cpu::quantize_into(x, rows, cols, {}, out); }));
  }

  measure_copies();
  const double floor_gbs = floor_of();
  std::printf("copy floor: %.2f GB/s (the fastest copy, measured before and after; 8 B/elem)\n\n", floor_gbs);
  print(memcpy_result, floor_gbs, n);
  print(parallel_copy, floor_gbs, n);
  for (const Result& r : results) {
    if (r.seconds == 0) std::printf("\n%s\n", r.name.c_str() + 3);
    else print(r, floor_gbs, n);
  }
  const double paired_floor = copy_bytes / paired_copy.seconds / 1e9;
  std::printf("\nInterleaved pair (ratio against this copy, %.2f GB/s):\n", paired_floor);
  print(paired_copy, paired_floor, n);
  print(paired_quantize, paired_floor, n);
  return 0;
}
