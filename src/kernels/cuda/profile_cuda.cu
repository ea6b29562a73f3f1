// The per-kernel-kind profile of profile_cuda.h. Every figure is measured in this run with CUDA
// events on the context's stream; each kind runs alone (warm-up call first) on random inputs of its
// shape in the step. The quantizations take the CUDA backend's options (deferred finite check, the
// BF16 operand written on GPUs without FP4 tensor cores), so the GEMM rows are what a step runs.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/bench_kernels.cuh"
#include "kernels/cuda/event_timer.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/layers.h"
#include "kernels/cuda/profile_cuda.h"

namespace nibble::cuda {
namespace {

DeviceBuffer<float> random_floats(int64_t n, uint64_t seed, Context& ctx) {
  DeviceBuffer<float> x(static_cast<size_t>(n), ctx.stream());
  NIBBLE_LAUNCH(1024, 256, 0, ctx.stream(), bench_kernels::fill_random_kernel)(x.data(), n, seed);
  NIBBLE_CUDA_CHECK_LAUNCH();
  return x;
}
DeviceBuffer<int32_t> tokens_below(int64_t n, int64_t vocab, Context& ctx) {
  std::vector<int32_t> host(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) host[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919) % vocab);
  return DeviceBuffer<int32_t>::from_host(host, ctx.stream());
}

struct Row {
  std::string kind, shape;
  double per_step;  // calls of this shape in a step (0: not fixed by this shape alone)
  double seconds;   // per call
};

class Profile {
 public:
  Profile(Context& ctx, double budget) : timer_(ctx), budget_(budget) {}
  // One untimed call, one timed to size the repetitions (about `budget` seconds, 1 to 20), then those.
  void time(const std::string& kind, const std::string& shape, double per_step, const std::function<void()>& body) {
    const double once = timer_.seconds(body, 1, 1);
    const int reps = std::clamp(static_cast<int>(budget_ / std::max(once, 1e-6)), 1, 20);
    rows_.push_back({kind, shape, per_step, timer_.seconds(body, 0, reps)});
  }
  void print(const char* title) {
    std::printf("\n%s\n  %-34s %-30s %12s %9s %12s\n", title, "kernel kind", "shape", "ms per call", "per step",
                "ms per step");
    for (const Row& r : rows_) {
      if (r.per_step > 0)
        std::printf("  %-34s %-30s %12.4f %9.0f %12.3f\n", r.kind.c_str(), r.shape.c_str(), 1e3 * r.seconds, r.per_step,
                    1e3 * r.seconds * r.per_step);
      else
        std::printf("  %-34s %-30s %12.4f %9s %12s\n", r.kind.c_str(), r.shape.c_str(), 1e3 * r.seconds, "-", "-");
    }
    rows_.clear();
  }

 private:
  Timer timer_;
  double budget_;
  std::vector<Row> rows_;
};

std::string dims(std::initializer_list<int64_t> d) {
  std::string s = "[";
  for (int64_t v : d) s += (s.size() > 1 ? ", " : "") + std::to_string(v);
  return s + "]";
}

// The linears: each fprop GEMM shape [tokens, out, in] as NVFP4 (native or emulated) and as BF16,
// and the quantizations of its operands (X row-wise; dY as the wgrad pair: rows RN, columns RHT+SR).
void profile_linears(const ProfileOptions& o, Profile& p, Context& ctx) {
  const int64_t n = o.batch * o.context, d = o.width, f = o.hidden;
  const int64_t linears[4][2] = {{d, 3 * d}, {d, d}, {d, 2 * f}, {f, d}};  // (in, out); MHA: qkv = 3 d
  KernelOptions backend;  // the CUDA backend's choices (ops/cuda_backend.cpp)
  backend.defer_finite_check = true;
  backend.write_bf16_operand = !has_native_nvfp4_gemm(ctx.device().cc_major, ctx.device().cc_minor);
  QuantOptions rows, wgrad;
  wgrad.rht = true;
  wgrad.rounding = Rounding::stochastic;
  for (const auto& [in, out] : linears) {
    const DeviceBuffer<float> x = random_floats(n * in, 1, ctx), w = random_floats(out * in, 2, ctx),
                              dy = random_floats(n * out, 3, ctx);
    DeviceBuffer<float> y(static_cast<size_t>(n * out), ctx.stream());
    p.time("quantize X (amax, cast)", dims({n, in}), 0, [&] { (void)quantize(x.data(), n, in, rows, ctx, backend); });
    p.time("quantize dY, dY^T (wgrad pair)", dims({n, out}), 0,
           [&] { (void)quantize_both(dy.data(), n, out, rows, wgrad, ctx, backend); });
    const DeviceQuantized xq = quantize(x.data(), n, in, rows, ctx, backend), wq = quantize(w.data(), out, in, rows, ctx, backend);
    p.time(std::string("GEMM NVFP4 (") + (backend.write_bf16_operand ? "emulated" : "native") + ")",
           dims({n, out, in}), 3 * o.layers, [&] { (void)gemm(xq, wq, y.data(), out, 1.0f, Output::overwrite, ctx); });
    DeviceBuffer<uint16_t> x16(static_cast<size_t>(n * in), ctx.stream()), w16(static_cast<size_t>(out * in), ctx.stream());
    round_to_bf16(x.data(), x16.data(), n * in, ctx);
    round_to_bf16(w.data(), w16.data(), out * in, ctx);
    p.time("GEMM BF16", dims({n, out, in}), 3 * o.layers, [&] {
      gemm_bf16(Trans::no, Trans::yes, n, out, in, 1.0f, x16.data(), in, w16.data(), in, 0.0f, y.data(), out, ctx);
    });
  }
  throw_deferred_nonfinite(ctx);  // random inputs are finite; a non-finite one is a bug to report
}

// The per-token layers, the LM head and the loss, the embedding, the norm and AdamW.
void profile_layers(const ProfileOptions& o, Profile& p, Context& ctx) {
  const int64_t n = o.batch * o.context, d = o.width, f = o.hidden, v = o.vocab, hd = d / o.heads;
  const DeviceBuffer<float> x = random_floats(n * d, 4, ctx), gain = random_floats(d, 5, ctx),
                            dy = random_floats(n * d, 6, ctx), gate_up = random_floats(n * 2 * f, 7, ctx),
                            da = random_floats(n * f, 8, ctx), table = random_floats(v * d, 9, ctx),
                            logits = random_floats(n * v, 10, ctx), trig = random_floats(o.context * hd / 2, 11, ctx);
  DeviceBuffer<float> y(static_cast<size_t>(n * d), ctx.stream()), rstd(static_cast<size_t>(n), ctx.stream()),
      dx(static_cast<size_t>(n * d), ctx.stream()), dgain(static_cast<size_t>(d), ctx.stream()),
      qkv = random_floats(n * 3 * d, 12, ctx), a(static_cast<size_t>(n * f), ctx.stream()),
      dgate_up(static_cast<size_t>(n * 2 * f), ctx.stream()), loss(static_cast<size_t>(n), ctx.stream()),
      dlogits(static_cast<size_t>(n * v), ctx.stream()), dtable(static_cast<size_t>(v * d), ctx.stream()),
      row_stats(static_cast<size_t>(2 * n), ctx.stream());
  const DeviceBuffer<int32_t> tokens = tokens_below(n, v, ctx);
  const double norms = 2 * o.layers + 1;
  p.time("RMSNorm forward", dims({n, d}), norms, [&] { rmsnorm_forward(x.data(), gain.data(), n, d, 1e-5f, y.data(), rstd.data(), ctx); });
  p.time("RMSNorm backward", dims({n, d}), norms,
         [&] { rmsnorm_backward(x.data(), gain.data(), rstd.data(), dy.data(), n, d, dx.data(), dgain.data(), ctx); });
  p.time("RoPE (q and k)", dims({n, 2 * o.heads, hd}), 2 * o.layers, [&] {
    rope(qkv.data(), n, o.context, 3 * d, 0, 2 * o.heads, hd, trig.data(), trig.data(), 0, 1.0f, ctx);
  });
  p.time("SwiGLU forward", dims({n, f}), o.layers, [&] { swiglu_forward(gate_up.data(), n, f, a.data(), ctx); });
  p.time("SwiGLU backward", dims({n, f}), o.layers,
         [&] { swiglu_backward(gate_up.data(), da.data(), n, f, dgate_up.data(), ctx); });
  p.time("LM head GEMM (FP32)", dims({n, v, d}), 3, [&] {
    gemm_f32(Trans::no, Trans::yes, n, v, d, 1.0f, x.data(), d, table.data(), d, 0.0f, dlogits.data(), v, ctx);
  });
  // As training runs them: the forward keeps each row's max and 1 / sum, the backward reads them.
  p.time("cross-entropy forward (reads the loss)", dims({n, v}), 1,
         [&] { (void)cross_entropy_forward(logits.data(), tokens.data(), n, v, loss.data(), ctx, row_stats.data()); });
  p.time("cross-entropy backward", dims({n, v}), 1, [&] {
    cross_entropy_backward_kept(logits.data(), tokens.data(), n, v, 1.0f / static_cast<float>(n), row_stats.data(),
                                dlogits.data(), ctx);
  });
  p.time("embedding forward", dims({n, d}), 1, [&] { embedding_forward(tokens.data(), n, table.data(), d, y.data(), ctx); });
  p.time("embedding backward", dims({n, d}), 1, [&] { embedding_backward(tokens.data(), n, dy.data(), d, dtable.data(), ctx); });
  const int64_t params = o.params > 0 ? o.params : o.layers * (d * 3 * d + d * d + 3 * d * f + 2 * d) + v * d + d;
  const DeviceBuffer<float> g = random_floats(params, 13, ctx);
  DeviceBuffer<float> m(static_cast<size_t>(params), ctx.stream()), vv(static_cast<size_t>(params), ctx.stream()),
      w = random_floats(params, 14, ctx);
  m.fill_zero();
  vv.fill_zero();
  DeviceBuffer<uint8_t> decay(static_cast<size_t>(params), ctx.stream());
  decay.fill_zero();
  p.time("gradient norm (reads it)", dims({params}), 1, [&] { (void)sum_of_squares(g.data(), params, ctx); });
  const AdamWArgs args{1.0f, 0.9f, 0.95f, 0.1f, 0.05f, 0.1f, 1e-4f, 1e-8f};
  p.time("AdamW", dims({params}), 1, [&] { adamw_update(args, g.data(), m.data(), vv.data(), w.data(), decay.data(), params, ctx); });
}

// Attention forward and backward at each context length, batch * context tokens held at the bench's;
// FP32 attention (recipe none) at the model's context.
void profile_attention(const ProfileOptions& o, Profile& p, Context& ctx) {
  const int64_t tokens = o.batch * o.context, hd = o.width / o.heads;
  std::vector<std::pair<int64_t, bool>> runs;
  for (int64_t context : o.attention_contexts) runs.push_back({context, true});
  runs.push_back({o.context, false});
  for (const auto& [context, bf16] : runs) {
    AttentionShape s;
    s.batch = std::max<int64_t>(1, tokens / context);
    s.seq = context;
    s.heads = s.kv_heads = o.heads;
    s.head_dim = hd;
    s.bf16_matmuls = bf16;
    const int64_t n = s.batch * s.seq;
    const DeviceBuffer<float> qkv = random_floats(n * s.qkv_stride(), 15, ctx), dout = random_floats(n * s.out_width(), 16, ctx);
    DeviceBuffer<float> out(static_cast<size_t>(n * s.out_width()), ctx.stream()),
        stats(static_cast<size_t>(s.softmax_stats_size()), ctx.stream()), dqkv(static_cast<size_t>(n * s.qkv_stride()), ctx.stream());
    const std::string shape = "batch " + std::to_string(s.batch) + " x context " + std::to_string(context);
    const double per_step = context == o.context ? o.layers : 0;
    const std::string kind = bf16 ? "attention" : "attention FP32";
    p.time(kind + " forward", shape, per_step, [&] { attention_forward(s, qkv.data(), out.data(), stats.data(), ctx); });
    // As training runs it: given the forward's O where the backward takes it (the tiled kernels).
    const float* kept = attention_backward_takes_output(s, ctx) ? out.data() : nullptr;
    p.time(kind + " backward", shape, per_step,
           [&] { attention_backward(s, qkv.data(), stats.data(), dout.data(), dqkv.data(), ctx, kept); });
  }
}

int run(const ProfileOptions& o) {
  Context ctx(o.device);
  const DeviceInfo& dev = ctx.device();
  std::printf("nibble CUDA profile on %s (sm_%d, %d SMs): CUDA-event time per call of each kernel kind, run alone;\n"
              "shape: %lld blocks x width %lld, %lld heads, hidden %lld, context %lld, batch %lld, vocab %lld\n",
              dev.name.c_str(), dev.compute_capability(), dev.sm_count, static_cast<long long>(o.layers),
              static_cast<long long>(o.width), static_cast<long long>(o.heads), static_cast<long long>(o.hidden),
              static_cast<long long>(o.context), static_cast<long long>(o.batch), static_cast<long long>(o.vocab));
  Profile p(ctx, o.seconds_per_kind);
  profile_linears(o, p, ctx);
  p.print("linears (GEMM shapes [tokens, out, in]; 'per step': fprop, dgrad and wgrad counted at the fprop time)");
  profile_layers(o, p, ctx);
  p.print("layers, loss, embedding, optimizer");
  profile_attention(o, p, ctx);
  p.print("attention (tokens per call fixed at the bench's; 'per step' at the bench's context)");
  return 0;
}

}  // namespace

int run_cuda_profile(const ProfileOptions& o) {
  if (o.layers <= 0 || o.width <= 0 || o.heads <= 0 || o.width % o.heads != 0 || o.width % 32 != 0 || o.hidden % 16 != 0 ||
      o.context <= 0 || o.batch <= 0 || o.vocab <= 0 || (o.batch * o.context) % 16 != 0 || o.seconds_per_kind <= 0) {
    std::fprintf(stderr, "nibble: error: profile shape: width a multiple of 32 and of heads, hidden a multiple of 16, "
                         "batch x context a multiple of 16, every size positive\n");
    return 2;
  }
  return run_on_device([&] { return run(o); });
}

}  // namespace nibble::cuda
