// Every nibble CUDA kernel executed on the host under the CUDA model (emulated/cuda_model/): the
// production source of layers.cu, quantize.cu (with nvfp4_kernels.cuh), bench_kernels.cuh and
// gemm_kernels.cuh, compiled with g++ against a model of threads, blocks, shared memory, barriers
// and warp operations, checked against the CPU kernels and the scalar reference. Each layer runs
// under several schedules (the model's seed: block order and thread interleaving between barriers;
// the device's SM count: grid sizes, hence how often the grid-stride loops turn) and must give the
// same bits under each. test_cuda_quantize.cpp's GPU tests run in this binary too (under the model).
// First, the model's own semantics: each violation it must report is provoked once.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

#include "format/codecs.h"
#include "format/quantize.h"
#include "kernels/cpu/common/cpu_features.h"
#include "kernels/cpu/layers/adamw.h"
#include "kernels/cpu/layers/attention.h"
#include "kernels/cpu/layers/cross_entropy.h"
#include "kernels/cpu/layers/embedding.h"
#include "kernels/cpu/layers/rmsnorm.h"
#include "kernels/cpu/layers/rope.h"
#include "kernels/cpu/layers/swiglu.h"
#include "kernels/cuda/bench_kernels.cuh"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/layers.h"
#include "kernels/cuda/quantize.h"
#include "support/check.h"
#include "support/random.h"

// gemm_kernels.cuh's kernel, defined in gemm.cu's model build (model_gemm.cpp), launched directly below.
namespace nibble::cuda::gemm_kernels {
__global__ void fold_alpha_kernel(const float* globals_a, const float* globals_b, float alpha, float beta,
                                  float* alpha_beta);
}

using namespace nibble;
using nibble_test::normal_floats;
using nibble_test::same_bits;

namespace {

// (seed, SM count) of each schedule a kernel runs under: one SM gives the longest grid-stride
// loops, three an odd grid.
constexpr std::pair<uint64_t, int> kSchedules[] = {{1, 1}, {2, 3}, {3, 2}};

// A context on the model's device under one schedule (the context reads the SM count when made).
struct Schedule {
  explicit Schedule(std::pair<uint64_t, int> s) : seed(s.first), sm_count(s.second), ctx(apply(s)) {}
  // Sets the model's knobs before the context reads them; returns the device to open (the only one).
  static int apply(std::pair<uint64_t, int> s) {
    cuda_model::set_seed(s.first);
    cuda_model::set_sm_count(s.second);
    return 0;
  }
  uint64_t seed;
  int sm_count;
  cuda::Context ctx;
  template <class T>
  cuda::DeviceBuffer<T> up(const std::vector<T>& host) {
    return cuda::DeviceBuffer<T>::from_host(host, ctx.stream());
  }
  template <class T>
  cuda::DeviceBuffer<T> fresh(size_t n) {  // unwritten: NaN / 0xFF bytes until a kernel writes it
    return cuda::DeviceBuffer<T>(n, ctx.stream());
  }
  std::string name() const { return "seed " + std::to_string(seed) + ", " + std::to_string(sm_count) + " SMs"; }
};

// ------------------------------------------------------------------ the model itself -------------

__global__ void reverse_within_block(const float* x, float* y, int use_barrier) {
  __shared__ float tile[256];
  const int t = static_cast<int>(threadIdx.x);
  const int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x;
  tile[t] = x[base + t];
  if (use_barrier) __syncthreads();
  y[base + t] = tile[blockDim.x - 1 - t];
}

TEST(CudaModel, SharedMemoryWithABarrierIsExactAndWithoutOneRaces) {
  const auto x = normal_floats(4 * 256, 1);
  std::vector<float> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = x[i / 256 * 256 + 255 - i % 256];
  for (const auto& s : kSchedules) {
    Schedule sc(s);
    auto dx = sc.up(x);
    auto dy = sc.fresh<float>(x.size());
    NIBBLE_LAUNCH(4, 256, 0, sc.ctx.stream(), reverse_within_block)(dx.data(), dy.data(), 1);
    EXPECT_TRUE(same_bits(dy.download(), want)) << sc.name();
    NIBBLE_LAUNCH(4, 256, 0, sc.ctx.stream(), reverse_within_block)(dx.data(), dy.data(), 0);
    EXPECT_FALSE(same_bits(dy.download(), want)) << "a missing barrier went unnoticed, " << sc.name();
  }
}

__global__ void warp_operations(const int* in, int* out, int width) {
  const unsigned all = 0xFFFFFFFFu;
  const int t = static_cast<int>(threadIdx.x), v = in[t];
  int* o = out + 7 * t;
  o[0] = __shfl_xor_sync(all, v, 5, width);
  o[1] = __shfl_down_sync(all, v, 3, width);
  o[2] = __shfl_up_sync(all, v, 3, width);
  o[3] = __shfl_sync(all, v, 7, width);
  o[4] = static_cast<int>(__ballot_sync(all, v & 1));
  o[5] = __any_sync(all, v > 90);
  o[6] = __all_sync(all, v >= 0);
}

TEST(CudaModel, WarpShufflesAndVotesFollowTheProgrammingGuide) {
  std::vector<int> in(64);
  for (int i = 0; i < 64; ++i) in[i] = (i * 37 + 11) % 97;
  for (int width : {32, 16, 8}) {
    std::vector<int> want(64 * 7);
    for (int t = 0; t < 64; ++t) {
      const int warp = t / 32 * 32, lane = t % 32, seg = lane / width * width, in_seg = lane % width;
      const auto at = [&](int l) { return in[warp + l]; };
      unsigned ballot = 0;
      bool any = false, all = true;
      for (int l = 0; l < 32; ++l) {
        ballot |= static_cast<unsigned>(at(l) & 1) << l;
        any = any || at(l) > 90;
        all = all && at(l) >= 0;
      }
      int* w = want.data() + 7 * t;
      w[0] = at(lane ^ 5);  // 5 < width: stays in the segment
      w[1] = in_seg + 3 < width ? at(lane + 3) : at(lane);
      w[2] = in_seg >= 3 ? at(lane - 3) : at(lane);
      w[3] = at(seg + 7 % width);
      w[4] = static_cast<int>(ballot);
      w[5] = any;
      w[6] = all;
    }
    Schedule sc(kSchedules[1]);
    auto din = sc.up(in);
    auto dout = sc.fresh<int>(want.size());
    NIBBLE_LAUNCH(1, 64, 0, sc.ctx.stream(), warp_operations)(din.data(), dout.data(), width);
    EXPECT_EQ(dout.download(), want) << "width " << width;
  }
}

__global__ void shuffle_in_partial_warp(float* x) { x[threadIdx.x] = __shfl_xor_sync(0xFFFFFFFFu, x[threadIdx.x], 1); }
__global__ void shuffle_after_a_lane_exits(float* x) {
  if (threadIdx.x == 3) return;
  x[threadIdx.x] = __shfl_xor_sync(0xFFFFFFFFu, x[threadIdx.x], 1);
}
__global__ void barrier_and_shuffle_deadlock(float* x) {
  if (threadIdx.x < 16)
    __syncthreads();
  else
    x[threadIdx.x] = __shfl_xor_sync(0xFFFFFFFFu, x[threadIdx.x], 1);
}
__global__ void divergent_barriers(float* x) {
  if (threadIdx.x % 2) {
    x[threadIdx.x] = 1.0f;
    __syncthreads();
  } else {
    __syncthreads();
  }
}
__global__ void write_one_past_the_end(float* x, int64_t n) {
  if (threadIdx.x == 0) x[n] = 1.0f;
}

TEST(CudaModel, ReportsBadWarpMasksDeadlocksDivergentBarriersOutOfBoundsWritesHostPointersAndBadLaunches) {
  Schedule sc(kSchedules[0]);
  auto x = sc.up(std::vector<float>(64, 1.0f));
  const auto message = [&](auto&& launch) -> std::string {
    try {
      launch();
    } catch (const cuda_model::ModelError& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_NE(message([&] { NIBBLE_LAUNCH(1, 48, 0, sc.ctx.stream(), shuffle_in_partial_warp)(x.data()); })
                .find("does not exist"),
            std::string::npos);
  EXPECT_NE(message([&] { NIBBLE_LAUNCH(1, 32, 0, sc.ctx.stream(), shuffle_after_a_lane_exits)(x.data()); })
                .find("has exited"),
            std::string::npos);
  EXPECT_NE(message([&] { NIBBLE_LAUNCH(1, 32, 0, sc.ctx.stream(), barrier_and_shuffle_deadlock)(x.data()); })
                .find("deadlock"),
            std::string::npos);
  EXPECT_NE(message([&] { NIBBLE_LAUNCH(1, 64, 0, sc.ctx.stream(), divergent_barriers)(x.data()); })
                .find("different __syncthreads"),
            std::string::npos);
  EXPECT_NE(message([&] { NIBBLE_LAUNCH(1, 32, 0, sc.ctx.stream(), write_one_past_the_end)(x.data(), int64_t{64}); })
                .find("past the end"),
            std::string::npos);
  std::vector<float> host(64);
  EXPECT_NE(message([&] { NIBBLE_LAUNCH(1, 32, 0, sc.ctx.stream(), write_one_past_the_end)(host.data(), int64_t{0}); })
                .find("argument 1 is a pointer outside device memory"),
            std::string::npos);
  EXPECT_NE(message([&] { NIBBLE_LAUNCH(1, 32, 0, sc.ctx.stream(), reverse_within_block)(x.data(), host.data(), 1); })
                .find("argument 2 is a pointer outside device memory"),
            std::string::npos);
  // A bad configuration launches nothing and is the launch's error, as on the GPU.
  (void)cudaGetLastError();
  const uint64_t before = cuda_model::launches();
  NIBBLE_LAUNCH(1, 2048, 0, sc.ctx.stream(), write_one_past_the_end)(x.data(), int64_t{0});
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  NIBBLE_LAUNCH(dim3(1, 70000), 32, 0, sc.ctx.stream(), write_one_past_the_end)(x.data(), int64_t{0});
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cuda_model::launches(), before);
}

TEST(CudaModelDeathTest, HostCodeThatDereferencesADevicePointerIsNamed) {
  Schedule sc(kSchedules[0]);
  auto x = sc.up(std::vector<float>(8, 1.0f));
  EXPECT_EXIT({ std::printf("%f\n", static_cast<double>(x.data()[3])); }, ::testing::ExitedWithCode(3),
              "host code touched device memory");
}

// ------------------------------------------------------------------ layers.cu --------------------

TEST(CudaModelLayers, ElementwiseBf16AndTileTransposeAreExact) {
  const int64_t n = 1000 + 7;  // not a multiple of the 256-thread block
  const auto x = normal_floats(n, 2), y0 = normal_floats(n, 3);
  std::vector<float> sum(n), widened(n);
  std::vector<uint16_t> rounded(n);
  for (int64_t i = 0; i < n; ++i) {
    sum[i] = y0[i] + x[i];
    rounded[i] = bf16_from_float_rn(x[i]).bits;
    widened[i] = bf16_to_float(bf16{rounded[i]});
  }
  QuantOptions tile;
  tile.tile_16x16 = true;
  const int64_t rows = 48, cols = 80;
  const QuantizedTensor q = ref::quantize(normal_floats(rows * cols, 4), rows, cols, tile), t = ref::transpose_tiles(q);
  for (const auto& s : kSchedules) {
    Schedule sc(s);
    auto dx = sc.up(x), dy = sc.up(y0), dw = sc.fresh<float>(n);
    auto dr = sc.fresh<uint16_t>(n);
    cuda::add(dy.data(), dx.data(), n, sc.ctx);
    cuda::round_to_bf16(dx.data(), dr.data(), n, sc.ctx);
    cuda::widen_bf16(dr.data(), dw.data(), n, sc.ctx);
    EXPECT_TRUE(same_bits(dy.download(), sum)) << sc.name();
    EXPECT_EQ(dr.download(), rounded) << sc.name();
    EXPECT_TRUE(same_bits(dw.download(), widened)) << sc.name();
    auto codes = sc.up(q.codes), scales = sc.up(q.scales);
    auto tc = sc.fresh<uint8_t>(t.codes.size()), ts = sc.fresh<uint8_t>(t.scales.size());
    cuda::transpose_nvfp4_tiles(codes.data(), scales.data(), rows, cols, tc.data(), ts.data(), sc.ctx);
    EXPECT_EQ(tc.download(), t.codes) << sc.name();
    EXPECT_EQ(ts.download(), t.scales) << sc.name();
  }
}

// Shapes of the row and column kernels: n tokens of `width` over a vocabulary of `vocab`. The first
// fits one gain token tile; the second has a ragged last half-warp row group, column blocks of the
// gain (8 columns) with the last partial, and token repeats more than 32 positions apart (the
// embedding backward's ballot windows); the third three token tiles of the gain (256 tokens, the
// last partial), so both of its staging buffers are reused.
struct RowShape {
  int64_t n, width, vocab;
};
constexpr RowShape kRowShapes[] = {{37, 45, 11}, {151, 70, 40}, {600, 21, 50}};

TEST(CudaModelLayers, EmbeddingRmsnormAndRopeAreTheCpuKernelsBits) {
  for (const RowShape& shape : kRowShapes) {
  SCOPED_TRACE("n " + std::to_string(shape.n) + ", width " + std::to_string(shape.width));
  const int64_t n = shape.n, width = shape.width, vocab = shape.vocab;  // repeated tokens: the backward's order matters
  std::vector<int32_t> tokens(n);
  // quadratic in i: repeats at irregular distances, so a token recurs at every lane of a ballot window
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>((i * i * 13 + i * 7 + 3) % vocab);
  const auto table = normal_floats(vocab * width, 5), dout = normal_floats(n * width, 6);
  const auto gain = normal_floats(width, 7), dy = normal_floats(n * width, 8);
  std::vector<float> emb(n * width), dtable(vocab * width, 0.5f), y(n * width), rstd(n), dx(n * width, 0.25f),
      dgain(width, 0.125f);
  cpu::embedding_forward(tokens.data(), n, table.data(), width, emb.data());
  cpu::embedding_backward(tokens.data(), n, dout.data(), width, dtable.data());
  cpu::rmsnorm_forward(emb.data(), gain.data(), n, width, 1e-5f, y.data(), rstd.data());
  cpu::rmsnorm_backward(emb.data(), gain.data(), rstd.data(), dy.data(), n, width, dx.data(), dgain.data());
  // RoPE on columns [2, 2 + heads*hd) of rows of `stride`, tokens continuing a cached sequence.
  const int64_t seq = 12, heads = 3, hd = 8, stride = heads * hd + 5, rope_tokens = 2 * seq, first = 4;
  const cpu::RopeTable<float> rt(seq + first, hd, 10000.0);
  const auto r0 = normal_floats(rope_tokens * stride, 9);
  auto rf = r0, rb = r0;
  cpu::rope_forward(rf.data(), rope_tokens, seq, stride, 2, heads, rt, first);
  cpu::rope_backward(rb.data(), rope_tokens, seq, stride, 2, heads, rt, first);
  for (const auto& s : kSchedules) {
    Schedule sc(s);
    auto dtok = sc.up(tokens);
    auto dtab = sc.up(table), ddout = sc.up(dout), demb = sc.fresh<float>(emb.size());
    auto ddtable = sc.up(std::vector<float>(vocab * width, 0.5f));
    cuda::embedding_forward(dtok.data(), n, dtab.data(), width, demb.data(), sc.ctx);
    cuda::embedding_backward(dtok.data(), n, ddout.data(), width, ddtable.data(), sc.ctx);
    EXPECT_TRUE(same_bits(demb.download(), emb)) << sc.name();
    EXPECT_TRUE(same_bits(ddtable.download(), dtable)) << sc.name();
    auto dgn = sc.up(gain), ddy = sc.up(dy), dyy = sc.fresh<float>(y.size()), drs = sc.fresh<float>(n);
    auto ddx = sc.up(std::vector<float>(n * width, 0.25f)), ddg = sc.up(std::vector<float>(width, 0.125f));
    cuda::rmsnorm_forward(demb.data(), dgn.data(), n, width, 1e-5f, dyy.data(), drs.data(), sc.ctx);
    cuda::rmsnorm_backward(demb.data(), dgn.data(), drs.data(), ddy.data(), n, width, ddx.data(), ddg.data(), sc.ctx);
    EXPECT_TRUE(same_bits(dyy.download(), y) && same_bits(drs.download(), rstd)) << sc.name();
    EXPECT_TRUE(same_bits(ddx.download(), dx) && same_bits(ddg.download(), dgain)) << sc.name();
    auto dcos = sc.up(rt.cos), dsin = sc.up(rt.sin), drf = sc.up(r0), drb = sc.up(r0);
    cuda::rope(drf.data(), rope_tokens, seq, stride, 2, heads, hd, dcos.data(), dsin.data(), first, 1.0f, sc.ctx);
    cuda::rope(drb.data(), rope_tokens, seq, stride, 2, heads, hd, dcos.data(), dsin.data(), first, -1.0f, sc.ctx);
    EXPECT_TRUE(same_bits(drf.download(), rf)) << sc.name();
    EXPECT_TRUE(same_bits(drb.download(), rb)) << sc.name();
  }
  }
}

TEST(CudaModelLayers, AdamwAndGradientNormAreTheCpuKernelsBits) {
  const int64_t n = (int64_t{1} << 15) + 77;  // two full chunks of the norm and a partial one
  const auto g = normal_floats(n, 10), w0 = normal_floats(n, 11), m0 = normal_floats(n, 12, 0.01f);
  auto v0 = normal_floats(n, 13, 0.01f);
  for (auto& x : v0) x = x * x;
  std::vector<uint8_t> mask(n);
  for (int64_t i = 0; i < n; ++i) mask[i] = static_cast<uint8_t>(i % 3 == 0);
  const cpu::AdamWConstants k{0.5f, 0.9f, 0.99f, 0.19f, 0.0199f, 1e-4f, 1e-3f, 1e-8f};
  auto m = m0, v = v0, w = w0;
  cpu::adamw_update(k, g.data(), m.data(), v.data(), w.data(), mask.data(), n);
  const double norm = cpu::sum_of_squares(g.data(), n);
  for (const auto& s : kSchedules) {
    Schedule sc(s);
    auto dg = sc.up(g), dm = sc.up(m0), dv = sc.up(v0), dw = sc.up(w0);
    auto dmask = sc.up(mask);
    EXPECT_EQ(cuda::sum_of_squares(dg.data(), n, sc.ctx), norm) << sc.name();
    cuda::adamw_update({k.clip, k.b1, k.b2, k.bias1, k.bias2, k.decay, k.lr, k.eps}, dg.data(), dm.data(), dv.data(),
                       dw.data(), dmask.data(), n, sc.ctx);
    EXPECT_TRUE(same_bits(dm.download(), m) && same_bits(dv.download(), v) && same_bits(dw.download(), w)) << sc.name();
  }
}

// The exp/log layers: with the CPU's scalar exp (std::exp, which the model's expf is) the GPU's
// operation order gives the CPU's bits; on a GPU only expf/logf differ (test_cuda_backend bounds that).
class CudaModelExpLayers : public ::testing::Test {
 protected:
  void SetUp() override { cpu::set_isa_limit(cpu::Isa::scalar); }
  void TearDown() override { cpu::set_isa_limit(cpu::detected_isa()); }
};

TEST_F(CudaModelExpLayers, AttentionForwardBackwardAndDecodeAreTheCpuKernelsBits) {
  // head_dim 8 in FP32 and BF16: the per-row kernels (layer_math.h). FP32 at head_dim 64 and 32: the
  // staged kernels (attention_fp32.cuh) over two 128-row tiles of a ragged 150-token sequence with
  // GQA groups of 2, and a sequence shorter than a tile with a group of 3.
  const AttentionShape shapes[] = {{2, 21, 4, 2, 8, false}, {2, 21, 4, 2, 8, true}, {2, 150, 4, 2, 64, false},
                                   {1, 40, 3, 1, 32, false}};
  for (const AttentionShape& a : shapes) {
    const auto qkv = normal_floats(a.batch * a.seq * a.qkv_stride(), 61);
    const auto dout = normal_floats(a.batch * a.seq * a.out_width(), 62);
    std::vector<float> out(dout.size()), stats(a.softmax_stats_size()), dqkv(qkv.size());
    cpu::attention_forward(a, qkv.data(), out.data(), stats.data());
    cpu::attention_backward(a, qkv.data(), stats.data(), dout.data(), dqkv.data());
    const std::string shape = "seq " + std::to_string(a.seq) + ", head_dim " + std::to_string(a.head_dim) +
                              ", bf16 " + std::to_string(a.bf16_matmuls);
    const bool staged = a.head_dim != 8;  // the per-row kernels launch through a helper: no name to check
    for (const auto& s : kSchedules) {
      Schedule sc(s);
      auto dq = sc.up(qkv), ddo = sc.up(dout), dout_ = sc.fresh<float>(out.size()), dst = sc.fresh<float>(stats.size());
      auto ddq = sc.fresh<float>(qkv.size());
      cuda::attention_forward(a, dq.data(), dout_.data(), dst.data(), sc.ctx);
      if (staged) {
        EXPECT_NE(cuda_model::last_kernel_name().find("fp32_attention::forward_kernel<"), std::string::npos)
            << cuda_model::last_kernel_name();
      }
      cuda::attention_backward(a, dq.data(), dst.data(), ddo.data(), ddq.data(), sc.ctx);
      EXPECT_TRUE(same_bits(dout_.download(), out) && same_bits(dst.download(), stats)) << shape << ", " << sc.name();
      EXPECT_TRUE(same_bits(ddq.download(), dqkv)) << shape << ", " << sc.name();
    }
  }
  // KV-cache decoding: 3 prompt tokens, then 2 more, into a cache of 8 positions.
  const AttentionShape s3{1, 3, 4, 2, 8, false}, s2{1, 2, 4, 2, 8, false};
  const int64_t kv_width = 2 * 8, capacity = 8;
  const auto qkv3 = normal_floats(3 * s3.qkv_stride(), 71), qkv2 = normal_floats(2 * s2.qkv_stride(), 72);
  std::vector<float> kc(capacity * kv_width, 0.0f), vc(kc.size(), 0.0f), out3(3 * 32), out2(2 * 32);
  cpu::attention_decode(s3, 0, qkv3.data(), kc.data(), vc.data(), out3.data());
  cpu::attention_decode(s2, 3, qkv2.data(), kc.data(), vc.data(), out2.data());
  for (const auto& s : kSchedules) {
    Schedule sc(s);
    auto dk = sc.up(std::vector<float>(kc.size(), 0.0f)), dv = sc.up(std::vector<float>(vc.size(), 0.0f));
    auto dq3 = sc.up(qkv3), dq2 = sc.up(qkv2), do3 = sc.fresh<float>(out3.size()), do2 = sc.fresh<float>(out2.size());
    cuda::attention_decode(s3, 0, dq3.data(), dk.data(), dv.data(), do3.data(), sc.ctx);
    cuda::attention_decode(s2, 3, dq2.data(), dk.data(), dv.data(), do2.data(), sc.ctx);
    EXPECT_TRUE(same_bits(do3.download(), out3) && same_bits(do2.download(), out2)) << sc.name();
    EXPECT_TRUE(same_bits(dk.download(), kc) && same_bits(dv.download(), vc)) << sc.name();
  }
}

TEST_F(CudaModelExpLayers, SwigluAndCrossEntropyAreTheCpuKernelsBits) {
  // 7 rows: one half-warp group; 21 rows of 70: two groups, the second ragged, a ragged row tail.
  for (const auto& [n, vocab] : {std::pair<int64_t, int64_t>{7, 33}, {21, 70}}) {
  SCOPED_TRACE("n " + std::to_string(n) + ", vocab " + std::to_string(vocab));
  const int64_t hidden = 40;
  const auto gu = normal_floats(n * 2 * hidden, 73, 2.0f), da = normal_floats(n * hidden, 74);
  std::vector<float> a(n * hidden), dg(gu.size());
  cpu::swiglu_forward(gu.data(), n, hidden, a.data());
  cpu::swiglu_backward(gu.data(), da.data(), n, hidden, dg.data());
  const auto logits = normal_floats(n * vocab, 75, 3.0f);
  std::vector<int32_t> targets(n);
  for (int64_t i = 0; i < n; ++i) targets[i] = static_cast<int32_t>((i * 5) % vocab);
  std::vector<float> loss(n), grad(logits.size());
  const double total = cpu::cross_entropy_forward(logits.data(), targets.data(), n, vocab, loss.data());
  cpu::cross_entropy_backward(logits.data(), targets.data(), n, vocab, 0.25f, grad.data());
  for (const auto& s : kSchedules) {
    Schedule sc(s);
    auto dgu = sc.up(gu), dda = sc.up(da), dact = sc.fresh<float>(a.size()), ddg = sc.fresh<float>(dg.size());
    cuda::swiglu_forward(dgu.data(), n, hidden, dact.data(), sc.ctx);
    cuda::swiglu_backward(dgu.data(), dda.data(), n, hidden, ddg.data(), sc.ctx);
    EXPECT_TRUE(same_bits(dact.download(), a) && same_bits(ddg.download(), dg)) << sc.name();
    auto dl = sc.up(logits), dloss = sc.fresh<float>(n);
    auto dt = sc.up(targets);
    EXPECT_EQ(cuda::cross_entropy_forward(dl.data(), dt.data(), n, vocab, dloss.data(), sc.ctx), total) << sc.name();
    EXPECT_TRUE(same_bits(dloss.download(), loss)) << sc.name();
    cuda::cross_entropy_backward(dl.data(), dt.data(), n, vocab, 0.25f, dl.data(), sc.ctx);  // in place, as training
    EXPECT_TRUE(same_bits(dl.download(), grad)) << sc.name();
    // Training's pair: the forward keeps each row's (max, 1 / sum), the backward reads the row once.
    auto kept_logits = sc.up(logits), kept_loss = sc.fresh<float>(n), stats = sc.fresh<float>(2 * n);
    EXPECT_EQ(cuda::cross_entropy_forward(kept_logits.data(), dt.data(), n, vocab, kept_loss.data(), sc.ctx, stats.data()),
              total)
        << sc.name();
    EXPECT_TRUE(same_bits(kept_loss.download(), loss)) << sc.name();
    cuda::cross_entropy_backward_kept(kept_logits.data(), dt.data(), n, vocab, 0.25f, stats.data(), kept_logits.data(),
                                      sc.ctx);
    EXPECT_TRUE(same_bits(kept_logits.download(), grad)) << sc.name();
  }
  }
}

// ------------------------------------------------------------------ quantize.cu ------------------
// test_cuda_quantize's tests run in this binary under one schedule; these add the schedules, the
// ragged shapes of the transpose kernel and the amax tail, and the kernels' shared-memory paths.

bool same_tensor(const QuantizedTensor& a, const QuantizedTensor& b) {
  return a.codes == b.codes && a.scales == b.scales && std::bit_cast<uint32_t>(a.amax) == std::bit_cast<uint32_t>(b.amax) &&
         std::bit_cast<uint32_t>(a.decode_scale) == std::bit_cast<uint32_t>(b.decode_scale);
}

TEST(CudaModelQuantize, SharedMemoryPathsGiveTheReferenceUnderEverySchedule) {
  const int64_t rows = 48, cols = 176;  // 11 column blocks: a partial block of 8 tiles
  const auto x = nibble_test::floats_with_outliers(rows * cols, 81);
  QuantOptions tile;
  tile.tile_16x16 = true;
  QuantOptions rn, wgrad;
  wgrad.rht = true;
  wgrad.rounding = Rounding::stochastic;
  wgrad.seed = 5;
  QuantOptions tile46 = tile;
  tile46.four_over_six = true;
  for (const auto& s : kSchedules) {
    Schedule sc(s);
    auto dx = sc.up(x);
    for (const QuantOptions& o : {tile, tile46}) {
      const cuda::QuantizedPair p = cuda::quantize_both(dx.data(), rows, cols, o, o, sc.ctx);
      EXPECT_TRUE(same_tensor(cuda::to_host(p.rowwise), ref::quantize(x, rows, cols, o))) << sc.name();
      EXPECT_TRUE(same_tensor(cuda::to_host(p.columnwise), ref::quantize_transposed(x, rows, cols, o))) << sc.name();
    }
    const cuda::QuantizedPair p = cuda::quantize_both(dx.data(), rows, cols, rn, wgrad, sc.ctx);
    EXPECT_TRUE(same_tensor(cuda::to_host(p.rowwise), ref::quantize(x, rows, cols, rn))) << sc.name();
    EXPECT_TRUE(same_tensor(cuda::to_host(p.columnwise), ref::quantize_transposed(x, rows, cols, wgrad))) << sc.name();
  }
}

TEST(CudaModelQuantize, RaggedTransposeAndAmaxTailGiveTheReference) {
  // Neither a multiple of the 32x32 transpose tile; 5 row tiles, more than the model's grid.y of 3.
  const int64_t rows = 133, cols = 50;
  const auto x = nibble_test::floats_with_outliers(rows * cols, 82);
  const int64_t n = 16 * 61 + 7;  // the amax's 16-value units and a tail of 7
  auto big = normal_floats(n, 83);
  big[n - 2] = -77.0f;  // the maximum sits in the tail
  for (const auto& s : kSchedules) {
    Schedule sc(s);
    auto dx = sc.up(x);
    for (Format f : {Format::fp8_e4m3, Format::fp8_e5m2}) {
      QuantOptions o;
      o.format = f;
      EXPECT_TRUE(same_tensor(cuda::to_host(cuda::quantize_transposed(dx.data(), rows, cols, o, sc.ctx)),
                              ref::quantize_transposed(x, rows, cols, o)))
          << to_string(f) << ", " << sc.name();
    }
    auto db = sc.up(big);
    auto out = sc.fresh<float>(1);
    cuda::amax(db.data(), n, out.data(), sc.ctx);
    EXPECT_EQ(out.download()[0], 77.0f) << sc.name();
  }
}

TEST(CudaModelQuantize, TheFirstNonFiniteValueIsFoundInAnyBlockOrder) {
  std::vector<float> x(64 * 80, 1.0f);
  x[41 * 80 + 70] = INFINITY;
  x[40 * 80 + 3] = std::nanf("");  // the first in memory order: every schedule must name it
  for (const auto& s : kSchedules) {
    Schedule sc(s);
    auto dx = sc.up(x);
    for (bool rht : {false, true}) {
      QuantOptions o;
      o.rht = rht;
      EXPECT_NE(nibble_test::error_of([&] { cuda::quantize(dx.data(), 64, 80, o, sc.ctx); }).find("[40, 3]"),
                std::string::npos)
          << "rht " << rht << ", " << sc.name();
    }
  }
}

// Deferred checks (the CUDA backend's, no host sync per quantization): no quantization throws; the
// read throws once, naming the first quantization in call order that met a non-finite value (not the
// first by flat index: the third's [0, 1] comes before the second's [40, 3]) and that value's index;
// the codes are those of an immediate check's run; the next read finds nothing pending; clean inputs
// read clean. Every path: row-wise, the fused pair (RHT on the column copy) and the column copy alone.
TEST(CudaModelQuantize, DeferredNonFiniteChecksThrowOnceAtTheReadNamingTheFirstBadQuantization) {
  std::vector<float> clean = normal_floats(64 * 80, 31), bad = clean, worse = clean;
  bad[41 * 80 + 70] = INFINITY;
  bad[40 * 80 + 3] = std::nanf("");
  worse[1] = -INFINITY;
  cuda::KernelOptions deferred;
  deferred.defer_finite_check = true;
  QuantOptions rows_o, cols_o;
  cols_o.rht = true;
  for (const auto& s : kSchedules) {
    Schedule sc(s);
    auto dc = sc.up(clean), db = sc.up(bad), dw = sc.up(worse);
    cuda::DeviceQuantized first = cuda::quantize(dc.data(), 64, 80, rows_o, sc.ctx, deferred);
    cuda::QuantizedPair pair = cuda::quantize_both(db.data(), 64, 80, rows_o, cols_o, sc.ctx, deferred);
    cuda::DeviceQuantized third = cuda::quantize_transposed(dw.data(), 64, 80, cols_o, sc.ctx, deferred);
    const std::string message = nibble_test::error_of([&] { cuda::throw_deferred_nonfinite(sc.ctx); });
    EXPECT_NE(message.find("non-finite value at index [40, 3] (flat 3203) of quantization 2 of 3 since the last "
                           "check (a [64, 80] input): quantization needs finite input; fix the producer"),
              std::string::npos)
        << message << ", " << sc.name();
    EXPECT_EQ(nibble_test::error_of([&] { cuda::throw_deferred_nonfinite(sc.ctx); }), "(no error)") << sc.name();
    const cuda::DeviceQuantized checked = cuda::quantize(dc.data(), 64, 80, rows_o, sc.ctx);
    EXPECT_EQ(cuda::to_host(first).codes, cuda::to_host(checked).codes) << sc.name();
    (void)cuda::quantize_both(dc.data(), 64, 80, rows_o, cols_o, sc.ctx, deferred);
    EXPECT_EQ(nibble_test::error_of([&] { cuda::throw_deferred_nonfinite(sc.ctx); }), "(no error)") << sc.name();
  }
}

// The BF16 operand written by the quantize kernel (KernelOptions::write_bf16_operand, the CUDA
// backend's choice on Hopper) on every NVFP4 path: the same codes, scales and global scales as without
// it, and, bit for bit, the BF16 operand that the dequantize pass makes from them today (what the
// emulated GEMM multiplied before). Row-wise (1x16 RN, 16x16 with Four Over Six, RHT with SR, BF16
// input, row-scaled), the fused pair (16x16 tiles transposed; the wgrad pair, independent columns),
// and the column copy alone (fused; a ragged shape through the device transpose). MX gets none.
bool same_quantized(const cuda::DeviceQuantized& a, const cuda::DeviceQuantized& b) {
  const QuantizedTensor ha = cuda::to_host(a), hb = cuda::to_host(b);
  return same_tensor(ha, hb) && same_bits(ha.row_amax, hb.row_amax) && same_bits(ha.row_decode_scale, hb.row_decode_scale);
}
::testing::AssertionResult bf16_operand_is_the_dequantize_pass(const cuda::DeviceQuantized& with,
                                                               const cuda::DeviceQuantized& without, Schedule& sc) {
  if (!same_quantized(with, without)) return ::testing::AssertionFailure() << "codes, scales or globals differ";
  if (with.bf16.size() != static_cast<size_t>(with.rows * with.cols))
    return ::testing::AssertionFailure() << "no BF16 operand (" << with.bf16.size() << " values)";
  auto want = sc.fresh<uint16_t>(with.bf16.size());
  cuda::dequantize_block_scaled_bf16(without, want.data(), sc.ctx);
  const std::vector<uint16_t> got = with.bf16.download(), expected = want.download();
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != expected[i])
      return ::testing::AssertionFailure() << "BF16 operand at " << i << ": 0x" << std::hex << got[i] << " vs 0x"
                                           << expected[i];
  return ::testing::AssertionSuccess();
}

TEST(CudaModelQuantize, TheQuantizeKernelsBf16OperandIsTheDequantizePasssBits) {
  const int64_t rows = 48, cols = 176;
  const auto x = nibble_test::floats_with_outliers(rows * cols, 91);
  std::vector<bf16> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = bf16_from_float_rn(x[i]);
  QuantOptions rn, tile46, wgrad, row_scaled;
  tile46.tile_16x16 = true;
  tile46.four_over_six = true;
  wgrad.rht = true;
  wgrad.rounding = Rounding::stochastic;
  wgrad.seed = 9;
  row_scaled.row_scaled = true;
  cuda::KernelOptions plain, with;
  with.write_bf16_operand = true;
  for (const auto& s : kSchedules) {
    Schedule sc(s);
    auto dx = sc.up(x);
    auto dxb = sc.up(xb);
    for (const QuantOptions& o : {rn, tile46, wgrad, row_scaled}) {
      EXPECT_TRUE(bf16_operand_is_the_dequantize_pass(cuda::quantize(dx.data(), rows, cols, o, sc.ctx, with),
                                                      cuda::quantize(dx.data(), rows, cols, o, sc.ctx, plain), sc))
          << "row-wise, " << sc.name();
      EXPECT_TRUE(bf16_operand_is_the_dequantize_pass(cuda::quantize_transposed(dx.data(), rows, cols, o, sc.ctx, with),
                                                      cuda::quantize_transposed(dx.data(), rows, cols, o, sc.ctx, plain), sc))
          << "column copy, " << sc.name();
    }
    EXPECT_TRUE(bf16_operand_is_the_dequantize_pass(cuda::quantize(dxb.data(), rows, cols, wgrad, sc.ctx, with),
                                                    cuda::quantize(dxb.data(), rows, cols, wgrad, sc.ctx, plain), sc))
        << "BF16 input, " << sc.name();
    for (const auto& [ro, co] : {std::pair{tile46, tile46}, std::pair{rn, wgrad}}) {
      const cuda::QuantizedPair a = cuda::quantize_both(dx.data(), rows, cols, ro, co, sc.ctx, with);
      const cuda::QuantizedPair b = cuda::quantize_both(dx.data(), rows, cols, ro, co, sc.ctx, plain);
      EXPECT_TRUE(bf16_operand_is_the_dequantize_pass(a.rowwise, b.rowwise, sc)) << "pair rows, " << sc.name();
      EXPECT_TRUE(bf16_operand_is_the_dequantize_pass(a.columnwise, b.columnwise, sc)) << "pair columns, " << sc.name();
    }
    const std::vector<float> ragged = nibble_test::floats_with_outliers(48 * 40, 92);  // 40 columns: not the fused kernel
    auto dr = sc.up(ragged);
    EXPECT_TRUE(bf16_operand_is_the_dequantize_pass(cuda::quantize_transposed(dr.data(), 48, 40, rn, sc.ctx, with),
                                                    cuda::quantize_transposed(dr.data(), 48, 40, rn, sc.ctx, plain), sc))
        << "ragged column copy, " << sc.name();
    QuantOptions mx;
    mx.format = Format::mxfp4;
    EXPECT_TRUE(cuda::quantize(dr.data(), 60, 32, mx, sc.ctx, with).bf16.empty()) << sc.name();
  }
}

// dgrad's weight on Hopper: the exact transpose of a 16x16-tile tensor takes its BF16 operand
// transposed, which is the dequantize pass's operand of the transposed codes and scales, bit for
// bit; 9 transpose tiles of 32 rows, more than the model's grid.y of 3.
TEST(CudaModelQuantize, TheTransposedTileTensorsBf16OperandIsTheDequantizePasssBits) {
  const int64_t rows = 288, cols = 48;
  const auto x = nibble_test::floats_with_outliers(rows * cols, 97);
  QuantOptions tile;
  tile.tile_16x16 = true;
  tile.four_over_six = true;
  cuda::KernelOptions with;
  with.write_bf16_operand = true;
  for (const auto& s : kSchedules) {
    Schedule sc(s);
    auto dx = sc.up(x);
    const cuda::DeviceQuantized q = cuda::quantize(dx.data(), rows, cols, tile, sc.ctx, with);
    cuda::DeviceQuantized t;
    t.layout() = q.layout();
    t.rows = cols;
    t.cols = rows;
    t.codes = sc.fresh<uint8_t>(static_cast<size_t>(t.code_bytes()));
    t.scales = sc.fresh<uint8_t>(static_cast<size_t>(t.scale_bytes()));
    t.globals = sc.up(std::vector<float>{0.0f, 1.0f});
    cuda::transpose_nvfp4_tiles(q.codes.data(), q.scales.data(), rows, cols, t.codes.data(), t.scales.data(), sc.ctx);
    cuda::transpose_bf16_operand(q, t, sc.ctx);
    ASSERT_EQ(t.bf16.size(), static_cast<size_t>(rows * cols));
    auto want = sc.fresh<uint16_t>(t.bf16.size());
    cuda::dequantize_block_scaled_bf16(t, want.data(), sc.ctx);
    EXPECT_EQ(t.bf16.download(), want.download()) << sc.name();
    cuda::DeviceQuantized none;
    cuda::transpose_bf16_operand(cuda::quantize(dx.data(), rows, cols, tile, sc.ctx), none, sc.ctx);
    EXPECT_TRUE(none.bf16.empty()) << sc.name();
  }
}

// A deferred quantization is two launches, the amax pass (whose last block folds the finite check
// into the sticky word) and the cast; the fold is right whichever block finishes last (many blocks,
// one bad value, every schedule), and the count of finished blocks is back at 0 for the next pass.
TEST(CudaModelQuantize, ADeferredQuantizationIsTwoLaunchesAndItsLastBlockFoldsTheCheck) {
  const int64_t rows = 256, cols = 256;  // 4096 16-value units: 16 blocks of the amax pass
  std::vector<float> clean = normal_floats(rows * cols, 93), bad = clean;
  bad[201 * cols + 77] = std::nanf("");
  cuda::KernelOptions deferred;
  deferred.defer_finite_check = true;
  QuantOptions rn, wgrad;
  wgrad.rht = true;
  for (const auto& s : kSchedules) {
    Schedule sc(s);
    auto dc = sc.up(clean), db = sc.up(bad);
    const uint64_t before = cuda_model::launches();
    (void)cuda::quantize(dc.data(), rows, cols, rn, sc.ctx, deferred);
    EXPECT_EQ(cuda_model::launches() - before, 2u) << sc.name();
    const uint64_t pair_before = cuda_model::launches();
    (void)cuda::quantize_both(dc.data(), rows, cols, rn, wgrad, sc.ctx, deferred);
    EXPECT_EQ(cuda_model::launches() - pair_before, 2u) << "the wgrad pair, " << sc.name();
    for (int round = 0; round < 3; ++round) {
      (void)cuda::quantize(dc.data(), rows, cols, rn, sc.ctx, deferred);
      (void)cuda::quantize_both(db.data(), rows, cols, rn, wgrad, sc.ctx, deferred);
      const std::string message = nibble_test::error_of([&] { cuda::throw_deferred_nonfinite(sc.ctx); });
      const std::string want = round == 0 ? "[201, 77] (flat 51533) of quantization 4 of 4" : "[201, 77] (flat 51533) of quantization 2 of 2";
      EXPECT_NE(message.find(want), std::string::npos) << message << ", round " << round << ", " << sc.name();
    }
  }
}

// The BF16 decode of every format: the 4-bit formats' 8-byte path, the others element by element,
// and a last group shorter than 16 (n = 15).
TEST(CudaModelQuantize, Bf16DecodeOfEveryFormatAndARaggedTailIsExact) {
  struct Case {
    Format format;
    int64_t rows, cols;
  };
  for (const Case& c : {Case{Format::nvfp4, 3, 48}, Case{Format::mxfp4, 2, 64}, Case{Format::mxfp8, 2, 64},
                        Case{Format::fp8_e4m3, 3, 5}, Case{Format::fp8_e5m2, 3, 5}})
    for (const auto& s : kSchedules) {
      Schedule sc(s);
      const auto x = nibble_test::floats_with_outliers(c.rows * c.cols, 84);
      auto dx = sc.up(x);
      QuantOptions o;
      o.format = c.format;
      const cuda::DeviceQuantized q = cuda::quantize(dx.data(), c.rows, c.cols, o, sc.ctx);
      auto out = sc.fresh<uint16_t>(static_cast<size_t>(c.rows * c.cols));
      cuda::dequantize_block_scaled_bf16(q, out.data(), sc.ctx);
      const std::vector<uint16_t> got = out.download();
      const QuantizedTensor h = cuda::to_host(q);
      for (int64_t i = 0; i < c.rows * c.cols; ++i) {
        const bool four_bit = c.format == Format::nvfp4 || c.format == Format::mxfp4;
        const uint8_t code = four_bit ? static_cast<uint8_t>((h.codes[i / 2] >> (4 * (i & 1))) & 0xF) : h.codes[i];
        const float value = four_bit ? e2m1_decode(code) : c.format == Format::fp8_e5m2 ? e5m2_decode(code) : e4m3_decode(code);
        const float scale = c.format == Format::nvfp4 ? e4m3_decode(h.scales[i / 16])
                            : (c.format == Format::mxfp4 || c.format == Format::mxfp8) ? e8m0_decode(h.scales[i / 32])
                                                                                         : 1.0f;
        ASSERT_EQ(got[i], bf16_from_float_rn(value * scale).bits) << to_string(c.format) << " at " << i << ", " << sc.name();
      }
    }
}

// ------------------------------------------------------------------ bench and GEMM kernels -------

TEST(CudaModelSmallKernels, BenchInputsAndTheGemmAlphaAreTheHostFormulas) {
  const int64_t n = 3 * 256 + 5;  // grid of 2 blocks: the grid-stride loop takes a second turn
  std::vector<float> want(n);
  std::vector<uint16_t> want16(n);
  for (int64_t i = 0; i < n; ++i) {
    const cuda::dm::Philox4 r = cuda::dm::philox4x32_10(static_cast<uint64_t>(i), 9);
    const float s = cuda::dm::philox_word_to_uniform(r.v[0]) + cuda::dm::philox_word_to_uniform(r.v[1]) +
                    cuda::dm::philox_word_to_uniform(r.v[2]) + cuda::dm::philox_word_to_uniform(r.v[3]);
    want[i] = (s - 2.0f) * 1.7f;
    want16[i] = bf16_from_float_rn(want[i]).bits;
  }
  for (const auto& s : kSchedules) {
    Schedule sc(s);
    auto x = sc.fresh<float>(n);
    auto b = sc.fresh<uint16_t>(n);
    NIBBLE_LAUNCH(2, 256, 0, sc.ctx.stream(), cuda::bench_kernels::fill_random_kernel)(x.data(), n, uint64_t{9});
    NIBBLE_LAUNCH(2, 256, 0, sc.ctx.stream(), cuda::bench_kernels::to_bf16_kernel)(x.data(), n, b.data());
    EXPECT_TRUE(same_bits(x.download(), want)) << sc.name();
    EXPECT_EQ(b.download(), want16) << sc.name();
  }
  Schedule sc(kSchedules[0]);
  auto ga = sc.up(std::vector<float>{3.0f, 0.1f}), gb = sc.up(std::vector<float>{5.0f, 0.3f});
  auto ab = sc.fresh<float>(2);
  NIBBLE_LAUNCH(1, 1, 0, sc.ctx.stream(), cuda::gemm_kernels::fold_alpha_kernel)(ga.data(), gb.data(), 0.7f, 1.0f, ab.data());
  EXPECT_TRUE(same_bits(ab.download(), std::vector<float>{0.1f * 0.3f * 0.7f, 1.0f}));
}

// ------------------------------------------------------------------ gemm.cu on the model's cuBLASLt
// The host replay of cuBLASLt: the model records each call's parameters (descriptor attributes,
// layouts, pointers, alpha/beta, algorithm, workspace). A sequence of GEMMs (NVFP4 emulated with
// and without the quantize kernel's BF16 operand, BF16 with an odd ldc, FP32 transposed, a repeat)
// gives cuBLASLt the same calls, and the same products, with the plan cache as with a fresh plan per
// call; run again, it builds no descriptor and asks no heuristic; a changed shape gets its own
// entry. The emulated GEMM on the quantize kernel's BF16 operands runs no dequantize pass and gives
// the product of the dequantize pass's operands, bit for bit.
// The emulated GEMM's product from the dequantize pass's operands (the path before the quantize
// kernel wrote them): the pass, then the BF16 GEMM with alpha folded as gemm() folds it.
std::vector<float> cuda_model_pass_product(const cuda::DeviceQuantized& a, const cuda::DeviceQuantized& b, Schedule& sc) {
  auto a16 = sc.fresh<uint16_t>(static_cast<size_t>(a.rows * a.cols)), b16 = sc.fresh<uint16_t>(static_cast<size_t>(b.rows * b.cols));
  cuda::dequantize_block_scaled_bf16(a, a16.data(), sc.ctx);
  cuda::dequantize_block_scaled_bf16(b, b16.data(), sc.ctx);
  auto ab = sc.fresh<float>(2), c = sc.fresh<float>(static_cast<size_t>(a.rows * b.rows));
  NIBBLE_LAUNCH(1, 1, 0, sc.ctx.stream(), cuda::gemm_kernels::fold_alpha_kernel)(a.globals.data(), b.globals.data(), 0.5f, 0.0f, ab.data());
  cuda::gemm_bf16(Trans::no, Trans::yes, a.rows, b.rows, a.cols, 0.0f, a16.data(), a.cols, b16.data(), b.cols, 0.0f,
                  c.data(), b.rows, sc.ctx, ab.data());
  return c.download();
}

TEST(CudaModelGemm, CachedPlansGiveCuBlasLtTheParametersOfFreshOnesAndANewShapeItsOwnEntry) {
  const int64_t M = 32, N = 48, K = 64, ldc = 53;
  Schedule sc(kSchedules[0]);
  const auto ha = nibble_test::floats_with_outliers(M * K, 95), hb = nibble_test::floats_with_outliers(N * K, 96);
  std::vector<uint16_t> ha16(ha.size()), hb16(hb.size());
  for (size_t i = 0; i < ha.size(); ++i) ha16[i] = bf16_from_float_rn(ha[i]).bits;
  for (size_t i = 0; i < hb.size(); ++i) hb16[i] = bf16_from_float_rn(hb[i]).bits;
  auto da = sc.up(ha), db = sc.up(hb);
  auto da16 = sc.up(ha16), db16 = sc.up(hb16);
  cuda::KernelOptions with_operand;
  with_operand.write_bf16_operand = true;
  const QuantOptions o;
  const cuda::DeviceQuantized qa = cuda::quantize(da.data(), M, K, o, sc.ctx), qb = cuda::quantize(db.data(), N, K, o, sc.ctx);
  const cuda::DeviceQuantized wa = cuda::quantize(da.data(), M, K, o, sc.ctx, with_operand),
                              wb = cuda::quantize(db.data(), N, K, o, sc.ctx, with_operand);
  auto c_pass = sc.fresh<float>(M * N), c_written = sc.fresh<float>(M * N), c_dense = sc.fresh<float>(M * ldc),
       c_f32 = sc.fresh<float>(K * K);
  auto sequence = [&] {
    EXPECT_EQ(cuda::gemm(qa, qb, c_pass.data(), N, 0.5f, Output::overwrite, sc.ctx), cuda::GemmPath::emulated_bf16);
    const uint64_t before = cuda_model::launches();
    cuda::gemm(wa, wb, c_written.data(), N, 0.5f, Output::overwrite, sc.ctx);
    EXPECT_EQ(cuda_model::launches() - before, 1u) << "the alpha fold only: no dequantize pass";
    cuda::gemm_bf16(Trans::no, Trans::yes, M, N, K, 1.0f, da16.data(), K, db16.data(), K, 0.0f, c_dense.data(), ldc, sc.ctx);
    cuda::gemm_f32(Trans::yes, Trans::no, K, K, M, 1.0f, da.data(), K, da.data(), K, 0.0f, c_f32.data(), K, sc.ctx);
    cuda::gemm_bf16(Trans::no, Trans::yes, M, N, K, 1.0f, da16.data(), K, db16.data(), K, 0.0f, c_dense.data(), ldc, sc.ctx);
    cuda::gemm_bf16(Trans::no, Trans::yes, M, N, K, 1.0f, da16.data(), K, db16.data(), K, 0.0f, c_pass.data(), N, sc.ctx);
    return std::vector<std::vector<float>>{c_pass.download(), c_written.download(), c_dense.download(), c_f32.download()};
  };
  cuda::set_gemm_plan_cache(sc.ctx, false);
  cuda_model::lt_record() = {};
  const auto fresh_out = sequence();
  const cuda_model::LtRecord fresh = cuda_model::lt_record();
  ASSERT_EQ(fresh.calls.size(), 6u);
  EXPECT_EQ(fresh.heuristic_queries, 6u);
  EXPECT_EQ(fresh.calls[1].b_data, static_cast<const void*>(wa.bf16.data()));  // cuBLASLt's B is our a
  EXPECT_EQ(fresh.calls[1].a_data, static_cast<const void*>(wb.bf16.data()));
  EXPECT_TRUE(same_bits(c_written.download(), cuda_model_pass_product(qa, qb, sc))) << "the written operand's product";

  cuda::set_gemm_plan_cache(sc.ctx, true);
  cuda_model::lt_record() = {};
  const auto cached_out = sequence();
  const cuda_model::LtRecord first = cuda_model::lt_record();
  EXPECT_TRUE(first.calls == fresh.calls) << "a cached plan changed a cuBLASLt parameter";
  for (size_t i = 0; i < fresh_out.size(); ++i) EXPECT_TRUE(same_bits(cached_out[i], fresh_out[i])) << "product " << i;
  // Distinct problems: the two emulated GEMMs share one (same shape, device alpha), the BF16 GEMM
  // (its repeat included) another, the same with ldc = N a third, the FP32 one a fourth.
  EXPECT_EQ(cuda::gemm_plan_entries(sc.ctx), 4u);
  EXPECT_EQ(first.heuristic_queries, 4u);
  EXPECT_EQ(first.descriptors, 4u);

  cuda_model::lt_record() = {};
  (void)sequence();
  const cuda_model::LtRecord again = cuda_model::lt_record();
  EXPECT_TRUE(again.calls == fresh.calls);
  EXPECT_EQ(again.descriptors + again.layouts + again.preferences + again.heuristic_queries, 0u);

  cuda_model::lt_record() = {};
  cuda::gemm_bf16(Trans::no, Trans::yes, M / 2, N, K, 1.0f, da16.data(), K, db16.data(), K, 0.0f, c_dense.data(), ldc, sc.ctx);
  EXPECT_EQ(cuda::gemm_plan_entries(sc.ctx), 5u);
  EXPECT_EQ(cuda_model::lt_record().heuristic_queries, 1u);
  ASSERT_EQ(cuda_model::lt_record().calls.size(), 1u);
  EXPECT_EQ(cuda_model::lt_record().calls[0].b.cols, static_cast<uint64_t>(M / 2));  // cuBLASLt's n is our M
}

}  // namespace

namespace {
// ------------------------------------------------------------------ degenerate shapes -------------
// One-element rows, single tiles, a sequence of one token: the smallest grids and partial warps.

TEST(CudaModelEdges, TinyQuantizeShapesGiveTheReference) {
  Schedule sc(kSchedules[2]);
  QuantOptions tile;
  tile.tile_16x16 = true;
  QuantOptions tile46 = tile;
  tile46.four_over_six = true;
  QuantOptions rht;
  rht.rht = true;
  for (const QuantOptions& o : {QuantOptions{}, tile, tile46, rht})
    for (int64_t rows : {1, 3, 16})
      for (int64_t cols : {16, 32}) {
        const auto x = nibble_test::floats_with_outliers(rows * cols, static_cast<uint32_t>(rows * 100 + cols));
        auto dx = sc.up(x);
        EXPECT_TRUE(same_tensor(cuda::to_host(cuda::quantize(dx.data(), rows, cols, o, sc.ctx)), ref::quantize(x, rows, cols, o)))
            << rows << "x" << cols;
        if (rows % 16 == 0) {
          const QuantOptions col = o.tile_16x16 ? o : rht;
          const cuda::QuantizedPair p = cuda::quantize_both(dx.data(), rows, cols, o.tile_16x16 ? o : QuantOptions{}, col, sc.ctx);
          EXPECT_TRUE(same_tensor(cuda::to_host(p.columnwise), ref::quantize_transposed(x, rows, cols, col)))
              << rows << "x" << cols;
        }
      }
  auto one = sc.up(std::vector<float>{-3.5f, 2.0f, 1.0f});
  auto out = sc.fresh<float>(1);
  cuda::amax(one.data(), 3, out.data(), sc.ctx);
  EXPECT_EQ(out.download()[0], 3.5f);
}

TEST_F(CudaModelExpLayers, TinyLayerShapesAreTheCpuKernelsBits) {
  Schedule sc(kSchedules[1]);
  // Attention over one token and head_dim 2; cross-entropy over a vocabulary of 1; width-1 RMSNorm.
  const AttentionShape a{1, 1, 2, 1, 2, false};
  const auto qkv = normal_floats(a.qkv_stride(), 91), dout = normal_floats(a.out_width(), 92);
  std::vector<float> out(dout.size()), stats(a.softmax_stats_size()), dqkv(qkv.size());
  cpu::attention_forward(a, qkv.data(), out.data(), stats.data());
  cpu::attention_backward(a, qkv.data(), stats.data(), dout.data(), dqkv.data());
  auto dq = sc.up(qkv), ddo = sc.up(dout), dout_ = sc.fresh<float>(out.size()), dst = sc.fresh<float>(stats.size());
  auto ddq = sc.fresh<float>(qkv.size());
  cuda::attention_forward(a, dq.data(), dout_.data(), dst.data(), sc.ctx);
  cuda::attention_backward(a, dq.data(), dst.data(), ddo.data(), ddq.data(), sc.ctx);
  EXPECT_TRUE(same_bits(dout_.download(), out) && same_bits(ddq.download(), dqkv));
  const std::vector<float> logits{0.5f, -1.0f};
  const std::vector<int32_t> targets{0, 0};
  std::vector<float> loss(2);
  const double total = cpu::cross_entropy_forward(logits.data(), targets.data(), 2, 1, loss.data());
  auto dl = sc.up(logits), dloss = sc.fresh<float>(2);
  auto dt = sc.up(targets);
  EXPECT_EQ(cuda::cross_entropy_forward(dl.data(), dt.data(), 2, 1, dloss.data(), sc.ctx), total);
  const std::vector<float> x{3.0f, -2.0f}, gain{0.5f};
  std::vector<float> y(2), rstd(2);
  cpu::rmsnorm_forward(x.data(), gain.data(), 2, 1, 1e-5f, y.data(), rstd.data());
  auto dx = sc.up(x), dg = sc.up(gain), dy = sc.fresh<float>(2), dr = sc.fresh<float>(2);
  cuda::rmsnorm_forward(dx.data(), dg.data(), 2, 1, 1e-5f, dy.data(), dr.data(), sc.ctx);
  EXPECT_TRUE(same_bits(dy.download(), y) && same_bits(dr.download(), rstd));
  auto g1 = sc.up(std::vector<float>{3.0f});
  EXPECT_EQ(cuda::sum_of_squares(g1.data(), 1, sc.ctx), 9.0);
}

}  // namespace
