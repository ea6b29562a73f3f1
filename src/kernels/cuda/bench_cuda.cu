// The CUDA benchmark behind `nibble bench gemm --device cuda`. Every figure is measured in this run
// with CUDA events on the context's stream (warm-up calls first), so ratios compare like with like.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/bench_cuda.h"
#include "kernels/cuda/bench_kernels.cuh"
#include "kernels/cuda/device_math.h"
#include "kernels/cuda/event_timer.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/launch.h"

namespace nibble::cuda {
namespace {

DeviceBuffer<float> random_device(int64_t n, uint64_t seed, Context& ctx) {
  DeviceBuffer<float> x(static_cast<size_t>(n), ctx.stream());
  NIBBLE_LAUNCH(1024, 256, 0, ctx.stream(), bench_kernels::fill_random_kernel)(x.data(), n, seed);
  NIBBLE_CUDA_CHECK_LAUNCH();
  return x;
}
DeviceBuffer<uint16_t> to_bf16(const DeviceBuffer<float>& x, Context& ctx) {
  DeviceBuffer<uint16_t> out(x.size(), ctx.stream());
  NIBBLE_LAUNCH(1024, 256, 0, ctx.stream(), bench_kernels::to_bf16_kernel)(x.data(), static_cast<int64_t>(x.size()), out.data());
  NIBBLE_CUDA_CHECK_LAUNCH();
  return out;
}

struct Row {
  std::string name;
  double value;   // GB/s or TFLOP/s
  double ratio;   // against the reference line of its table
  std::string note;
};

void print_table(const char* title, const char* unit, const char* ratio_name, const std::vector<Row>& rows) {
  std::printf("\n%s\n", title);
  std::printf("  %-52s %10s %10s  %s\n", "", unit, ratio_name, "");
  for (const Row& r : rows) std::printf("  %-52s %10.1f %10.3f  %s\n", r.name.c_str(), r.value, r.ratio, r.note.c_str());
}

std::string verdict(double ratio, double target) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "target >= %.2f: %s", target, ratio >= target ? "met" : "MISSED");
  return buf;
}

int run(const CudaBenchOptions& o) {
  Context ctx(o.device);
  const DeviceInfo& dev = ctx.device();
  Timer timer(ctx);
  const int W = o.warmup, I = o.iterations;
  std::printf("nibble bench gemm --device cuda\n");
  std::printf("device %d: %s, sm_%d, %d SMs, %.1f GiB\n", dev.ordinal, dev.name.c_str(), dev.compute_capability(),
              dev.sm_count, static_cast<double>(dev.memory_bytes) / (1 << 30));

  // ---------------------------------------------------------------- quantization bandwidth
  const int64_t R = o.quant_rows, C = o.quant_cols, n = R * C;
  const DeviceBuffer<float> x = random_device(n, 1, ctx);
  const DeviceBuffer<uint16_t> x16 = to_bf16(x, ctx);
  DeviceBuffer<float> copy_dst(static_cast<size_t>(n), ctx.stream());
  const double copy_s = timer.seconds(
      [&] {
        NIBBLE_CUDA_CHECK(cudaMemcpyAsync(copy_dst.data(), x.data(), x.bytes(), cudaMemcpyDeviceToDevice, ctx.stream()));
      },
      W, I);
  const double copy_gbs = 2.0 * static_cast<double>(x.bytes()) / copy_s * 1e-9;  // read + write

  KernelOptions fast;
  fast.check_finite = false;  // no read-back: the kernels alone
  DeviceBuffer<float> amax_out(1, ctx.stream());
  const double amax_s = timer.seconds([&] { amax(x.data(), n, amax_out.data(), ctx); }, W, I);

  std::vector<Row> qrows;
  qrows.push_back({"device-to-device copy (read + write)", copy_gbs, 1.0, "reference"});
  qrows.push_back({"amax pass (FP32 in)", 4.0 * n / amax_s * 1e-9, 4.0 * n / amax_s * 1e-9 / copy_gbs,
                   verdict(4.0 * n / amax_s * 1e-9 / copy_gbs, 0.70)});
  // Bytes a quantizer must move: its input once, its outputs once. The chain reads the input
  // twice (amax, then quantize): "both passes" is what a caller pays today, "quantize pass" the
  // second kernel alone (amax given, as when a previous kernel produces it).
  std::vector<DeviceQuantized> keep;  // results whose globals[0] serve as given amaxes
  auto add_quantizer = [&](const std::string& name, double out_bytes_per_value, double in_bytes_per_value,
                           const std::function<KernelOptions()>& first_run,
                           const std::function<void(const KernelOptions&)>& body) {
    const double moved = (in_bytes_per_value + out_bytes_per_value) * static_cast<double>(n);
    const double s = timer.seconds([&] { body(fast); }, W, I);
    const KernelOptions given = first_run();
    const double pass_s = timer.seconds([&] { body(given); }, W, I);
    const double gbs = moved / s * 1e-9, pass_gbs = moved / pass_s * 1e-9;
    qrows.push_back({name + ", both passes", gbs, gbs / copy_gbs, ""});
    qrows.push_back({name + ", quantize pass", pass_gbs, pass_gbs / copy_gbs, verdict(pass_gbs / copy_gbs, 0.70)});
  };
  auto single = [&](const void* input, bool bf16_input, const QuantOptions& opt) {
    return [&, input, bf16_input, opt] {
      keep.push_back(bf16_input ? quantize(static_cast<const bf16*>(input), R, C, opt, ctx, fast)
                                : quantize(static_cast<const float*>(input), R, C, opt, ctx, fast));
      KernelOptions k = fast;
      k.given_amax = keep.back().globals.data();
      return k;
    };
  };
  auto pair = [&](const QuantOptions& row, const QuantOptions& col) {
    return [&, row, col] {
      QuantizedPair p = quantize_both(x.data(), R, C, row, col, ctx, fast);
      keep.push_back(std::move(p.rowwise));
      keep.push_back(std::move(p.columnwise));
      KernelOptions k = fast;
      k.given_amax = keep[keep.size() - 2].globals.data();
      k.given_column_amax = keep.back().globals.data();
      return k;
    };
  };
  QuantOptions rn, tile, col_rht_sr, mxfp8, fp8;
  tile.tile_16x16 = true;
  col_rht_sr.rht = true;
  col_rht_sr.rounding = Rounding::stochastic;
  col_rht_sr.seed = 7;
  mxfp8.format = Format::mxfp8;
  fp8.format = Format::fp8_e4m3;
  const double nv_out = 0.5 + 1.0 / 16;
  const void* x32 = x.data();
  const void* xb16 = x16.data();
  add_quantizer("NVFP4 1x16 RN (FP32 in)", nv_out, 4, single(x32, false, rn),
                [&](const KernelOptions& k) { quantize(x.data(), R, C, rn, ctx, k); });
  add_quantizer("NVFP4 1x16 RN (BF16 in)", nv_out, 2, single(xb16, true, rn),
                [&](const KernelOptions& k) { quantize(reinterpret_cast<const bf16*>(x16.data()), R, C, rn, ctx, k); });
  add_quantizer("NVFP4 16x16 + fused transpose (FP32 in)", 2 * nv_out, 4, pair(tile, tile),
                [&](const KernelOptions& k) { quantize_both(x.data(), R, C, tile, tile, ctx, k); });
  add_quantizer("NVFP4 1x16 RN + x^T RHT+SR (wgrad pair, FP32 in)", 2 * nv_out, 4, pair(rn, col_rht_sr),
                [&](const KernelOptions& k) { quantize_both(x.data(), R, C, rn, col_rht_sr, ctx, k); });
  add_quantizer("MXFP8 (FP32 in)", 1.0 + 1.0 / 32, 4, single(x32, false, mxfp8),
                [&](const KernelOptions& k) { quantize(x.data(), R, C, mxfp8, ctx, k); });
  add_quantizer("FP8 E4M3 per tensor (FP32 in)", 1.0, 4, single(x32, false, fp8),
                [&](const KernelOptions& k) { quantize(x.data(), R, C, fp8, ctx, k); });
  {
    const DeviceQuantized q = quantize(x.data(), R, C, rn, ctx, fast);
    DeviceBuffer<uint16_t> decoded(static_cast<size_t>(n), ctx.stream());
    const double s = timer.seconds([&] { dequantize_block_scaled_bf16(q, decoded.data(), ctx); }, W, I);
    const double gbs = (nv_out + 2.0) * static_cast<double>(n) / s * 1e-9;
    qrows.push_back({"NVFP4 -> BF16 decode (emulated GEMM operand)", gbs, gbs / copy_gbs, verdict(gbs / copy_gbs, 0.70)});
  }
  char title[160];
  std::snprintf(title, sizeof title, "Quantization kernels on [%lld, %lld] (GB/s = bytes that must move / time)",
                static_cast<long long>(R), static_cast<long long>(C));
  print_table(title, "GB/s", "x copy", qrows);

  // ---------------------------------------------------------------- GEMMs
  const int64_t M = o.m, N = o.n, K = o.k;
  const double flops = 2.0 * M * N * K;
  const DeviceBuffer<float> a = random_device(M * K, 2, ctx), b = random_device(N * K, 3, ctx);
  DeviceBuffer<float> c(static_cast<size_t>(M * N), ctx.stream());
  std::vector<Row> grows;
  double bf16_tflops = 0;
  {
    const DeviceBuffer<uint16_t> a16 = to_bf16(a, ctx), b16 = to_bf16(b, ctx);
    const double s = timer.seconds(
        [&] { gemm_bf16(Trans::no, Trans::yes, M, N, K, 1.0f, a16.data(), K, b16.data(), K, 0.0f, c.data(), N, ctx); },
        W, I);
    bf16_tflops = flops / s * 1e-12;
    grows.push_back({"BF16 x BF16 -> FP32 (cuBLASLt)", bf16_tflops, 1.0, "reference"});
  }
  {
    const DeviceQuantized qa = quantize(a.data(), M, K, rn, ctx, fast), qb = quantize(b.data(), N, K, tile, ctx, fast);
    GemmPath path = gemm(qa, qb, c.data(), N, 1.0f, Output::overwrite, ctx);
    const double s = timer.seconds([&] { path = gemm(qa, qb, c.data(), N, 1.0f, Output::overwrite, ctx); }, W, I);
    const double t = flops / s * 1e-12;
    const bool emulated = path == GemmPath::emulated_bf16;
    grows.push_back({"NVFP4 x NVFP4, " + std::string(emulated ? "emulated, dequantize included" : "native"), t,
                     t / bf16_tflops,
                     std::string(to_string(path)) + (emulated ? "; " + verdict(t / bf16_tflops, 0.75) : "")});
    if (emulated) {
      // The emulation's GEMM alone, on operands decoded beforehand (quantize and decode excluded).
      DeviceBuffer<uint16_t> a16(static_cast<size_t>(M * K), ctx.stream()), b16(static_cast<size_t>(N * K), ctx.stream());
      dequantize_block_scaled_bf16(qa, a16.data(), ctx);
      dequantize_block_scaled_bf16(qb, b16.data(), ctx);
      const std::vector<float> ga = qa.globals.download(), gb = qb.globals.download();
      const float alpha = ga[1] * gb[1];
      const double s2 = timer.seconds(
          [&] {
            gemm_bf16(Trans::no, Trans::yes, M, N, K, alpha, a16.data(), K, b16.data(), K, 0.0f, c.data(), N, ctx);
          },
          W, I);
      const double t2 = flops / s2 * 1e-12;
      grows.push_back({"NVFP4 x NVFP4, emulated, operands pre-decoded", t2, t2 / bf16_tflops, verdict(t2 / bf16_tflops, 0.85)});
    }
  }
  {
    const DeviceQuantized qa = quantize(a.data(), M, K, fp8, ctx, fast), qb = quantize(b.data(), N, K, fp8, ctx, fast);
    GemmPath path = gemm(qa, qb, c.data(), N, 1.0f, Output::overwrite, ctx);
    const double s = timer.seconds([&] { path = gemm(qa, qb, c.data(), N, 1.0f, Output::overwrite, ctx); }, W, I);
    grows.push_back({"FP8 E4M3 x E4M3 -> FP32", flops / s * 1e-12, flops / s * 1e-12 / bf16_tflops,
                     std::string(to_string(path))});
  }
  std::snprintf(title, sizeof title, "GEMM C[%lld,%lld] = A[%lld,%lld] . B[%lld,%lld]^T, FP32 out (quantize excluded)",
                static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(M),
                static_cast<long long>(K), static_cast<long long>(N), static_cast<long long>(K));
  print_table(title, "TFLOP/s", "x BF16", grows);
  return 0;
}

}  // namespace

int run_cuda_gemm_bench(const CudaBenchOptions& options) {
  if (options.m <= 0 || options.n <= 0 || options.k <= 0 || options.k % 32 != 0 || options.quant_cols % 32 != 0 ||
      options.quant_rows % 16 != 0 || options.iterations <= 0 || options.warmup < 0) {
    std::fprintf(stderr, "nibble: error: bench sizes must be positive, K and the quantized width multiples of 32, "
                         "the quantized height a multiple of 16\n");
    return 2;
  }
  return run_on_device([&] { return run(options); });
}

}  // namespace nibble::cuda
