// kernels/cuda/nccl_collective.cu's own code under the CUDA model and its NCCL model
// (cuda_model/nccl.h): threads as ranks on the model's device, buckets of 1000 floats
// (NIBBLE_NCCL_BUCKET_FLOATS), so the schedule of sends, receives, broadcasts and adds that a GPU job
// runs is executed here. With 2^k ranks the sum and each rank's slice of the reduce-scatter must be
// the CPU's balanced tree over ranks bit for bit (rank pairs first: train::GradientSum's order and
// the MPI path's, which test_distributed checks against it); the all-gather must copy every owner's
// bits. test_cuda_collective runs the same calls on real GPUs when a machine has two or more.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include <nccl.h>

#include "kernels/cuda/context.h"
#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/nccl_collective.h"
#include "support/random.h"

using namespace nibble;
using nibble_test::mixed_magnitude_floats;

namespace {

using Vectors = std::vector<std::vector<float>>;

// The balanced binary tree over 2^k ranks' vectors: ranks 2i and 2i+1 first, then pairs of pairs.
std::vector<float> tree_sum(Vectors level) {
  while (level.size() > 1) {
    Vectors next;
    for (size_t i = 0; i < level.size(); i += 2) {
      std::vector<float> s(level[i].size());
      for (size_t j = 0; j < s.size(); ++j) s[j] = level[i][j] + level[i + 1][j];
      next.push_back(std::move(s));
    }
    level = std::move(next);
  }
  return level[0];
}

Vectors random_inputs(int ranks, size_t n, uint32_t seed) {
  Vectors inputs;
  for (int r = 0; r < ranks; ++r) inputs.push_back(mixed_magnitude_floats(n, seed + static_cast<uint32_t>(r)));
  return inputs;
}

// Runs body(rank, collective, values on the device) on `ranks` threads, each a rank with its own
// context and a device copy of inputs[rank]; returns every rank's values afterwards.
template <class Body>
Vectors run_ranks(int ranks, const Vectors& inputs, Body body) {
  const cuda::CollectiveId id = [] {
    nccl_model::RankThread lock;  // ncclGetUniqueId touches the model's state
    return cuda::new_collective_id();
  }();
  Vectors outputs(static_cast<size_t>(ranks));
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      nccl_model::RankThread rank_thread;
      try {
        cuda::Context ctx(0);
        cuda::Collective group(ctx, id, r, ranks);
        auto values = cuda::DeviceBuffer<float>::from_host(inputs[static_cast<size_t>(r)], ctx.stream());
        body(r, group, values.data());
        auto& out = outputs[static_cast<size_t>(r)];
        out.resize(values.size());
        NIBBLE_CUDA_CHECK(cudaMemcpy(out.data(), values.data(), values.bytes(), cudaMemcpyDeviceToHost));
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
        // NaN in the rank's place, so that the caller's comparisons fail instead of reading past it.
        outputs[static_cast<size_t>(r)].assign(inputs[static_cast<size_t>(r)].size(), std::nanf(""));
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  return outputs;
}

// Slices as optimizer_shards cuts them: uneven (whole chunks, the last one short).
std::vector<int64_t> uneven_bounds(int ranks, int64_t n) {
  std::vector<int64_t> bounds{0};
  for (int r = 1; r < ranks; ++r) bounds.push_back(n * r / ranks + (r % 2 ? 37 : -53));
  bounds.push_back(n);
  return bounds;
}

}  // namespace

TEST(CudaModelCollective, SumIsTheTreeOverRanksOnEveryRank) {
  for (int ranks : {1, 2, 4}) {
    const size_t n = 2503;  // two whole buckets and a partial one
    const Vectors inputs = random_inputs(ranks, n, 11);
    const size_t before = nccl_model::messages();
    const Vectors out = run_ranks(ranks, inputs, [&](int, cuda::Collective& g, float* v) { g.sum(v, n); });
    const std::vector<float> expected = tree_sum(inputs);
    for (int r = 0; r < ranks; ++r) EXPECT_EQ(out[static_cast<size_t>(r)], expected) << ranks << " ranks, rank " << r;
    if (ranks > 1) EXPECT_GT(nccl_model::messages(), before);
  }
}

TEST(CudaModelCollective, ReduceScatterGivesEachRankTheTreeSumOfItsSlice) {
  for (int ranks : {2, 4, 8}) {
    const int64_t n = 4321;  // slices of ~500-2200 floats: some cross a bucket edge, some do not
    const Vectors inputs = random_inputs(ranks, static_cast<size_t>(n), 23);
    const std::vector<int64_t> bounds = uneven_bounds(ranks, n);
    const Vectors out =
        run_ranks(ranks, inputs, [&](int, cuda::Collective& g, float* v) { g.reduce_scatter(v, bounds); });
    const std::vector<float> expected = tree_sum(inputs);
    for (int r = 0; r < ranks; ++r) {
      const auto& mine = out[static_cast<size_t>(r)];
      for (int64_t i = bounds[r]; i < bounds[r + 1]; ++i)
        ASSERT_EQ(mine[static_cast<size_t>(i)], expected[static_cast<size_t>(i)])
            << ranks << " ranks: rank " << r << " element " << i << " of its slice [" << bounds[r] << ", "
            << bounds[r + 1] << ")";
    }
  }
}

TEST(CudaModelCollective, ReduceScatterWithLongSlicesCrossesBucketsOnBothSides) {
  // Two ranks with slices of 1 and 2999 floats: one side sends three buckets while it receives one.
  const std::vector<int64_t> bounds{0, 1, 3000};
  const Vectors inputs = random_inputs(2, 3000, 31);
  const Vectors out = run_ranks(2, inputs, [&](int, cuda::Collective& g, float* v) { g.reduce_scatter(v, bounds); });
  const std::vector<float> expected = tree_sum(inputs);
  EXPECT_EQ(out[0][0], expected[0]);
  EXPECT_EQ(std::vector<float>(out[1].begin() + 1, out[1].end()), std::vector<float>(expected.begin() + 1, expected.end()));
}

// ZeRO-2 on GPUs (train/distributed_mpi.cpp's reduce_scatter_on_device): the arena's stretches
// reduce-scattered one at a time as the backward pass completes them, from the end, each with every
// rank's slice cut to it, give every rank's slice the whole reduce-scatter's bits (the same partners
// and order, element by element). Stretches cross slice boundaries and the 1000-float NCCL buckets.
TEST(CudaModelCollective, ReduceScatterStretchByStretchIsTheWholeOnesBits) {
  for (int ranks : {2, 4}) {
    const int64_t n = 4321;
    const Vectors inputs = random_inputs(ranks, static_cast<size_t>(n), 29);
    const std::vector<int64_t> bounds = uneven_bounds(ranks, n);
    const std::vector<int64_t> stretches{n, 3100, 2999, 1700, 1699, 400, 0};  // completion points, from the end
    const Vectors out = run_ranks(ranks, inputs, [&](int, cuda::Collective& g, float* v) {
      for (size_t s = 0; s + 1 < stretches.size(); ++s) {
        const int64_t begin = stretches[s + 1], end = stretches[s];
        std::vector<int64_t> within;
        for (int64_t b : bounds) within.push_back(std::clamp(b, begin, end) - begin);
        g.reduce_scatter(v + begin, within);
      }
    });
    const std::vector<float> expected = tree_sum(inputs);
    for (int r = 0; r < ranks; ++r)
      for (int64_t i = bounds[r]; i < bounds[r + 1]; ++i)
        ASSERT_EQ(out[static_cast<size_t>(r)][static_cast<size_t>(i)], expected[static_cast<size_t>(i)])
            << ranks << " ranks: rank " << r << " element " << i;
  }
}

TEST(CudaModelCollective, ReduceScatterWithThreeRanksIsTheAllReduceInEverySlice) {
  const int64_t n = 1500;
  const Vectors inputs = random_inputs(3, static_cast<size_t>(n), 41);
  const std::vector<int64_t> bounds = uneven_bounds(3, n);
  const Vectors sums = run_ranks(3, inputs, [&](int, cuda::Collective& g, float* v) { g.sum(v, n); });
  const Vectors out = run_ranks(3, inputs, [&](int, cuda::Collective& g, float* v) { g.reduce_scatter(v, bounds); });
  for (int r = 0; r < 3; ++r)
    for (int64_t i = bounds[r]; i < bounds[r + 1]; ++i)
      ASSERT_EQ(out[static_cast<size_t>(r)][static_cast<size_t>(i)], sums[0][static_cast<size_t>(i)]) << r << " " << i;
}

TEST(CudaModelCollective, AllGatherCopiesEveryOwnersSliceToEveryRank) {
  for (int ranks : {1, 2, 3, 4}) {
    const int64_t n = 2222;
    const std::vector<int64_t> bounds = uneven_bounds(ranks, n);
    // Rank r's vector holds its slice's values and NaN elsewhere: any slice copied from a non-owner shows.
    Vectors inputs(static_cast<size_t>(ranks), std::vector<float>(static_cast<size_t>(n), std::nanf("")));
    std::vector<float> expected(static_cast<size_t>(n));
    const std::vector<float> values = mixed_magnitude_floats(static_cast<size_t>(n), 53);
    for (int r = 0; r < ranks; ++r)
      for (int64_t i = bounds[r]; i < bounds[r + 1]; ++i)
        inputs[static_cast<size_t>(r)][static_cast<size_t>(i)] = expected[static_cast<size_t>(i)] =
            values[static_cast<size_t>(i)];
    const Vectors out = run_ranks(ranks, inputs, [&](int, cuda::Collective& g, float* v) { g.all_gather(v, bounds); });
    for (int r = 0; r < ranks; ++r) EXPECT_EQ(out[static_cast<size_t>(r)], expected) << ranks << " ranks, rank " << r;
  }
}
