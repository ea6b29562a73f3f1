#include "bench/gpu_step_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "format/quantized_tensor.h"
#include "ops/backend.h"

namespace nibble::bench {

namespace {

// Sustained rates, not datasheet peaks: H200 SXM (Hopper, 132 SMs at 1.98 GHz boost, 4.8 TB/s HBM3e,
// 989 TFLOP/s dense BF16 on the datasheet) at what large cuBLAS GEMMs and streaming kernels reach
// (~80 %, ~90 %); B200 (148 SMs, 8 TB/s, 2.25 PFLOP/s dense BF16, 9 PFLOP/s dense NVFP4) likewise.
// Flash attention reaches ~50 % of the BF16 peak forward and ~40 % backward at head dims 64-128
// (FlashAttention-2/3 on Hopper). A launch back to back costs ~4 us, a synchronisation ~15 us.
const GpuSpec kGpus[] = {
    {"h200", 790e12, 2 * 132 * 128 * 1.98e9, 0, 4.3e12, 132, 1.98e9, 4e-6, 15e-6, 0.5, 0.4},
    {"b200", 1800e12, 2 * 148 * 128 * 1.96e9, 7200e12, 7.2e12, 148, 1.96e9, 4e-6, 15e-6, 0.5, 0.4},
};

// A kernel that gives each of `threads` threads a serial chain of `steps` dependent steps (a load,
// then an FMA on it) in blocks of 256: it occupies ceil(threads / 256) SMs at most, and an SM issues
// at most 128 lanes a cycle and one step per warp every ~32 cycles (an L1 hit's latency, hidden only
// by 32 or more warps, which these kernels' few threads never give it).
double threaded_s(double threads, double steps, const GpuSpec& g) {
  if (threads <= 0) return 0;
  const double sms = std::min<double>(g.sms, std::ceil(threads / 256));
  const double warps = std::min(64.0, std::ceil(threads / 32) / sms);
  const double lanes = std::min(128.0, 32.0 * warps / 32.0);
  return threads * steps / (sms * lanes * g.clock_hz);
}

// A serial chain of `steps` dependent FP32 adds (~4 cycles each: Hopper's add latency), run by
// `chains` warps side by side, one warp per SM at a time (a bound): RMSNorm's gain gradient adds
// each column's 256-token tiles in token order, a warp per (tile, 32 columns), then the tiles' sums.
double serial_chain_s(double chains, double steps, const GpuSpec& g) {
  if (chains <= 0) return 0;
  return std::ceil(chains / g.sms) * steps * 4.0 / g.clock_hz;
}

// `warp_steps` warp instructions' worth of small steps (a load of 32 tokens, a compare, a ballot:
// ~8 issue slots each) spread over every SM's 4 schedulers: the embedding backward's token scans.
double warp_steps_s(double warp_steps, const GpuSpec& g) { return warp_steps * 8.0 / (g.sms * 4.0 * g.clock_hz); }

class Builder {
 public:
  explicit Builder(const GpuSpec& g) : g_(g) {}

  // A kind whose work fills the GPU: `flops` on a unit of `rate` FLOP/s and `bytes` through HBM,
  // by design and as written; PyTorch's twin takes `torch_flops_rate` for the same FLOPs (0: the kind
  // does not exist there).
  KernelKindTime& add(const std::string& kind, const std::string& unit, double launches, double flops, double rate,
                      double bytes, double torch_rate = -1) {
    KernelKindTime k;
    k.kind = kind;
    k.unit = unit;
    k.launches = launches;
    k.flops = flops;
    k.bytes = bytes;
    k.design_s = roofline(launches, flops, rate, bytes);
    k.written_s = k.design_s;
    k.torch_s = torch_rate == 0 ? 0 : roofline(launches, flops, torch_rate < 0 ? rate : torch_rate, bytes);
    kinds_.push_back(k);
    return kinds_.back();
  }
  // As written, one thread per row / column / chunk: the threaded time where it exceeds the roofline.
  static void written_threads(KernelKindTime& k, double threads, double fmas, const GpuSpec& g, const std::string& note) {
    k.written_s = std::max(k.written_s, threaded_s(threads, fmas, g));
    k.written_note = note;
  }
  double roofline(double launches, double flops, double rate, double bytes) const {
    return std::max({rate > 0 ? flops / rate : 0.0, bytes / g_.bandwidth, launches * g_.launch_s});
  }
  std::vector<KernelKindTime> take() { return std::move(kinds_); }

 private:
  const GpuSpec& g_;
  std::vector<KernelKindTime> kinds_;
};

struct Shapes {
  double N, d, H, kv, hd, f, V, L, S, B, qkv, params;
};

Shapes shapes_of(const model::ModelConfig& m, int64_t batch, int64_t seq) {
  Shapes s{};
  s.B = static_cast<double>(batch), s.S = static_cast<double>(seq), s.N = s.B * s.S;
  s.d = static_cast<double>(m.width), s.H = static_cast<double>(m.heads), s.kv = static_cast<double>(m.kv_head_count());
  s.hd = static_cast<double>(m.head_dim()), s.f = static_cast<double>(m.hidden()), s.V = static_cast<double>(m.vocab);
  s.L = static_cast<double>(m.layers), s.qkv = (s.H + 2 * s.kv) * s.hd;
  s.params = s.L * (s.d * s.qkv + s.H * s.hd * s.d + 3 * s.d * s.f + 2 * s.d) + s.V * s.d + s.d +
             (m.tied_embeddings ? 0 : s.V * s.d);
  return s;
}

// The linears' GEMMs, their operands' quantization (as written: an amax pass whose last block folds
// the non-finite check into a flag read once per step, then a cast pass that on Hopper also writes
// the emulated GEMM's BF16 operand, which dgrad's 16x16-tile weight takes transposed along with its
// codes; by design one fused pass), and the BF16 rounding of a BF16 GEMM's operands.
void add_linears(Builder& b, const Shapes& s, const Recipe& recipe, const GpuSpec& g, double& syncs) {
  const double in_out[4][2] = {{s.d, s.qkv}, {s.H * s.hd, s.d}, {s.d, 2 * s.f}, {s.f, s.d}};
  double gemm_flops = 0, gemm_s = 0, torch_s = 0, gemm_bytes = 0, launches = 0;
  double q_elems = 0, q_stored = 0, q_calls = 0, dq_elems = 0, round_elems = 0;
  double bf16_written = 0, bf16_transposed = 0, transposes = 0;  // as written: by the cast pass, by the tile transpose
  for (int l = 0; l < static_cast<int>(s.L); ++l)
    for (int i = 0; i < 4; ++i) {
      const LinearRecipe r = recipe.for_linear(l, i, 0.0);
      const double in = in_out[i][0], out = in_out[i][1];
      // (M, N, K) and the element counts of operands a, b per role: fprop X.W^T, dgrad dY.W, wgrad dY^T.X.
      const double mnk[3][3] = {{s.N, out, in}, {s.N, in, out}, {out, in, s.N}};
      for (int role = 0; role < 3; ++role) {
        const GemmRecipe& gr = r[kGemmRoles[role]];
        const double M = mnk[role][0], Nn = mnk[role][1], K = mnk[role][2];
        const double flops = 2 * M * Nn * K, a = M * K, bb = Nn * K;
        const bool native = gr.precision == GemmPrecision::quantized && gr.a.format == Format::nvfp4 && g.nvfp4_flops > 0;
        const double rate = gr.precision == GemmPrecision::fp32 ? g.fp32_flops : native ? g.nvfp4_flops : g.bf16_flops;
        double op_bytes = 2 * (a + bb);
        if (gr.precision == GemmPrecision::quantized) {
          const bool shared_w = role == 1 && r.weight_shared_by_fprop_and_dgrad();
          const double sa = stored_bytes_per_element(gr.a.format), sb = stored_bytes_per_element(gr.b.format);
          q_elems += a + (shared_w ? 0 : bb);
          q_stored += a * sa + (shared_w ? 0 : bb * sb);
          q_calls += shared_w ? 1 : 2;
          if (native) {
            op_bytes = a * sa + bb * sb;
          } else {
            dq_elems += a + bb;
            bf16_written += a + (shared_w ? 0 : bb);  // the cast pass writes what it quantized
            if (shared_w) bf16_transposed += bb, transposes += 1;
          }
        } else if (gr.precision == GemmPrecision::bf16) {
          round_elems += a + bb;
        }
        const double bytes = op_bytes + 4 * M * Nn;
        gemm_flops += flops;
        gemm_bytes += bytes;
        gemm_s += b.roofline(1, flops, rate, bytes);
        torch_s += b.roofline(1, flops, g.bf16_flops, 2 * (a + bb) + 2 * M * Nn);
        launches += 1;
      }
    }
  KernelKindTime& gemms = b.add("linear GEMMs", "tensor cores", launches, gemm_flops, 0, gemm_bytes);
  gemms.design_s = gemms.written_s = gemm_s;
  gemms.torch_s = torch_s;
  if (q_calls > 0) {
    // By design one pass reads FP32 and writes codes + scales, and on a GPU without NVFP4 tensor
    // cores also the BF16 operand the emulated GEMM multiplies (so no dequantize pass); as written an
    // amax pass reads the tensor first (its last block folds the flag), then the cast pass writes
    // codes, scales and the BF16 operand.
    KernelKindTime& q = b.add("quantize (amax, cast)", "HBM", q_calls, 0, 0, q_elems * 4 + q_stored + 2 * dq_elems, 0);
    q.written_s = b.roofline(2 * q_calls, 0, 0, q_elems * 8 + q_stored + 2 * bf16_written);
    q.written_note = bf16_written > 0 ? "an amax pass, then a cast writing the BF16 operand too" : "an amax pass before each cast";
    syncs += 2;  // the deferred non-finite flag, read after the loss and after the norm
  }
  if (bf16_transposed > 0) {  // the codes' transpose was there before; its BF16 operand's is new
    KernelKindTime& t = b.add("transpose tile weight's BF16 operand", "HBM", transposes, 0, 0, 4 * bf16_transposed, 0);
    t.design_s = 0;
    t.written_note = "dgrad's 16x16-tile weight; by design the transpose writes it with the codes";
  }
  if (round_elems > 0) b.add("round operands to BF16", "HBM", 1, 0, 0, 6 * round_elems, 0);
}

// Attention's causal products: by design flash attention on BF16 tensor cores, two products forward
// and four backward. As written (kernels/cuda/flash_attention.cuh), where the recipe keeps attention
// in BF16 and head_dim is 32 or 64: the same tiles and instruction (mma.sync m16n8k16) as
// FlashAttention-2, whose Hopper efficiency the design assumes, so that efficiency is kept; what
// differs is the work: backward runs seven products (the dK/dV and dQ passes each recompute S and
// dP; the D pre-pass reads the O that training keeps) in three launches per block. The FP32 K/V tiles that each query
// tile reads again stay in L2 at these shapes, so HBM bytes are the design's. Otherwise (FP32
// attention, other head dims) one thread per query row, then per key row, on the FP32 cores (at
// head_dim 32/64 over tiles staged in shared memory; the model counts them as the plain per-row ones).
void add_attention(Builder& b, const Shapes& s, const Recipe& recipe, const GpuSpec& g) {
  const double product = 2 * s.B * s.H * (s.S * s.S / 2) * s.hd * s.L;  // one causal product's FLOPs, every block
  const double io = 4 * s.N * (s.qkv + s.H * s.hd) * s.L;
  const double fwd_rate = g.bf16_flops * g.attention_fwd_efficiency, bwd_rate = g.bf16_flops * g.attention_bwd_efficiency;
  const bool tiled = recipe.attention_bf16() && (s.hd == 32 || s.hd == 64);
  KernelKindTime& fwd = b.add("attention forward", "BF16 tensor cores", s.L, 2 * product, fwd_rate, io);
  if (!tiled) Builder::written_threads(fwd, s.B * s.H * s.S, s.L * s.S / 2 * s.hd * 2, g, "a thread per query row, FP32 cores");
  // (b.add may move the kinds: fwd is not used past here)
  KernelKindTime& bwd = b.add("attention backward", "BF16 tensor cores", 2 * s.L, 4 * product, bwd_rate, 2 * io);
  if (tiled) {
    bwd.written_s = b.roofline(3 * s.L, 7 * product, bwd_rate, 2 * io);
    bwd.written_note = "tiled mma.sync; 7 products (S and dP in both passes)";
    return;
  }
  bwd.written_s = std::max(bwd.written_s, threaded_s(s.B * s.H * s.S, s.L * s.S / 2 * s.hd * 3, g) +
                                              threaded_s(s.B * s.kv * s.S, s.L * s.S / 2 * s.hd * 4 * (s.H / s.kv), g));
  bwd.written_note = "a thread per query row, then per key row";
}

// The LM head (FP32 unless the precision map says bf16), the loss, the embedding.
void add_head_and_loss(Builder& b, const Shapes& s, const Recipe& recipe, const GpuSpec& g) {
  const double rate = recipe.lm_head_bf16() ? g.bf16_flops : g.fp32_flops;
  b.add("LM head GEMMs", recipe.lm_head_bf16() ? "BF16 tensor cores" : "FP32 cores", 3, 3 * 2 * s.N * s.d * s.V, rate,
        3 * 4 * s.N * s.V + 3 * 4 * s.N * s.d, g.bf16_flops);
  // By design one read forward (online max and sum), a read and a write backward; as written the
  // forward reads each row twice (its max, then its sum) and keeps both for the backward's one pass.
  KernelKindTime& ce = b.add("cross-entropy", "HBM", 2, 0, 0, 12 * s.N * s.V);
  Builder::written_threads(ce, 16 * s.N, 6 * s.V / 16, g, "forward: a half-warp per row; backward: one pass from the kept row stats");
  ce.written_s = std::max(ce.written_s, 16 * s.N * s.V / g.bandwidth);
  // Backward: a warp per position scans the earlier tokens (N / 64 windows on average) to find whether
  // it is its token's first; each distinct token's warp then scans the rest (N / 32 windows).
  KernelKindTime& emb = b.add("embedding", "HBM", 2, 0, 0, 12 * s.N * s.d + 4 * s.V * s.d);
  emb.written_s = std::max(emb.written_s, warp_steps_s(s.N * s.N / 64 + std::min(s.V, s.N) * s.N / 32, g));
  emb.written_note = "backward: a warp per distinct token, found by ballots";
}

// RMSNorm, RoPE, residual adds, SwiGLU: FP32 in and out.
void add_elementwise(Builder& b, const Shapes& s, const GpuSpec& g) {
  KernelKindTime& nf = b.add("RMSNorm forward", "HBM", 2 * s.L + 1, 0, 0, (2 * s.L + 1) * 8 * s.N * s.d);
  Builder::written_threads(nf, 16 * s.N, 2 * s.d / 16 * (2 * s.L + 1), g, "a half-warp per row");
  KernelKindTime& nb = b.add("RMSNorm backward", "HBM", 3 * (2 * s.L + 1), 0, 0, (2 * s.L + 1) * 20 * s.N * s.d);
  const double tiles = std::ceil(s.N / static_cast<double>(ops::kGainTileTokens));
  nb.written_s = std::max(nb.written_s, threaded_s(16 * s.N, 3 * s.d / 16 * (2 * s.L + 1), g) +
                                            (2 * s.L + 1) * (serial_chain_s(tiles * std::ceil(s.d / 32), ops::kGainTileTokens, g) +
                                                             serial_chain_s(std::ceil(s.d / 32), tiles, g)));
  nb.written_note = "gain gradient: a warp per 256-token tile and 32 columns, then the tiles in order";
  b.add("RoPE", "HBM", 4 * s.L, 0, 0, 2 * s.L * 8 * s.N * (s.H + s.kv) * s.hd);
  b.add("residual adds", "HBM", 2 * s.L, 0, 0, 2 * s.L * 12 * s.N * s.d);
  b.add("SwiGLU", "HBM", 2 * s.L, 0, 0, s.L * 32 * s.N * s.f);
}

// Gradient norm (for clipping) and AdamW over every parameter, gradients zeroed.
void add_optimizer(Builder& b, const Shapes& s, const GpuSpec& g, double& syncs) {
  KernelKindTime& norm = b.add("gradient norm", "HBM", 1, 0, 0, 4 * s.params);
  // A warp per 16384-value chunk: its 8 double lanes each a chain of 2048 adds.
  Builder::written_threads(norm, 32 * std::ceil(s.params / 16384), 16384 / 8, g, "a warp per 16384-value chunk");
  syncs += 2;  // the norm and the loss are read on the host
  b.add("AdamW, zero gradients", "HBM", 2, 0, 0, 33 * s.params);
}

}  // namespace

const GpuSpec& gpu_spec(std::string_view name) {
  for (const GpuSpec& g : kGpus)
    if (g.name == name) return g;
  throw UsageError("--gpu " + std::string(name) + " is not modelled: use " + gpu_names());
}

std::string gpu_names() {
  std::string s;
  for (const GpuSpec& g : kGpus) s += (s.empty() ? "" : ", ") + g.name;
  return s;
}

StepPrediction predict_step(const model::ModelConfig& m, const Recipe& recipe, int64_t batch, int64_t seq,
                            const GpuSpec& gpu) {
  const Shapes s = shapes_of(m, batch, seq);
  Builder b(gpu);
  StepPrediction p;
  add_linears(b, s, recipe, gpu, p.syncs);
  add_attention(b, s, recipe, gpu);
  add_head_and_loss(b, s, recipe, gpu);
  add_elementwise(b, s, gpu);
  add_optimizer(b, s, gpu, p.syncs);
  p.kinds = b.take();
  for (const KernelKindTime& k : p.kinds) {
    p.design_s += k.design_s;
    p.written_s += k.written_s;
    p.torch_s += k.torch_s;
  }
  p.written_s += p.syncs * gpu.sync_s;
  p.tokens = batch * seq;
  return p;
}

std::string prediction_table(const std::string& recipe_name, const StepPrediction& p, const GpuSpec& gpu) {
  std::string t = fmt::format("{} on {} ({}):\n  {:<36} {:>8} {:>10} {:>10}  {:>10} {:>11} {:>10}\n", recipe_name,
                              gpu.name, gpu.nvfp4_flops > 0 ? "NVFP4 GEMMs native" : "NVFP4 GEMMs emulated in BF16",
                              "kernel kind", "launches", "GFLOP", "MB", "design ms", "written ms", "torch ms");
  for (const KernelKindTime& k : p.kinds)
    t += fmt::format("  {:<36} {:>8.0f} {:>10.2f} {:>10.1f}  {:>10.3f} {:>11.3f} {:>10.3f}{}\n", k.kind, k.launches,
                     k.flops / 1e9, k.bytes / 1e6, 1e3 * k.design_s, 1e3 * k.written_s, 1e3 * k.torch_s,
                     k.written_note.empty() ? "" : "  (as written: " + k.written_note + ")");
  t += fmt::format("  {:<36} {:>8.0f} {:>10} {:>10}  {:>10} {:>11.3f} {:>10}\n", "host synchronisations", p.syncs, "", "", "",
                   1e3 * p.syncs * gpu.sync_s, "");
  const double tokens = static_cast<double>(p.tokens);
  t += fmt::format("  step: design {:.3f} ms ({:.0f} tokens/s, {:.2f}x PyTorch BF16), as written {:.3f} ms ({:.0f} "
                   "tokens/s, {:.2f}x); PyTorch BF16 (SDPA) {:.3f} ms ({:.0f} tokens/s)\n",
                   1e3 * p.design_s, tokens / p.design_s, p.torch_s / p.design_s, 1e3 * p.written_s,
                   tokens / p.written_s, p.torch_s / p.written_s, 1e3 * p.torch_s, tokens / p.torch_s);
  return t;
}

}  // namespace nibble::bench
