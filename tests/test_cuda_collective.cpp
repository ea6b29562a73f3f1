// Several GPUs through NCCL (kernels/cuda/nccl_collective.h): the in-place sum over ranks gives every
// GPU the same bits, and with a power-of-two rank count exactly the CPU's balanced-tree sum
// (train::GradientSum over the ranks' vectors, as one process adds that many micro-batches). One
// thread per GPU stands in for one process per GPU: NCCL's ranks are the same either way. Needs
// NCCL in the build and at least one GPU (two for a real exchange); skipped with the reason otherwise.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "support/random.h"
#include "ops/backend.h"
#include "train/distributed.h"
#if defined(NIBBLE_HAVE_CUDA)
#include "kernels/cuda/cuda_error.h"
#endif
#if defined(NIBBLE_HAVE_NCCL)
#include "kernels/cuda/context.h"
#include "kernels/cuda/nccl_collective.h"
#endif

using namespace nibble;
using nibble_test::mixed_magnitude_floats;

TEST(CudaCollective, ThisBuildSaysWhetherItHasNccl) {
#if defined(NIBBLE_HAVE_NCCL)
  EXPECT_TRUE(ops::nccl_built());
#else
  EXPECT_FALSE(ops::nccl_built());
#if defined(NIBBLE_HAVE_CUDA)
  // A CUDA build without NCCL refuses several GPUs naming what to install.
  try {
    ops::new_cuda_collective_id();
    FAIL() << "a collective id without NCCL";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("NCCL"), std::string::npos) << e.what();
  }
#endif
#endif
}

#if defined(NIBBLE_HAVE_NCCL)

// Runs body(rank, context, group) on `ranks` threads, one GPU and one NCCL rank each (one thread per
// GPU stands in for one process per GPU); returns each rank's error, "" when it had none.
template <class Body>
std::vector<std::string> on_each_gpu(int ranks, Body body) {
  const cuda::CollectiveId id = cuda::new_collective_id();
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        cuda::Context ctx(r);
        cuda::Collective group(ctx, id, r, ranks);
        body(r, ctx, group);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

// `in` copied to the GPU of `ctx`, call(device pointer), and the values copied back.
template <class Call>
std::vector<float> on_device(cuda::Context& ctx, const std::vector<float>& in, Call call) {
  auto values = cuda::DeviceBuffer<float>::from_host(in, ctx.stream());
  call(values.data());
  std::vector<float> out(in.size());
  NIBBLE_CUDA_CHECK(cudaMemcpyAsync(out.data(), values.data(), values.bytes(), cudaMemcpyDeviceToHost, ctx.stream()));
  ctx.synchronize();
  return out;
}

// ranks GPUs (threads), each summing its own random vector; every rank's result must equal the CPU's
// tree for 2^k ranks, and agree between ranks (and with a double sum within FP32 rounding) otherwise.
void expect_sum_over_gpus(int ranks, size_t n) {
  std::vector<std::vector<float>> inputs, outputs(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) inputs.push_back(mixed_magnitude_floats(n, 77 + static_cast<uint32_t>(r)));
  const std::vector<std::string> errors = on_each_gpu(ranks, [&](int r, cuda::Context& ctx, cuda::Collective& group) {
    outputs[static_cast<size_t>(r)] = on_device(ctx, inputs[static_cast<size_t>(r)], [&](float* v) { group.sum(v, n); });
  });
  for (int r = 0; r < ranks; ++r) ASSERT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  for (int r = 1; r < ranks; ++r) EXPECT_EQ(outputs[static_cast<size_t>(r)], outputs[0]) << "rank " << r << " got other bits";
  if ((ranks & (ranks - 1)) == 0) {
    train::GradientSum tree(ops::cpu());
    for (const auto& v : inputs) tree.add(v);
    std::vector<float> expected(n);
    tree.finish(expected);
    EXPECT_EQ(outputs[0], expected) << ranks << " GPUs did not add in the CPU's tree order";
  } else {
    // ncclAllReduce's order: each sum of `ranks` terms is within (ranks - 1) u of sum |x|.
    for (size_t i = 0; i < n; i += 101) {
      double exact = 0, magnitude = 0;
      for (const auto& v : inputs) exact += v[i], magnitude += std::abs(v[i]);
      EXPECT_NEAR(outputs[0][i], exact, (ranks - 1) * std::ldexp(magnitude, -24) * 1.0001) << i;
    }
  }
}

// ZeRO-1's calls on `ranks` GPUs: each rank's slice of the reduce-scatter is the CPU's tree sum
// there (2^k ranks; the all-reduce's bits otherwise), and the all-gather gives every rank the owners'
// bits. Slices uneven, as optimizer_shards cuts them.
void expect_shard_collectives_over_gpus(int ranks, int64_t n) {
  std::vector<int64_t> bounds{0};
  for (int r = 1; r < ranks; ++r) bounds.push_back(n * r / ranks + (r % 2 ? 4099 : -77));
  bounds.push_back(n);
  std::vector<std::vector<float>> inputs, scattered(static_cast<size_t>(ranks)), gathered(static_cast<size_t>(ranks)),
      summed(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) inputs.push_back(mixed_magnitude_floats(static_cast<size_t>(n), 91 + static_cast<uint32_t>(r)));
  const std::vector<std::string> errors = on_each_gpu(ranks, [&](int r, cuda::Context& ctx, cuda::Collective& group) {
    const auto& in = inputs[static_cast<size_t>(r)];
    const size_t i = static_cast<size_t>(r);
    scattered[i] = on_device(ctx, in, [&](float* v) { group.reduce_scatter(v, bounds); });
    gathered[i] = on_device(ctx, in, [&](float* v) { group.all_gather(v, bounds); });
    summed[i] = on_device(ctx, in, [&](float* v) { group.sum(v, static_cast<size_t>(n)); });
  });
  for (int r = 0; r < ranks; ++r) ASSERT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  std::vector<float> expected = summed[0];
  if ((ranks & (ranks - 1)) == 0) {
    train::GradientSum tree(ops::cpu());
    for (const auto& v : inputs) tree.add(v);
    tree.finish(expected);
  }
  std::vector<float> owners(static_cast<size_t>(n));
  for (int r = 0; r < ranks; ++r)
    for (int64_t i = bounds[r]; i < bounds[r + 1]; ++i) {
      owners[static_cast<size_t>(i)] = inputs[static_cast<size_t>(r)][static_cast<size_t>(i)];
      ASSERT_EQ(scattered[static_cast<size_t>(r)][static_cast<size_t>(i)], expected[static_cast<size_t>(i)])
          << "rank " << r << " element " << i;
    }
  for (int r = 0; r < ranks; ++r) EXPECT_EQ(gathered[static_cast<size_t>(r)], owners) << "rank " << r;
}

class CudaCollectiveOnGpus : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto a = cuda::probe_devices();
    if (!a.available) GTEST_SKIP() << "skipping GPU test: " << a.reason;
    gpus_ = a.device_count;
  }
  int gpus_ = 0;
};

TEST_F(CudaCollectiveOnGpus, OneGpuIsItsOwnSum) { expect_sum_over_gpus(1, 1000); }

TEST_F(CudaCollectiveOnGpus, EveryGpuGetsTheCpuTreeSumBitwise) {
  if (gpus_ < 2) GTEST_SKIP() << "needs 2 GPUs for an exchange; this machine has " << gpus_;
  // Largest power of two that fits; more than one 16 Mi-float bucket, with a partial last one.
  int ranks = 1;
  while (ranks * 2 <= gpus_) ranks *= 2;
  expect_sum_over_gpus(ranks, (size_t{16} << 20) + 4099);
}

TEST_F(CudaCollectiveOnGpus, OneGpuOwnsEveryShard) { expect_shard_collectives_over_gpus(1, 1000); }

TEST_F(CudaCollectiveOnGpus, ShardCollectivesAreTheCpuTreeAndTheOwnersBits) {
  if (gpus_ < 2) GTEST_SKIP() << "needs 2 GPUs for an exchange; this machine has " << gpus_;
  int ranks = 1;
  while (ranks * 2 <= gpus_) ranks *= 2;
  expect_shard_collectives_over_gpus(ranks, (int64_t{16} << 20) * ranks + 4099);  // slices cross a bucket
  if (gpus_ >= 3) expect_shard_collectives_over_gpus(3, 100003);
}

TEST_F(CudaCollectiveOnGpus, OtherRankCountsAgreeOnEveryGpu) {
  if (gpus_ < 3) GTEST_SKIP() << "needs 3 GPUs for a rank count that is not a power of two; this machine has " << gpus_;
  expect_sum_over_gpus(3, 100003);
}

#endif
