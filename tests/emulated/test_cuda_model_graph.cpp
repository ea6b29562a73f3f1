// Stream capture and CUDA graphs under the CUDA model (emulated/cuda_model/): what a captured
// training step may contain and how a replay behaves. A graph records nibble's own kernels, async
// copies, memsets and cuBLASLt GEMMs, and replays them bitwise as eager execution would run them,
// with the kernel arguments and cuBLASLt's host scalars of the capture and the copies' sources
// read at replay (the pinned staging a step's inputs go through). The operations that break a
// capture (a host read, an allocation, a pageable copy, the legacy stream) are named by the model:
// the list of what keeps nibble's step out of a graph today comes from these.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <string>
#include <vector>

#include "common/hash.h"
#include "format/quantize.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/layers.h"
#include "kernels/cuda/quantize.h"
#include "kernels/cuda/step_graph.h"
#include "support/check.h"
#include "support/random.h"

using namespace nibble;
using nibble_test::normal_floats;
using nibble_test::same_bits;

namespace {

// Host memory a captured copy may use (cudaMallocHost), as a typed span owner.
template <class T>
struct Pinned {
  explicit Pinned(size_t n) : count(n) {
    void* p = nullptr;
    EXPECT_EQ(cudaMallocHost(&p, n * sizeof(T)), cudaSuccess);
    data = static_cast<T*>(p);
  }
  ~Pinned() { cudaFreeHost(data); }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
  void set(const std::vector<T>& v) { std::memcpy(data, v.data(), v.size() * sizeof(T)); }
  T* data = nullptr;
  size_t count;
};

// A small step: tokens staged from pinned memory into a fixed buffer, embedding, RMSNorm, an FP32
// GEMM of the normed rows by a weight (cuBLASLt, host alpha), AdamW on the weight with the GEMM's
// output as its gradient (shapes: tokens [n], table [vocab, width], y [n, width], w [width, width]).
struct TinyStep {
  static constexpr int64_t n = 16, vocab = 11, width = 32;
  cuda::Context& ctx;
  cuda::DeviceBuffer<int32_t> tokens;
  cuda::DeviceBuffer<float> table, gain, x, y, rstd, w, m, v, grad;
  cuda::DeviceBuffer<uint8_t> mask;
  explicit TinyStep(cuda::Context& c)
      : ctx(c),
        tokens(n, c.stream()),
        table(cuda::DeviceBuffer<float>::from_host(normal_floats(vocab * width, 1), c.stream())),
        gain(cuda::DeviceBuffer<float>::from_host(normal_floats(width, 2), c.stream())),
        x(n * width, c.stream()),
        y(n * width, c.stream()),
        rstd(n, c.stream()),
        w(cuda::DeviceBuffer<float>::from_host(normal_floats(width * width, 3, 0.1f), c.stream())),
        m(cuda::DeviceBuffer<float>::from_host(std::vector<float>(width * width, 0.0f), c.stream())),
        v(cuda::DeviceBuffer<float>::from_host(std::vector<float>(width * width, 0.0f), c.stream())),
        grad(width * width, c.stream()),
        mask(cuda::DeviceBuffer<uint8_t>::from_host(std::vector<uint8_t>(width * width, 1), c.stream())) {}
  // args: AdamW's constants, host values: a graph keeps the ones of its capture.
  void run(const int32_t* pinned_tokens, const cuda::AdamWArgs& args) {
    ASSERT_EQ(cudaMemcpyAsync(tokens.data(), pinned_tokens, n * sizeof(int32_t), cudaMemcpyHostToDevice, ctx.stream()),
              cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(grad.data(), 0, grad.bytes(), ctx.stream()), cudaSuccess);
    cuda::embedding_forward(tokens.data(), n, table.data(), width, x.data(), ctx);
    cuda::rmsnorm_forward(x.data(), gain.data(), n, width, 1e-5f, y.data(), rstd.data(), ctx);
    // grad[width, width] = y^T y / n (column-major view of the row-major [n, width] rows).
    cuda::gemm_f32(Trans::no, Trans::yes, width, width, n, 1.0f / n, y.data(), width, y.data(), width,
                   0.0f, grad.data(), width, ctx);
    cuda::adamw_update(args, grad.data(), m.data(), v.data(), w.data(), mask.data(), width * width, ctx);
  }
};

std::vector<int32_t> tokens_of(int step) {
  std::vector<int32_t> t(TinyStep::n);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>((i * 7 + static_cast<size_t>(step) * 3) % TinyStep::vocab);
  return t;
}

constexpr cuda::AdamWArgs kArgs{1.0f, 0.9f, 0.95f, 0.1f, 0.05f, 1e-4f, 1e-2f, 1e-8f};

// Begins a capture, runs body (an exception from a refused call is the expected outcome too), ends
// it: the reason the model gives for the broken capture, or "" when the graph came out (destroyed).
template <class Body>
std::string capture_breaks(cuda::Context& ctx, Body body) {
  EXPECT_EQ(cudaStreamBeginCapture(ctx.stream(), cudaStreamCaptureModeGlobal), cudaSuccess);
  try {
    body();
  } catch (const std::exception&) {
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(ctx.stream(), &graph);
  cudaGetLastError();  // the breaking call's sticky error
  if (end == cudaSuccess) {
    cudaGraphDestroy(graph);
    return "";
  }
  EXPECT_EQ(end, cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(graph, nullptr);
  return cuda_model::capture_invalidation_reason();
}

}  // namespace

TEST(CudaModelGraph, AReplayedStepIsTheEagerStepsBitsWithNewInputsFromPinnedMemory) {
  Pinned<int32_t> staged(TinyStep::n);
  cuda::Context eager_ctx, graph_ctx;
  TinyStep eager(eager_ctx), graphed(graph_ctx);
  // Capture: nothing runs (the weight keeps its bits), the graph holds one node per operation.
  const std::vector<float> w0 = graphed.w.download();
  const uint64_t launches_before = cuda_model::launches();
  ASSERT_EQ(cudaStreamBeginCapture(graph_ctx.stream(), cudaStreamCaptureModeGlobal), cudaSuccess);
  cudaStreamCaptureStatus status{};
  ASSERT_EQ(cudaStreamIsCapturing(graph_ctx.stream(), &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  staged.set(tokens_of(0));
  graphed.run(staged.data, kArgs);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(graph_ctx.stream(), &graph), cudaSuccess) << cuda_model::capture_invalidation_reason();
  EXPECT_EQ(cuda_model::launches(), launches_before);
  EXPECT_TRUE(same_bits(graphed.w.download(), w0));
  size_t nodes = 0;
  ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
  EXPECT_EQ(nodes, 6u);  // copy, memset, embedding, RMSNorm, GEMM, AdamW
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  cudaGraphDestroy(graph);  // the executable graph is independent of it
  // Steps: new tokens each time, written to the pinned buffer before the replay.
  for (int step = 0; step < 4; ++step) {
    staged.set(tokens_of(step));
    eager.run(staged.data, kArgs);
    ASSERT_EQ(cudaGraphLaunch(exec, graph_ctx.stream()), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(graph_ctx.stream()), cudaSuccess);
    EXPECT_TRUE(same_bits(graphed.y.download(), eager.y.download())) << "step " << step;
    EXPECT_TRUE(same_bits(graphed.w.download(), eager.w.download())) << "step " << step;
    EXPECT_TRUE(same_bits(graphed.m.download(), eager.m.download())) << "step " << step;
  }
  EXPECT_FALSE(same_bits(graphed.w.download(), w0));  // the replays did run
  cudaGraphExecDestroy(exec);
}

// A kernel argument or a cuBLASLt host scalar is the capture's value at every replay: a per-step
// value passed by value (AdamW's bias corrections, a host-derived SR seed) replays stale.
TEST(CudaModelGraph, KernelArgumentsAndHostScalarsAreFrozenAtCapture) {
  Pinned<int32_t> staged(TinyStep::n);
  staged.set(tokens_of(1));
  cuda::Context eager_ctx, graph_ctx, fresh_ctx;
  TinyStep frozen(eager_ctx), graphed(graph_ctx), fresh(fresh_ctx);
  ASSERT_EQ(cudaStreamBeginCapture(graph_ctx.stream(), cudaStreamCaptureModeGlobal), cudaSuccess);
  graphed.run(staged.data, kArgs);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(graph_ctx.stream(), &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  cuda::AdamWArgs later = kArgs;
  later.bias1 = 0.19f;  // what step 2 would pass
  later.lr = 2e-2f;
  for (int step = 0; step < 2; ++step) {
    frozen.run(staged.data, kArgs);
    fresh.run(staged.data, step == 0 ? kArgs : later);
    ASSERT_EQ(cudaGraphLaunch(exec, graph_ctx.stream()), cudaSuccess);
  }
  EXPECT_TRUE(same_bits(graphed.w.download(), frozen.w.download()));
  EXPECT_FALSE(same_bits(graphed.w.download(), fresh.w.download()));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// Each operation a captured step must not contain breaks the capture, and the model names it.
TEST(CudaModelGraph, HostReadsAllocationsPageableCopiesAndTheLegacyStreamBreakACapture) {
  cuda::Context ctx;
  auto x = cuda::DeviceBuffer<float>::from_host(normal_floats(64 * 64, 5), ctx.stream());
  std::vector<float> pageable(16, 1.0f);
  EXPECT_NE(capture_breaks(ctx, [&] { cudaStreamSynchronize(ctx.stream()); }).find("cudaStreamSynchronize"),
            std::string::npos);
  EXPECT_NE(capture_breaks(ctx, [&] { cuda::DeviceBuffer<float> scratch(64, ctx.stream()); }).find("allocation of 256"),
            std::string::npos);
  EXPECT_NE(capture_breaks(ctx, [&] {
              cudaMemcpyAsync(x.data(), pageable.data(), 64, cudaMemcpyHostToDevice, ctx.stream());
            }).find("pageable"),
            std::string::npos);
  EXPECT_NE(capture_breaks(ctx, [&] { cudaMemcpy(x.data(), pageable.data(), 64, cudaMemcpyHostToDevice); })
                .find("legacy (null) stream"),
            std::string::npos);
  EXPECT_NE(capture_breaks(ctx, [&] { cudaDeviceSynchronize(); }).find("cudaDeviceSynchronize"), std::string::npos);
  // nibble's own calls that a step makes today: the gradient norm is read on the host, and a
  // quantization allocates its outputs (cuda::DeviceQuantized per call).
  EXPECT_NE(capture_breaks(ctx, [&] { (void)cuda::sum_of_squares(x.data(), 64 * 64, ctx); }), "");
  EXPECT_NE(capture_breaks(ctx, [&] { (void)cuda::quantize(x.data(), 64, 64, QuantOptions{}, ctx); })
                .find("allocation"),
            std::string::npos);
  // After a broken capture the stream works eagerly again.
  EXPECT_EQ(capture_breaks(ctx, [&] { cudaMemsetAsync(x.data(), 0, 64, ctx.stream()); }), "");
  cudaStreamCaptureStatus status{};
  ASSERT_EQ(cudaStreamIsCapturing(ctx.stream(), &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  EXPECT_EQ(x.download().size(), 64u * 64u);
}

namespace {
bool same_quantized(const QuantizedTensor& a, const QuantizedTensor& b) {
  return a.codes == b.codes && a.scales == b.scales && std::bit_cast<uint32_t>(a.amax) == std::bit_cast<uint32_t>(b.amax) &&
         std::bit_cast<uint32_t>(a.decode_scale) == std::bit_cast<uint32_t>(b.decode_scale);
}
QuantOptions with_seed(QuantOptions o, uint64_t seed) {
  o.seed = seed;
  return o;
}
}  // namespace

// KernelOptions::sr_step_hash: the kernels combine the micro-step's hash, read from device memory
// when they run, with the quantization's salt (opt.seed): the bits of the reference quantized with
// the host's seed sr_seed_of(hash, salt), for each SR path (NVFP4 1x16 row-wise, the fused pair with
// a 1x16 column-wise copy with RHT, 16x16 tiles, the transposed copy alone, MXFP4), and a new hash
// written into the buffer (a pinned copy, as before a graph replay) gives the next micro-step's bits.
TEST(CudaModelGraph, SrSeedsFromADeviceStepHashAndASaltAreTheHostSeedsBits) {
  const int64_t rows = 32, cols = 64;
  const auto x = nibble_test::floats_with_outliers(rows * cols, 91);
  QuantOptions row, col, tile, mx;
  row.rounding = col.rounding = tile.rounding = mx.rounding = Rounding::stochastic;
  row.seed = 0x0102;  // salts, as recipe's sr_salt makes them
  col.seed = 0x0107;
  col.rht = true;
  tile.tile_16x16 = true;
  tile.seed = 0x0200;
  mx.format = Format::mxfp4;
  mx.seed = 0x0301;
  cuda::Context ctx;
  auto dx = cuda::DeviceBuffer<float>::from_host(x, ctx.stream());
  Pinned<uint64_t> staged(1);
  cuda::DeviceBuffer<uint64_t> step_hash(1, ctx.stream());
  cuda::KernelOptions kopt;
  kopt.sr_step_hash = step_hash.data();
  for (int64_t step = 0; step < 3; ++step) {
    const uint64_t h = mix64(mix64(2024) ^ static_cast<uint64_t>(step));
    staged.data[0] = h;
    ASSERT_EQ(cudaMemcpyAsync(step_hash.data(), staged.data, sizeof(uint64_t), cudaMemcpyHostToDevice, ctx.stream()),
              cudaSuccess);
    const auto seeded = [&](const QuantOptions& o) { return with_seed(o, sr_seed_of(h, o.seed)); };
    const std::string at = "step " + std::to_string(step);
    EXPECT_TRUE(same_quantized(cuda::to_host(cuda::quantize(dx.data(), rows, cols, row, ctx, kopt)),
                               ref::quantize(x, rows, cols, seeded(row))))
        << at;
    const cuda::QuantizedPair pair = cuda::quantize_both(dx.data(), rows, cols, row, col, ctx, kopt);
    EXPECT_TRUE(same_quantized(cuda::to_host(pair.rowwise), ref::quantize(x, rows, cols, seeded(row)))) << at;
    EXPECT_TRUE(same_quantized(cuda::to_host(pair.columnwise), ref::quantize_transposed(x, rows, cols, seeded(col))))
        << at;
    const cuda::QuantizedPair tiles = cuda::quantize_both(dx.data(), rows, cols, tile, tile, ctx, kopt);
    EXPECT_TRUE(same_quantized(cuda::to_host(tiles.rowwise), ref::quantize(x, rows, cols, seeded(tile)))) << at;
    EXPECT_TRUE(same_quantized(cuda::to_host(tiles.columnwise), ref::quantize_transposed(x, rows, cols, seeded(tile))))
        << at;
    EXPECT_TRUE(same_quantized(cuda::to_host(cuda::quantize_transposed(dx.data(), rows, cols, col, ctx, kopt)),
                               ref::quantize_transposed(x, rows, cols, seeded(col))))
        << at;
    EXPECT_TRUE(same_quantized(cuda::to_host(cuda::quantize(dx.data(), rows, cols, mx, ctx, kopt)),
                               ref::quantize(x, rows, cols, seeded(mx))))
        << at;
    // Not the salt alone, nor the hash alone: both enter the seed.
    EXPECT_FALSE(same_quantized(cuda::to_host(cuda::quantize(dx.data(), rows, cols, row, ctx, kopt)),
                                ref::quantize(x, rows, cols, row)))
        << at;
  }
}

// cuda::StepGraph: one capture per key, replays that are the eager steps' bits, a new key (other
// buffers) captured again, and work that cannot be captured (a quantization allocates its outputs)
// run eagerly with the reason, without a new capture attempt for the same key.
TEST(CudaModelGraph, AStepGraphCapturesOncePerKeyReplaysBitwiseAndFallsBackEagerlyWithAReason) {
  Pinned<int32_t> staged(TinyStep::n);
  cuda::Context eager_ctx, graph_ctx;
  TinyStep eager(eager_ctx), graphed(graph_ctx), eager_b(eager_ctx), graphed_b(graph_ctx);
  cuda::StepGraph graph;
  const auto key_of = [](const TinyStep& s) {
    return cuda::StepGraph::Key{TinyStep::n, reinterpret_cast<uintptr_t>(s.tokens.data()),
                                reinterpret_cast<uintptr_t>(s.w.data())};
  };
  for (int step = 0; step < 4; ++step) {
    staged.set(tokens_of(step));
    eager.run(staged.data, kArgs);
    EXPECT_TRUE(graph.run(graph_ctx, key_of(graphed), [&] { graphed.run(staged.data, kArgs); }))
        << graph.fallback_reason();
    EXPECT_TRUE(same_bits(graphed.w.download(), eager.w.download())) << "step " << step;
    EXPECT_TRUE(same_bits(graphed.y.download(), eager.y.download())) << "step " << step;
  }
  EXPECT_EQ(graph.captures(), 1);
  staged.set(tokens_of(9));
  eager_b.run(staged.data, kArgs);
  EXPECT_TRUE(graph.run(graph_ctx, key_of(graphed_b), [&] { graphed_b.run(staged.data, kArgs); }));
  EXPECT_EQ(graph.captures(), 2);
  EXPECT_TRUE(same_bits(graphed_b.w.download(), eager_b.w.download()));

  const int64_t rows = 32, cols = 64;
  const auto x = normal_floats(rows * cols, 17);
  auto dx = cuda::DeviceBuffer<float>::from_host(x, graph_ctx.stream());
  cuda::StepGraph eager_only;
  for (int run = 0; run < 2; ++run) {
    cuda::DeviceQuantized q;
    EXPECT_FALSE(eager_only.run(graph_ctx, {1}, [&] { q = cuda::quantize(dx.data(), rows, cols, QuantOptions{}, graph_ctx); }));
    EXPECT_NE(eager_only.fallback_reason().find("cudaMallocAsync"), std::string::npos) << eager_only.fallback_reason();
    EXPECT_TRUE(same_quantized(cuda::to_host(q), ref::quantize(x, rows, cols, QuantOptions{})));
  }
  EXPECT_EQ(eager_only.captures(), 1);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}
