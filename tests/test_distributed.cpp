// Data parallelism (train/distributed.h): the split of the global batch between ranks, the
// fixed-tree gradient sum that makes ranks and one process add in the same order, and, when nibble
// is built with MPI, `mpirun --oversubscribe -np 2 nibble train` end to end on loopback: bitwise
// equality with one process, a tolerance for the row split, resume across rank counts, a rank that
// dies, and an indivisible batch.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/pages.h"
#include "data/data.h"
#include "kernels/cpu/quantize/quantize.h"
#include "model/params.h"
#include "model/transformer.h"
#include "ops/backend.h"
#include "train/distributed.h"
#include "train/optimizer.h"
#include "train/trainer.h"
#include "train/weight_shards.h"
#include "support/cli.h"
#include "support/random.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;
using namespace nibble;
using nibble_test::mixed_magnitude_floats;
using train::DataParallelPlan;

namespace {

std::vector<float> tree_sum(const std::vector<std::vector<float>>& leaves, size_t first, size_t count) {
  train::GradientSum sum(ops::cpu());
  for (size_t i = first; i < first + count; ++i) sum.add(leaves[i]);
  std::vector<float> out(leaves[0].size());
  sum.finish(out);
  return out;
}

}  // namespace

TEST(DataParallelPlan, OneProcessRunsEveryMicroBatchWhole) {
  const DataParallelPlan plan(12, 3, 0, 1);
  EXPECT_EQ(plan.split(), DataParallelPlan::Split::none);
  ASSERT_EQ(plan.slices().size(), 3u);
  for (int64_t m = 0; m < 3; ++m) {
    EXPECT_EQ(plan.slices()[m].micro_batch, m);
    EXPECT_EQ(plan.slices()[m].first_row, 0);
    EXPECT_EQ(plan.slices()[m].rows, 12);
  }
  EXPECT_FLOAT_EQ(plan.gradient_scale(), 1.0f / 3.0f);
  EXPECT_TRUE(plan.bitwise_equal_to_one_process());
}

TEST(DataParallelPlan, SlicesCoverTheGlobalBatchExactlyOnce) {
  for (auto [batch, accum] : {std::pair<int64_t, int64_t>{4, 4}, {8, 1}, {4, 2}, {6, 3}}) {
    for (int ranks : {1, 2, 4}) {
      if (accum % ranks != 0 && batch % ranks != 0) continue;
      std::set<std::pair<int64_t, int64_t>> rows_seen;  // (micro-batch, row)
      std::set<int64_t> slots;
      double total_scale = 0;
      for (int rank = 0; rank < ranks; ++rank) {
        const DataParallelPlan plan(batch, accum, rank, ranks);
        for (const auto& s : plan.slices()) {
          EXPECT_TRUE(slots.insert(s.loss_slot).second);
          EXPECT_LT(s.loss_slot, plan.loss_slots());
          for (int64_t r = s.first_row; r < s.first_row + s.rows; ++r)
            EXPECT_TRUE(rows_seen.insert({s.micro_batch, r}).second) << "row drawn twice";
          total_scale += plan.gradient_scale();
        }
      }
      EXPECT_EQ(rows_seen.size(), static_cast<size_t>(batch * accum)) << batch << "x" << accum << " on " << ranks;
      EXPECT_NEAR(total_scale, 1.0, 1e-6);  // the slices' gradients add up to the mean over the global batch
    }
  }
}

TEST(DataParallelPlan, PrefersWholeMicroBatchesThenRowsAndRefusesTheRest) {
  EXPECT_EQ(DataParallelPlan(2, 4, 1, 2).split(), DataParallelPlan::Split::micro_batches);
  EXPECT_EQ(DataParallelPlan(2, 4, 1, 2).slices().front().micro_batch, 2);
  EXPECT_TRUE(DataParallelPlan(2, 4, 1, 2).bitwise_equal_to_one_process());
  EXPECT_FALSE(DataParallelPlan(2, 6, 1, 2).bitwise_equal_to_one_process());  // 3 leaves per rank: not a subtree
  const DataParallelPlan rows(4, 1, 1, 2);
  EXPECT_EQ(rows.split(), DataParallelPlan::Split::rows);
  EXPECT_EQ(rows.slices().front().first_row, 2);
  EXPECT_EQ(rows.slices().front().rows, 2);
  EXPECT_FALSE(rows.bitwise_equal_to_one_process());
  try {
    DataParallelPlan(3, 1, 0, 2);
    FAIL() << "an indivisible batch was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("grad_accum"), std::string::npos) << e.what();
  }
}

TEST(GradientSum, RankSubtreesAddUpToTheOneProcessTreeBitwise) {
  constexpr size_t kN = 4099;
  std::vector<std::vector<float>> leaves;
  for (uint32_t i = 0; i < 8; ++i) leaves.push_back(mixed_magnitude_floats(kN, 100 + i));
  const std::vector<float> one_process = tree_sum(leaves, 0, 8);
  // 2 ranks of 4 leaves, 4 ranks of 2 leaves, 8 ranks of 1: each rank's tree, then the butterfly
  // over ranks (pairs, then pairs of pairs), as Communicator::sum_gradients does.
  for (size_t ranks : {2u, 4u, 8u}) {
    const size_t per_rank = 8 / ranks;
    std::vector<std::vector<float>> partial;
    for (size_t r = 0; r < ranks; ++r) partial.push_back(tree_sum(leaves, r * per_rank, per_rank));
    for (size_t width = 1; width < ranks; width *= 2)
      for (size_t r = 0; r < ranks; r += 2 * width)
        for (size_t i = 0; i < kN; ++i) partial[r][i] = partial[r][i] + partial[r + width][i];
    EXPECT_EQ(partial[0], one_process) << ranks << " ranks";
  }
  // And the fixed order matters: a left-to-right sum gives other bits for these numbers.
  std::vector<float> sequential(kN, 0.0f);
  for (const auto& leaf : leaves)
    for (size_t i = 0; i < kN; ++i) sequential[i] += leaf[i];
  EXPECT_NE(sequential, one_process);
}

TEST(GradientSum, SingleLeafAndUnevenCountsAndReuse) {
  const auto a = mixed_magnitude_floats(10, 1), b = mixed_magnitude_floats(10, 2), c = mixed_magnitude_floats(10, 3);
  train::GradientSum sum(ops::cpu());
  std::vector<float> out(10);
  sum.add(a);
  sum.finish(out);
  EXPECT_EQ(out, a);
  for (const auto* leaf : {&a, &b, &c}) sum.add(*leaf);
  sum.finish(out);
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(out[i], (a[i] + b[i]) + c[i]);
  EXPECT_EQ(sum.leaves(), 0);
}

// ZeRO-2 finishes the last micro-batch's tree sum piece by piece as the backward pass completes
// them: every leaf count (landing levels 0-3, uneven trees), pieces of uneven lengths in backward
// order, each the bits of add(last) + finish(last); the sum is reusable afterwards.
TEST(GradientSum, PiecewiseFinishWithTheLastLeafIsTheWholeFinishBitwise) {
  constexpr size_t kN = 1031;
  for (uint32_t count = 1; count <= 9; ++count) {
    std::vector<std::vector<float>> leaves;
    for (uint32_t i = 0; i < count; ++i) leaves.push_back(mixed_magnitude_floats(kN, 40 * count + i));
    train::GradientSum whole(ops::cpu()), pieces(ops::cpu());
    for (const auto& leaf : leaves) whole.add(leaf);
    std::vector<float> expected(kN);
    whole.finish(expected);
    for (int round = 0; round < 2; ++round) {  // the second round reuses the state start_over left
      for (uint32_t i = 0; i + 1 < count; ++i) pieces.add(leaves[i]);
      std::vector<float> last = leaves.back();
      for (int64_t end = kN, first; end > 0; end = first) {
        first = std::max<int64_t>(0, end - 1 - (end * 7919) % 300);
        pieces.finish_piece_with_last(last, first, end);
      }
      pieces.start_over();
      EXPECT_EQ(last, expected) << count << " leaves, round " << round;
      EXPECT_EQ(pieces.leaves(), 0);
    }
  }
}

// release_to_zero (the CPU's discard_to_zero): zeros in place, the neighbours of an unaligned span untouched.
TEST(GradientSum, ReleasedMemoryReadsAsZerosAndSparesItsNeighbours) {
  std::vector<float> v = mixed_magnitude_floats(50000, 8);
  const std::vector<float> before = v;
  release_to_zero(v.data() + 777, 30001 * sizeof(float));
  for (size_t i = 0; i < v.size(); ++i) {
    if (i >= 777 && i < 777 + 30001) ASSERT_EQ(v[i], 0.0f) << i;
    else ASSERT_EQ(v[i], before[i]) << i;
  }
  release_to_zero(v.data() + 3, 5 * sizeof(float));  // no whole page inside
  for (size_t i = 3; i < 8; ++i) EXPECT_EQ(v[i], 0.0f);
  EXPECT_EQ(v[2], before[2]);
  EXPECT_EQ(v[8], before[8]);
}

// The backward pass announces completed suffixes of the arena at the points the config predicts,
// and a suffix announced complete already holds its final gradients (tied and untied heads).
TEST(GradientSum, BackwardAnnouncesCompletedSuffixesOfTheArena) {
  for (bool tied : {true, false}) {
    model::ModelConfig c;
    c.vocab = 61;
    c.layers = 3;
    c.heads = 2;
    c.width = 32;
    c.context = 16;
    c.tied_embeddings = tied;
    model::Transformer m(c, ops::cpu(), 5);
    std::vector<int32_t> tokens(2 * 16), targets(2 * 16);
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<int32_t>((i * 7) % 61);
      targets[i] = static_cast<int32_t>((i * 11 + 3) % 61);
    }
    model::ModelStep ms;
    m.params().zero_grads();
    m.forward(tokens, targets, 2, 16, ms);
    std::vector<int64_t> points;
    std::vector<std::vector<float>> suffixes;
    m.backward(1.0f, [&](int64_t first) {
      points.push_back(first);
      suffixes.emplace_back(m.params().grads().begin() + first, m.params().grads().end());
    });
    EXPECT_EQ(points, model::Transformer::gradient_completion_points(c)) << "tied " << tied;
    ASSERT_EQ(points.back(), 0);
    for (size_t i = 0; i < points.size(); ++i)
      EXPECT_EQ(suffixes[i], std::vector<float>(m.params().grads().begin() + points[i], m.params().grads().end()))
          << "tied " << tied << ", the suffix from " << points[i] << " changed after it was announced";
  }
}

// device=cuda under mpirun: one GPU per rank, chosen from the rank's place on its host.
TEST(GpuPerRank, EachRankOnAHostTakesItsOwnGpu) {
  for (int r = 0; r < 4; ++r) EXPECT_EQ(train::gpu_of_rank(r, 4, 8, "node1"), r);
  // Each rank sees one GPU (CUDA_VISIBLE_DEVICES per rank, as Slurm sets it): its own, ordinal 0.
  EXPECT_EQ(train::gpu_of_rank(3, 4, 1, "node1"), 0);
  try {
    train::gpu_of_rank(2, 4, 2, "node1");
    FAIL() << "4 ranks shared 2 GPUs";
  } catch (const UsageError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("4 ranks run on host node1, which has 2 GPUs"), std::string::npos) << m;
    EXPECT_NE(m.find("mpirun -np 2"), std::string::npos) << m;
  }
  EXPECT_THROW(train::gpu_of_rank(0, 2, 0, "node1"), UsageError);
}

TEST(GpuPerRank, RanksThatShareAGpuAreNamed) {
  EXPECT_EQ(train::ranks_sharing_a_gpu({11, 22, 33}), "");
  EXPECT_EQ(train::ranks_sharing_a_gpu({11}), "");
  const std::string m = train::ranks_sharing_a_gpu({11, 22, 33, 22});
  EXPECT_NE(m.find("ranks 1 and 3 would train on the same GPU"), std::string::npos) << m;
  EXPECT_NE(m.find("CUDA_VISIBLE_DEVICES"), std::string::npos) << m;
}

TEST(BatchSampler, RowSlicesConcatenateToTheWholeBatch) {
  std::vector<int32_t> tokens(5000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i % 97);
  const train::BatchSampler sampler(&tokens, 16, 7);
  std::vector<int32_t> all_in, all_tg, in, tg;
  sampler.sample(5, 6, all_in, all_tg);
  std::vector<int32_t> joined_in, joined_tg;
  for (int64_t first : {0, 2, 4}) {
    sampler.sample_rows(5, first, 2, in, tg);
    joined_in.insert(joined_in.end(), in.begin(), in.end());
    joined_tg.insert(joined_tg.end(), tg.begin(), tg.end());
  }
  EXPECT_EQ(joined_in, all_in);
  EXPECT_EQ(joined_tg, all_tg);
}

TEST(Communicator, SingleProcessIsTheIdentityAndReplicasAgree) {
  train::SingleProcessCommunicator comm;
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);
  auto v = mixed_magnitude_floats(100, 9);
  const auto before = v;
  comm.sum_gradients(v);
  EXPECT_EQ(v, before);
  EXPECT_TRUE(train::check_replicas_identical(comm, v, 1).empty());
  auto flipped = v;
  flipped[50] = std::nextafter(flipped[50], 1e9f);
  EXPECT_NE(train::weights_checksum(v), train::weights_checksum(flipped));
}

// ZeRO-1's slices: whole chunks of the gradient norm's summation unit, every element owned once,
// sizes within a chunk of each other, and a rank count above the chunk count refused.
TEST(OptimizerShards, WholeChunksCoverTheArenaAndARankWithNothingIsRefused) {
  constexpr int64_t kChunk = ops::kSumOfSquaresChunk;
  for (int64_t n : {kChunk * 4, kChunk * 7 + 1, kChunk * 9 - 5}) {
    for (int ranks : {1, 2, 3, 4}) {
      const train::ShardLayout layout = train::optimizer_shards(n, ranks);
      ASSERT_EQ(layout.ranks(), ranks);
      EXPECT_EQ(layout.begin(0), 0);
      EXPECT_EQ(layout.total(), n);
      int64_t smallest = n, largest = 0;
      for (int r = 0; r < ranks; ++r) {
        EXPECT_EQ(layout.begin(r) % kChunk, 0) << "rank " << r << " starts inside a chunk";
        EXPECT_GT(layout.size(r), 0);
        if (r + 1 < ranks) {
          smallest = std::min(smallest, layout.size(r));
          largest = std::max(largest, layout.size(r));
        }
      }
      EXPECT_LE(largest - smallest, kChunk) << n << " on " << ranks;
    }
  }
  try {
    train::optimizer_shards(kChunk * 3 - 1, 4);
    FAIL() << "4 ranks over 3 chunks accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("at most 3 ranks"), std::string::npos) << e.what();
  }
}

// Why the slices lie on chunk edges: each slice's chunk sums are the one-process chunk sums, so the
// norm of the gathered sums, added in order, is sum_of_squares' bits. A slice cut inside a chunk
// (the shifted layout) gives other sums, which this test would show.
TEST(OptimizerShards, SlicesChunkSumsAddUpToTheOneProcessSumOfSquares) {
  constexpr int64_t kChunk = ops::kSumOfSquaresChunk;
  const int64_t n = kChunk * 6 + 321;
  const auto g = mixed_magnitude_floats(static_cast<size_t>(n), 77);
  const double whole = ops::cpu().sum_of_squares(g.data(), n);
  const auto sums_of = [&](const train::ShardLayout& layout) {
    std::vector<double> all;
    for (int r = 0; r < layout.ranks(); ++r) {
      const auto part = ops::cpu().sum_of_squares_by_chunk(g.data() + layout.begin(r), layout.size(r));
      all.insert(all.end(), part.begin(), part.end());
    }
    double total = 0;
    for (double p : all) total += p;
    return total;
  };
  for (int ranks : {1, 2, 3, 4}) EXPECT_EQ(sums_of(train::optimizer_shards(n, ranks)), whole) << ranks << " ranks";
  train::ShardLayout shifted = train::optimizer_shards(n, 2);
  shifted.bounds[1] += 1000;
  EXPECT_NE(sums_of(shifted), whole);
}

TEST(ShardMode, ParsesNoneOptimizerGradientsAndNamesTheRest) {
  EXPECT_EQ(train::parse_shard_mode("none"), train::ShardMode::none);
  EXPECT_EQ(train::parse_shard_mode("optimizer"), train::ShardMode::optimizer);
  EXPECT_EQ(train::parse_shard_mode("gradients"), train::ShardMode::gradients);
  EXPECT_EQ(train::parse_shard_mode("full"), train::ShardMode::full);
  for (auto mode : {train::ShardMode::none, train::ShardMode::optimizer, train::ShardMode::gradients, train::ShardMode::full})
    EXPECT_EQ(train::parse_shard_mode(train::to_string(mode)), mode);
  try {
    train::parse_shard_mode("zero3");
    FAIL() << "zero3";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("use none, optimizer, gradients or full"), std::string::npos) << e.what();
  }
  EXPECT_THROW(train::parse_shard_mode("zero1"), UsageError);
}

// The test aid behind distributed_zero_strict_release (NIBBLE_STRICT_RELEASE=1, set by that ctest
// entry only): releasable memory's released whole pages crash when touched, as a GPU's unmapped chunk
// would, until committed; then what discard_to_zero released reads as zeros and the edges kept theirs.
TEST(StrictRelease, ReleasedPagesAreUnreadableUntilCommitted) {
  const char* strict = std::getenv("NIBBLE_STRICT_RELEASE");
  if (!strict || std::string(strict) != "1") GTEST_SKIP() << "runs under NIBBLE_STRICT_RELEASE=1 (ctest distributed_zero_strict_release)";
  ops::TensorOps& cpu = ops::cpu();
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE)) / sizeof(float);  // floats a page
  const size_t n = 8 * page;
  auto* v = static_cast<float*>(cpu.allocate_releasable(n * sizeof(float)));
  for (size_t i = 0; i < n; ++i) v[i] = 1.0f + static_cast<float>(i);
  const size_t first = 100, count = 5 * page;  // whole pages 1-4 inside, partial pages 0 and 5
  cpu.discard_to_zero(v + first, count * sizeof(float));
  EXPECT_DEATH({ volatile float x = v[2 * page]; (void)x; }, "");
  EXPECT_EQ(v[first - 1], static_cast<float>(first));  // before the range
  EXPECT_EQ(v[first], 0.0f);                            // its partial pages: zeroed, kept
  EXPECT_EQ(v[first + count - 1], 0.0f);
  EXPECT_EQ(v[first + count], 1.0f + static_cast<float>(first + count));
  cpu.commit(v + 3 * page + 7, page * sizeof(float));  // touches pages 3 and 4 only
  EXPECT_EQ(v[3 * page], 0.0f);
  EXPECT_EQ(v[4 * page + page - 1], 0.0f);
  EXPECT_DEATH({ volatile float x = v[page]; (void)x; }, "");
  cpu.commit(v + first, count * sizeof(float));
  for (size_t i = first; i < first + count; ++i) ASSERT_EQ(v[i], 0.0f) << i;
  cpu.release(v);
}

// A stretch's layout: each rank's part of it, relative to its start (ZeRO-2's buckets, ZeRO-3's phases).
TEST(ShardLayout, WithinGivesEachRanksPartOfAStretch) {
  const train::ShardLayout layout{{0, 10, 25, 25, 40}};
  EXPECT_EQ(layout.within(5, 30).bounds, (std::vector<int64_t>{0, 5, 20, 20, 25}));
  EXPECT_EQ(layout.within(12, 20).bounds, (std::vector<int64_t>{0, 0, 8, 8, 8}));
  EXPECT_EQ(layout.within(0, 40).bounds, layout.bounds);
  EXPECT_EQ(layout.within(40, 40).bounds, (std::vector<int64_t>{0, 0, 0, 0, 0}));
}

TEST(ShardMode, EveryModeRunsOnGpusTheBucketedOnesOnPowerOfTwoRanks) {
  using train::ShardMode;
  for (auto mode : {ShardMode::none, ShardMode::optimizer, ShardMode::gradients, ShardMode::full})
    for (int ranks : {1, 2, 3, 4, 6, 8}) {
      EXPECT_NO_THROW(train::check_shard_mode_runs_on(mode, ops::Device::cpu, ranks));
      const bool refused = train::reduces_gradient_buckets(mode) && (ranks == 3 || ranks == 6);
      if (!refused) {
        EXPECT_NO_THROW(train::check_shard_mode_runs_on(mode, ops::Device::cuda, ranks)) << train::to_string(mode);
        continue;
      }
      try {
        train::check_shard_mode_runs_on(mode, ops::Device::cuda, ranks);
        FAIL() << "device=cuda with distributed.shard=" << train::to_string(mode) << " on " << ranks << " ranks accepted";
      } catch (const UsageError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("distributed.shard=" + std::string(train::to_string(mode)) + " with device=cuda needs a "
                            "power-of-two number of ranks (got " + std::to_string(ranks) + ")"),
                  std::string::npos) << what;
        EXPECT_NE(what.find("or distributed.shard=optimizer or none"), std::string::npos) << what;
      }
    }
}

// One process owns the whole arena: acquiring gathers nothing, releasing frees nothing, and a
// trainer in this mode steps exactly as an unsharded one (the provider is in every phase's path).
TEST(WeightShards, OneProcessOwnsEverythingAndTrainsAsUnsharded) {
  train::TrainConfig c;
  c.model.vocab = 65;
  c.model.layers = 2;
  c.model.width = 32;
  c.model.heads = 2;
  c.model.context = 16;
  c.batch = 2;
  c.grad_accum = 2;
  c.eval_batches = 3;
  c.recipe.quantization = Quantization::nvfp4;
  std::vector<int32_t> corpus(4000);
  for (size_t i = 0; i < corpus.size(); ++i) corpus[i] = static_cast<int32_t>((i * 7 + i / 13) % 65);
  train::Trainer plain(c, corpus);
  c.shard = train::ShardMode::full;
  train::Trainer full(c, corpus);
  ASSERT_NE(full.weight_shards(), nullptr);
  EXPECT_EQ(plain.weight_shards(), nullptr);
  for (int step = 0; step < 3; ++step) {
    const train::StepResult a = plain.step(), b = full.step();
    EXPECT_EQ(a.loss, b.loss) << step;
    EXPECT_EQ(a.grad_norm, b.grad_norm) << step;
  }
  EXPECT_EQ(plain.evaluate(), full.evaluate());
  EXPECT_EQ(plain.model().params().host_values(), full.model().params().host_values());
  EXPECT_EQ(full.weight_shards()->gathered_bytes(), 0);
}

// Host-first: equal power-of-two blocks of consecutive ranks per host keep the tree's first levels
// inside hosts; any other placement is named with the fix (the bits are the same either way).
TEST(HostPlacement, ConsecutivePowerOfTwoBlocksSumWithinHostsFirst) {
  const auto place = [](std::vector<std::string> hosts) { return train::group_ranks_by_host(hosts); };
  EXPECT_TRUE(place({"a", "a", "a", "a"}).host_first);
  EXPECT_EQ(place({"a", "a", "a", "a"}).hosts, 1);
  EXPECT_TRUE(place({"a", "a", "a", "a"}).text.empty());
  const train::HostPlacement two = place({"a", "a", "b", "b"});
  EXPECT_TRUE(two.host_first);
  EXPECT_EQ(two.hosts, 2);
  EXPECT_EQ(two.ranks_per_host, 2);
  EXPECT_NE(two.text.find("2 hosts x 2 consecutive ranks"), std::string::npos) << two.text;
  EXPECT_TRUE(place({"a", "b", "c", "d"}).host_first);  // one rank per host: every level crosses
  for (const auto& bad : std::vector<std::vector<std::string>>{
           {"a", "b", "a", "b"}, {"a", "a", "a", "b"}, {"a", "a", "b", "b", "b", "b", "c", "c"}, {"a", "a", "a", "b", "b", "b"}}) {
    const train::HostPlacement p = place(bad);
    EXPECT_FALSE(p.host_first) << p.text;
    EXPECT_NE(p.text.find("warning"), std::string::npos) << p.text;
    EXPECT_NE(p.text.find("--map-by ppr:K:node"), std::string::npos) << p.text;
  }
}

TEST(HostPlacement, SimulatedHostNamesNeedOneNamePerRank) {
  ::setenv("NIBBLE_SIMULATED_HOSTS", "x,x,y", 1);
  EXPECT_EQ(train::simulated_host_name(2, 3), "y");
  EXPECT_THROW(train::simulated_host_name(0, 4), UsageError);
  ::unsetenv("NIBBLE_SIMULATED_HOSTS");
  EXPECT_EQ(train::simulated_host_name(0, 4), "");
}

// ---- End to end through mpirun (only when nibble is built with MPI) ----

#if defined(NIBBLE_HAVE_MPI) && defined(NIBBLE_MPIEXEC)
namespace {

struct Result {
  int exit_code = -1;
  std::string output;
  double seconds = 0;
};

Result shell(const std::string& command) {
  Result r;
  const auto start = std::chrono::steady_clock::now();
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof buffer, p)) > 0;) r.output.append(buffer, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1000;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

fs::path work_dir() { return nibble_test::process_dir("test_distributed"); }
std::string nibble() { return std::string(NIBBLE_BINARY_DIR) + "/nibble"; }

// `nibble train` on `ranks` processes: one plain process for 1, mpirun for more. With `faults`
// (--fault NAME=VALUE words, tests/support/nibble_with_faults.cpp) the tests' driver program runs
// instead of nibble, injecting them. A hard timeout turns any hang into a failure instead of a
// stuck suite.
Result train_on(int ranks, const fs::path& run_dir, const std::string& overrides, const std::string& faults = "") {
  const std::string program = faults.empty() ? nibble() : std::string(NIBBLE_BINARY_DIR) + "/nibble_with_faults " + faults;
  const std::string args = " train " + (work_dir() / "tiny.yaml").string() + " run.dir=" + run_dir.string() + " " + overrides;
  if (ranks == 1) return shell("timeout -k 5 120 " + program + args);
  // Each rank one thread: the 2-core test machine runs both ranks at once. Root in containers
  // needs --allow-run-as-root.
  const bool simulated_hosts = std::getenv("NIBBLE_SIMULATED_HOSTS") != nullptr;
  return shell("timeout -k 5 120 env OMP_NUM_THREADS=1 " + std::string(NIBBLE_MPIEXEC) +
               " --oversubscribe --bind-to none -np " + std::to_string(ranks) + (::geteuid() == 0 ? " --allow-run-as-root" : "") +
               " -x OMP_NUM_THREADS " + (simulated_hosts ? "-x NIBBLE_SIMULATED_HOSTS " : "") + program + args +
               " threads=1");
}

using cli_test::file_bytes;
using cli_test::loss_curve;

std::vector<double> losses(const fs::path& run_dir) {
  std::ifstream in(run_dir / "metrics.jsonl");
  std::vector<double> v;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["kind"] == "train") v.push_back(j["loss"].get<double>());
  }
  return v;
}

fs::path final_checkpoint(const fs::path& run) { return run / "checkpoints" / "step_00000006"; }

class MpiTrain : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    fs::remove_all(work_dir());
    fs::create_directories(work_dir());
    const std::string text = train::read_text_file(std::string(NIBBLE_SOURCE_DIR) + "/data/tinyshakespeare.txt");
    std::ofstream(work_dir() / "corpus.txt") << text.substr(0, 40000);
    const Result p = shell(nibble() + " prepare " + (work_dir() / "corpus.txt").string() + " -o " +
                           (work_dir() / "data").string());
    ASSERT_EQ(p.exit_code, 0) << p.output;
    // The global batch: grad_accum 2 micro-batches of 2 sequences, NVFP4 with its stochastic rounding.
    std::ofstream(work_dir() / "tiny.yaml") << "data:\n  dir: " << (work_dir() / "data").string() << "\n"
                                            << "steps: 6\nbatch: 2\ngrad_accum: 2\nquantization: nvfp4\n"
                                               "model:\n  layers: 2\n  heads: 2\n  width: 32\n  context: 32\n"
                                               "schedule:\n  lr: 0.003\n  warmup_steps: 2\n"
                                               "eval:\n  interval: 3\n  batches: 3\n"
                                               "checkpoint:\n  interval: 2\n  keep: 5\n"
                                               "log:\n  interval: 1\nthreads: 1\n";
  }
  static void TearDownTestSuite() {
    if (!::testing::Test::HasFailure()) fs::remove_all(work_dir());
  }
  // The one-process reference, trained once for the suite.
  static const fs::path& one_rank() {
    static const fs::path dir = [] {
      const fs::path d = work_dir() / "one-rank";
      const Result r = train_on(1, d, "");
      EXPECT_EQ(r.exit_code, 0) << r.output;
      return d;
    }();
    return dir;
  }
  static void expect_same_run(const fs::path& run, const fs::path& reference) {
    EXPECT_EQ(loss_curve(run), loss_curve(reference));
    for (const char* file : {"model.safetensors", "optimizer.safetensors"})
      EXPECT_EQ(file_bytes(final_checkpoint(run) / file), file_bytes(final_checkpoint(reference) / file)) << file;
  }
};

}  // namespace

TEST_F(MpiTrain, TwoRanksEqualOneRankBitwise) {
  const fs::path two = work_dir() / "two-ranks";
  const Result r = train_on(2, two, "");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("parallel   MPI"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bitwise equal to 1 process"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("2 ranks x"), std::string::npos) << r.output;  // per-rank throughput
  // Rank 0 alone writes: one history in the metrics file, one "done" line on stdout.
  EXPECT_EQ(loss_curve(two).size(), 6u + 2u);
  size_t done_lines = 0;
  for (size_t at = 0; (at = r.output.find("\ndone: ", at)) != std::string::npos; ++at) ++done_lines;
  EXPECT_EQ(done_lines, 1u) << r.output;
  expect_same_run(two, one_rank());
}

TEST_F(MpiTrain, RowSplitMatchesOneRankWithinRounding) {
  // grad_accum=1: the ranks split the rows of every micro-batch. Per-rank NVFP4 scales of the
  // activations and the split wgrad sums over tokens change the last bits, which AdamW carries on;
  // over 6 steps of this tiny model the losses stay within 1% (measured differences: ~1e-4).
  const fs::path one = work_dir() / "rows-one", two = work_dir() / "rows-two";
  const Result a = train_on(1, one, "batch=4 grad_accum=1");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const Result b = train_on(2, two, "batch=4 grad_accum=1");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("up to FP32 rounding"), std::string::npos) << b.output;
  const auto la = losses(one), lb = losses(two);
  ASSERT_EQ(la.size(), lb.size());
  for (size_t i = 0; i < la.size(); ++i) EXPECT_NEAR(la[i], lb[i], 0.01 * la[i]) << "step " << i + 1;
}

TEST_F(MpiTrain, ResumeAcrossRankCountsIsBitwise) {
  // 2 ranks stop before step 3 (rank 1 dies: the fault path), 1 rank resumes from step 2 ...
  const fs::path two_then_one = work_dir() / "two-then-one";
  const Result died = train_on(2, two_then_one, "", "--fault rank_exits=1:3");
  EXPECT_NE(died.exit_code, 0) << died.output;
  ASSERT_TRUE(fs::exists(two_then_one / "checkpoints" / "step_00000002" / "state.json")) << died.output;
  const Result resumed1 = train_on(1, two_then_one, "resume=true");
  ASSERT_EQ(resumed1.exit_code, 0) << resumed1.output;
  EXPECT_NE(resumed1.output.find("resuming from"), std::string::npos);
  expect_same_run(two_then_one, one_rank());
  // ... and 1 rank stops before step 5, 2 ranks resume from step 4.
  const fs::path one_then_two = work_dir() / "one-then-two";
  const Result stopped = train_on(1, one_then_two, "", "--fault rank_exits=0:5");
  EXPECT_EQ(stopped.exit_code, 17) << stopped.output;
  const Result resumed2 = train_on(2, one_then_two, "resume=true");
  ASSERT_EQ(resumed2.exit_code, 0) << resumed2.output;
  EXPECT_NE(resumed2.output.find("resuming from"), std::string::npos) << resumed2.output;
  expect_same_run(one_then_two, one_rank());
}

// llm.c shards (memory-mapped, data/token_files.h) sampled by 2 ranks: the 1-process run to the bit,
// also when 2 ranks resume what 1 rank began.
TEST_F(MpiTrain, LlmcShardsOnTwoRanksEqualOneRankBitwise) {
  const fs::path data = work_dir() / "llmc";
  fs::create_directories(data);
  const std::string text = train::read_text_file(std::string(NIBBLE_SOURCE_DIR) + "/data/tinyshakespeare.txt");
  // llm.c's GPT-2 layout: 256 int32 of header (magic, version 1, count), then uint16 tokens.
  auto write_shard = [&](const fs::path& path, size_t from, size_t count) {
    std::vector<int32_t> header(256, 0);
    header[0] = 20240520;
    header[1] = 1;
    header[2] = static_cast<int32_t>(count);
    std::vector<uint16_t> tokens(text.begin() + static_cast<std::ptrdiff_t>(from),
                                 text.begin() + static_cast<std::ptrdiff_t>(from + count));
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), 1024);
    out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(count * 2));
  };
  write_shard(data / "s_train_000001.bin", 0, 20000);
  write_shard(data / "s_train_000002.bin", 20000, 15000);
  write_shard(data / "s_val_000000.bin", 35000, 4000);
  const std::string llmc = "data.format=llmc data.dir=" + data.string() + " model.vocab=256";
  const Result one = train_on(1, work_dir() / "llmc-one", llmc);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const Result two = train_on(2, work_dir() / "llmc-two", llmc);
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_NE(two.output.find("bitwise equal to 1 process"), std::string::npos) << two.output;
  expect_same_run(work_dir() / "llmc-two", work_dir() / "llmc-one");
  const fs::path one_then_two = work_dir() / "llmc-one-then-two";
  EXPECT_EQ(train_on(1, one_then_two, llmc, "--fault rank_exits=0:5").exit_code, 17);
  const Result resumed = train_on(2, one_then_two, llmc + " resume=true");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  expect_same_run(one_then_two, work_dir() / "llmc-one");
}

// A data.sources mixture of two llm.c sources: each row's source and window follow from (seed,
// step, row), so two ranks train it bitwise as one, and a run stopped on one rank resumes on two.
TEST_F(MpiTrain, MixtureOnTwoRanksEqualsOneRankBitwise) {
  const std::string text = train::read_text_file(std::string(NIBBLE_SOURCE_DIR) + "/data/tinyshakespeare.txt");
  auto write_shard = [&](const fs::path& path, size_t from, size_t count) {
    std::vector<int32_t> header(256, 0);
    header[0] = 20240520;
    header[1] = 1;
    header[2] = static_cast<int32_t>(count);
    std::vector<uint16_t> tokens(text.begin() + static_cast<std::ptrdiff_t>(from),
                                 text.begin() + static_cast<std::ptrdiff_t>(from + count));
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), 1024);
    out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(count * 2));
  };
  for (const auto& [name, from] : {std::pair<const char*, size_t>{"mix-a", 0}, {"mix-b", 500000}}) {
    fs::create_directories(work_dir() / name);
    write_shard(work_dir() / name / "s_train_000001.bin", from, 30000);
    write_shard(work_dir() / name / "s_val_000000.bin", from + 30000, 4000);
  }
  const std::string mixture = "data.dir= data.format=llmc model.vocab=256 data.sources=a=" +
                              (work_dir() / "mix-a").string() + ":0.6,b=" + (work_dir() / "mix-b").string() + ":0.4";
  const Result one = train_on(1, work_dir() / "mix-one", mixture);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const Result two = train_on(2, work_dir() / "mix-two", mixture);
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_NE(two.output.find("bitwise equal to 1 process"), std::string::npos) << two.output;
  expect_same_run(work_dir() / "mix-two", work_dir() / "mix-one");
  EXPECT_TRUE(cli_test::contains(train::read_text_file((work_dir() / "mix-two" / "metrics.jsonl").string()),
                                 "\"val_loss.b\""));
  const fs::path one_then_two = work_dir() / "mix-one-then-two";
  EXPECT_EQ(train_on(1, one_then_two, mixture, "--fault rank_exits=0:5").exit_code, 17);
  const Result resumed = train_on(2, one_then_two, mixture + " resume=true");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  expect_same_run(one_then_two, work_dir() / "mix-one");
}

TEST_F(MpiTrain, AStopOnAnyRankNamesTheSameLastGoodCheckpoint) {
  // Rank 1 alone meets non-finite activations in step 5: the message it ends the job with names the
  // step-4 checkpoint rank 0 wrote (it said "none" on rank 1 while rank 0 knew step 4).
  const fs::path run = work_dir() / "rank-fails";
  const Result r = train_on(2, run, "", "--fault rank_step_fails=1:5");
  EXPECT_NE(r.exit_code, 0) << r.output;
  const std::string want = "last good checkpoint: " + (run / "checkpoints" / "step_00000004").string();
  EXPECT_NE(r.output.find(want), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("last good checkpoint: none"), std::string::npos) << r.output;
}

TEST_F(MpiTrain, ALossSpikeFreezesTheSameLastGoodCheckpointOnEveryRank) {
  // The loss spikes from step 25 on (injected, on every rank); rank 1 alone fails at step 31. The
  // message it ends the job with names step 24's checkpoint, the one before the spike, as rank 0's
  // own warning does, not step 30's.
  const fs::path run = work_dir() / "spike-rank-fails";
  const Result r = train_on(2, run, "steps=40 eval.interval=100 checkpoint.keep=2",
                            "--fault loss_spike_from=25 --fault rank_step_fails=1:31");
  EXPECT_NE(r.exit_code, 0) << r.output;
  const std::string before_spike = (run / "checkpoints" / "step_00000024").string();
  EXPECT_NE(r.output.find("the last checkpoint before it is " + before_spike), std::string::npos) << r.output;
  const size_t rank1 = r.output.find("error on rank 1 of 2");
  ASSERT_NE(rank1, std::string::npos) << r.output;
  EXPECT_NE(r.output.find("last good checkpoint: " + before_spike, rank1), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(fs::path(before_spike) / "state.json"));
}

TEST_F(MpiTrain, ARankThatDiesStopsTheJobWithItsName) {
  const fs::path run = work_dir() / "rank-dies";
  const Result r = train_on(2, run, "", "--fault rank_exits=1:2");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1 exits"), std::string::npos) << r.output;
  // mpirun's own report names the failed process of the job: "Process name: [[JOB,1],1]" (rank 1).
  EXPECT_NE(r.output.find("],1]"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 60.0) << "the surviving rank was not stopped promptly";
  // Rank 0 wrote nothing past the last checkpoint it completed, and that one loads.
  EXPECT_FALSE(fs::exists(run / "checkpoints" / "step_00000002"));
}

// device=cuda with 2 ranks: on 2+ GPUs the same bits as one GPU (NCCL adds in the CPU's tree
// order); where the GPUs are missing, exit 2 on every rank naming the fix, and no run directory.
TEST_F(MpiTrain, DeviceCudaRunsOneRankPerGpu) {
  const int gpus = ops::cuda_device_count();
  const fs::path two = work_dir() / "two-gpus";
  const Result r = train_on(2, two, "device=cuda");
  if (gpus >= 2 && ops::nccl_built()) {
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("NCCL"), std::string::npos) << r.output;
    const fs::path one = work_dir() / "one-gpu";
    const Result o = train_on(1, one, "device=cuda");
    ASSERT_EQ(o.exit_code, 0) << o.output;
    expect_same_run(two, one);
    // ZeRO-1/2/3 on the GPUs (NCCL, the arena's chunks released and committed): the same run.
    for (const std::string mode : {"optimizer", "gradients", "full"}) {
      const fs::path sharded = work_dir() / ("two-gpus-" + mode);
      const Result z = train_on(2, sharded, "device=cuda distributed.shard=" + mode);
      ASSERT_EQ(z.exit_code, 0) << mode << "\n" << z.output;
      expect_same_run(sharded, one);
    }
    return;
  }
  EXPECT_EQ(r.exit_code, 2) << r.output;
  if (gpus == 0) EXPECT_NE(r.output.find("device=cpu"), std::string::npos) << r.output;
  else if (gpus == 1) EXPECT_NE(r.output.find("same GPU"), std::string::npos) << r.output;
  else EXPECT_NE(r.output.find("NCCL"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(two / "metrics.jsonl")) << r.output;
}

// ---- distributed.shard=optimizer (ZeRO-1) ----
namespace {
// A model of more than 4 chunks of ops::kSumOfSquaresChunk parameters, so that 4 ranks each own a
// slice, and grad_accum 4: the micro-batch split on 1, 2 and 4 ranks.
const std::string kShardModel = "model.width=64 model.heads=4 grad_accum=4 ";

// A full-sharded run's end line: bytes all-gathered into rank 0 per step, and of them the quantized
// linear weights'.
std::pair<double, double> gathered_per_step(const std::string& output) {
  const std::regex line(R"(all-gathered ([0-9.]+) (GiB|MiB|KiB|B) of weights into rank 0, ([0-9.]+) (GiB|MiB|KiB|B) of them)");
  std::smatch m;
  if (!std::regex_search(output, m, line)) return {-1, -1};
  const auto bytes = [](const std::string& v, const std::string& unit) {
    return std::stod(v) * (unit == "GiB" ? 1 << 30 : unit == "MiB" ? 1 << 20 : unit == "KiB" ? 1 << 10 : 1);
  };
  return {bytes(m[1], m[2]), bytes(m[3], m[4])};
}

// The one-process run of these settings, trained once per suite and quantization.
const fs::path& one_process_run(const std::string& quantization) {
  static std::map<std::string, fs::path> runs;
  auto it = runs.find(quantization);
  if (it == runs.end()) {
    const fs::path dir = work_dir() / ("shard-one-" + quantization);
    const Result r = train_on(1, dir, kShardModel + "quantization=" + quantization);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    it = runs.emplace(quantization, dir).first;
  }
  return it->second;
}
}  // namespace

// Each rank holds the AdamW state of its slice only; the reduce-scatter adds in the tree order of
// the all-reduce and the norm adds the slices' chunk sums in the one-process order, so 2 and 4 ranks
// write one process's losses, weights and optimizer state, for every quantization.
TEST_F(MpiTrain, OptimizerShardsTrainBitwiseLikeOneProcess) {
  for (const std::string quantization : {"none", "bf16", "nvfp4"}) {
    for (int ranks : {2, 4}) {
      const fs::path run = work_dir() / ("shard-" + quantization + "-" + std::to_string(ranks));
      const Result r = train_on(ranks, run, kShardModel + "quantization=" + quantization + " distributed.shard=optimizer");
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_NE(r.output.find("distributed.shard=optimizer (ZeRO-1)"), std::string::npos) << r.output;
      SCOPED_TRACE(quantization + " on " + std::to_string(ranks) + " ranks");
      expect_same_run(run, one_process_run(quantization));
    }
  }
}

// ZeRO-2: the buckets reduce-scattered during the backward pass add in the same tree order, on 2
// ranks (two micro-batches each: the tree sum finished piece by piece) and 4 (one each), and on one
// process (the mode alone), for every quantization: one process's losses, weights, optimizer state.
TEST_F(MpiTrain, GradientShardsTrainBitwiseLikeOneProcess) {
  for (const std::string quantization : {"none", "bf16", "nvfp4"}) {
    for (int ranks : {1, 2, 4}) {
      const fs::path run = work_dir() / ("zero2-" + quantization + "-" + std::to_string(ranks));
      const Result r = train_on(ranks, run, kShardModel + "quantization=" + quantization + " distributed.shard=gradients");
      ASSERT_EQ(r.exit_code, 0) << r.output;
      if (ranks > 1) {
        EXPECT_NE(r.output.find("distributed.shard=gradients (ZeRO-2)"), std::string::npos) << r.output;
      }
      SCOPED_TRACE(quantization + " on " + std::to_string(ranks) + " ranks");
      expect_same_run(run, one_process_run(quantization));
    }
  }
}

// A checkpoint is one whole state whichever mode wrote it (gathered on rank 0): none -> optimizer,
// optimizer on 2 ranks -> 4 ranks, optimizer -> one process, and the same for gradients (ZeRO-2)
// and back to none, each bitwise the uninterrupted run.
TEST_F(MpiTrain, OptimizerShardCheckpointsResumeAcrossModesAndRankCounts) {
  const std::string nvfp4 = kShardModel + "quantization=nvfp4 ", shard = " distributed.shard=optimizer",
                    zero2 = " distributed.shard=gradients";
  const fs::path& reference = one_process_run("nvfp4");
  struct Leg {
    const char* name;
    int ranks_before;
    std::string before, fault;
    int ranks_after;
    std::string after;
  };
  for (const Leg& leg : {Leg{"none-then-optimizer", 2, "", "--fault rank_exits=1:3", 2, shard},
                         Leg{"optimizer-2-then-4", 2, shard, "--fault rank_exits=1:5", 4, shard},
                         Leg{"optimizer-then-one", 4, shard, "--fault rank_exits=2:3", 1, ""},
                         Leg{"none-then-gradients", 2, "", "--fault rank_exits=1:3", 2, zero2},
                         Leg{"gradients-2-then-4", 2, zero2, "--fault rank_exits=1:5", 4, zero2},
                         Leg{"gradients-then-none", 4, zero2, "--fault rank_exits=2:3", 2, ""}}) {
    SCOPED_TRACE(leg.name);
    const fs::path run = work_dir() / leg.name;
    const Result stopped = train_on(leg.ranks_before, run, nvfp4 + leg.before, leg.fault);
    EXPECT_NE(stopped.exit_code, 0) << stopped.output;
    const Result resumed = train_on(leg.ranks_after, run, nvfp4 + leg.after + " resume=true");
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("resuming from"), std::string::npos) << resumed.output;
    EXPECT_EQ(resumed.output.find("note: resuming with distributed.shard"), std::string::npos) << resumed.output;
    expect_same_run(run, reference);
  }
}

// Ranks on simulated hosts (NIBBLE_SIMULATED_HOSTS): placed host by host, the report says the tree
// sums within hosts first (and the all-reduce of shard=none becomes reduce-scatter + all-gather);
// interleaved, it warns with the fix. Both train one process's bits, none and gradients alike.
TEST_F(MpiTrain, SimulatedHostsKeepTheBitsAndNameTheirPlacement) {
  struct Case {
    const char* hosts;
    const char* expected;
  };
  for (const Case& c : {Case{"a,a,b,b", "2 hosts x 2 consecutive ranks"}, Case{"a,b,a,b", "warning: the ranks"}}) {
    ::setenv("NIBBLE_SIMULATED_HOSTS", c.hosts, 1);
    for (const std::string mode : {"none", "gradients"}) {
      SCOPED_TRACE(std::string(c.hosts) + " " + mode);
      const fs::path run = work_dir() / ("hosts-" + std::string(c.hosts) + "-" + mode);
      const Result r = train_on(4, run, kShardModel + "quantization=nvfp4 distributed.shard=" + mode);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_NE(r.output.find(c.expected), std::string::npos) << r.output;
      expect_same_run(run, one_process_run("nvfp4"));
    }
  }
  ::setenv("NIBBLE_SIMULATED_HOSTS", "a,b,c", 1);  // not one name per rank: refused on every rank
  const Result bad = train_on(2, work_dir() / "hosts-bad", "");
  ::unsetenv("NIBBLE_SIMULATED_HOSTS");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("give one host name per rank"), std::string::npos) << bad.output;
}

// More ranks than slices of the gradient norm's unit (the tiny model has fewer than 4): refused on
// every rank before anything is written.
TEST_F(MpiTrain, OptimizerShardsOnMoreRanksThanSlicesAreRefused) {
  const fs::path run = work_dir() / "shard-too-many-ranks";
  const Result r = train_on(4, run, "grad_accum=4 distributed.shard=optimizer");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("so a rank would own nothing"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(run)) << "a refused run wrote its directory";
}

// ---- distributed.shard=full (ZeRO-3) ----

// Each rank holds the weights and AdamW state of its slice; every phase's weights are all-gathered
// (the owners' bits) before it runs, so 1, 2 and 4 ranks write one process's losses, weights and
// optimizer state, for every quantization.
TEST_F(MpiTrain, FullShardsTrainBitwiseLikeOneProcess) {
  for (const std::string quantization : {"none", "bf16", "nvfp4"}) {
    for (int ranks : {1, 2, 4}) {
      const fs::path run = work_dir() / ("full-" + quantization + "-" + std::to_string(ranks));
      const Result r = train_on(ranks, run, kShardModel + "quantization=" + quantization + " distributed.shard=full");
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_NE(r.output.find("distributed.shard=full (ZeRO-3)"), std::string::npos) << r.output;
      if (ranks > 1) {
        EXPECT_NE(r.output.find("shard: each training step all-gathered"), std::string::npos) << r.output;
        // Only nvfp4's 16x16-tile weights are gathered quantized (distributed.fp4_param_gather).
        EXPECT_EQ(gathered_per_step(r.output).second > 0, quantization == "nvfp4") << r.output;
      }
      SCOPED_TRACE(quantization + " on " + std::to_string(ranks) + " ranks");
      expect_same_run(run, one_process_run(quantization));
    }
  }
}

// distributed.fp4_param_gather=false gathers the same weights in FP32: the same run, more bytes.
TEST_F(MpiTrain, Fp4ParamGatherMovesFewerBytesForTheSameRun) {
  const fs::path run = work_dir() / "full-nvfp4-fp32-gather";
  const Result r = train_on(2, run, kShardModel + "quantization=nvfp4 distributed.shard=full distributed.fp4_param_gather=false");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("in FP32 (distributed.fp4_param_gather=false)"), std::string::npos) << r.output;
  expect_same_run(run, one_process_run("nvfp4"));
  const Result q = train_on(2, work_dir() / "full-nvfp4-fp4-gather", kShardModel + "quantization=nvfp4 distributed.shard=full");
  ASSERT_EQ(q.exit_code, 0) << q.output;
  const auto [fp32_total, fp32_quantized] = gathered_per_step(r.output);
  const auto [fp4_total, fp4_quantized] = gathered_per_step(q.output);
  EXPECT_EQ(fp32_quantized, 0.0);
  EXPECT_GT(fp4_quantized, 0.0);
  EXPECT_LT(fp4_total, fp32_total);
}

// A full-sharded run's checkpoint is the one whole state (weights gathered on rank 0): full on 2
// ranks -> none on one process, optimizer on 2 ranks -> full on 4, full on 4 -> full on 2, each
// bitwise the uninterrupted one-process run.
TEST_F(MpiTrain, FullShardCheckpointsResumeAcrossModesAndRankCounts) {
  const std::string nvfp4 = kShardModel + "quantization=nvfp4 ", full = " distributed.shard=full";
  const fs::path& reference = one_process_run("nvfp4");
  struct Leg {
    const char* name;
    int ranks_before;
    std::string before, fault;
    int ranks_after;
    std::string after;
  };
  for (const Leg& leg : {Leg{"full-2-then-none-1", 2, full, "--fault rank_exits=1:3", 1, ""},
                         Leg{"optimizer-2-then-full-4", 2, " distributed.shard=optimizer", "--fault rank_exits=1:5", 4, full},
                         Leg{"full-4-then-full-2", 4, full, "--fault rank_exits=3:3", 2, full}}) {
    SCOPED_TRACE(leg.name);
    const fs::path run = work_dir() / leg.name;
    const Result stopped = train_on(leg.ranks_before, run, nvfp4 + leg.before, leg.fault);
    EXPECT_NE(stopped.exit_code, 0) << stopped.output;
    const Result resumed = train_on(leg.ranks_after, run, nvfp4 + leg.after + " resume=true");
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("resuming from"), std::string::npos) << resumed.output;
    expect_same_run(run, reference);
  }
}

// The end-of-run lines put every rank's peak resident memory (VmHWM) beside the plan's prediction
// (run/memory_plan.h): within the 10% the plan promises (issue #29), on a 4 x 512 model whose
// weights, gradients and AdamW dominate a rank (forgetting that `full` holds only the slice and one
// gathered phase would be about 15% off on 4 ranks).
TEST_F(MpiTrain, FullShardsPeakMemoryPerRankIsThePlans) {
  for (int ranks : {2, 4}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    const fs::path run = work_dir() / ("full-memory-" + std::to_string(ranks));
    const Result r = train_on(ranks, run, "model.width=512 model.heads=4 model.layers=4 grad_accum=4 steps=2 "
                                          "distributed.shard=full");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::regex line(R"(memory/rank (\d+): peak resident ([0-9.]+) (GiB|MiB|KiB), predicted ([0-9.]+) (GiB|MiB|KiB))");
    const auto bytes = [](const std::string& v, const std::string& unit) {
      return std::stod(v) * (unit == "GiB" ? 1 << 30 : unit == "MiB" ? 1 << 20 : 1 << 10);
    };
    int seen = 0;
    for (std::sregex_iterator it(r.output.begin(), r.output.end(), line), end; it != end; ++it, ++seen) {
      const double measured = bytes((*it)[2], (*it)[3]), predicted = bytes((*it)[4], (*it)[5]);
      EXPECT_NEAR(predicted, measured, 0.10 * measured) << (*it)[0];
    }
    EXPECT_EQ(seen, ranks) << r.output;
  }
}

// More ranks than slices: refused on every rank with exit 2, nothing written.
TEST_F(MpiTrain, FullShardsOnMoreRanksThanSlicesAreRefused) {
  const fs::path run = work_dir() / "full-too-many-ranks";
  const Result r = train_on(4, run, "grad_accum=4 distributed.shard=full");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("distributed.shard=full: the model's"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("so a rank would own nothing"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(run)) << "a refused run wrote its directory";
}

TEST_F(MpiTrain, AnIndivisibleGlobalBatchIsRefusedOnEveryRank) {
  const Result r = train_on(2, work_dir() / "indivisible", "batch=3 grad_accum=1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("cannot be divided between 2 ranks"), std::string::npos) << r.output;
}
#endif

// ---- The MPI collectives themselves, when this binary is started by mpirun (ctest does it with
// 2 ranks, the butterfly, and 3 ranks, MPI_Allreduce; see tests/CMakeLists.txt) ----

namespace {
// MPI_Init once per process, for every MpiCollectives test.
train::Communicator* mpi_world() {
  static std::unique_ptr<train::Communicator> comm = train::connect_processes();
  return comm.get();
}

template <typename T>
std::vector<T> slice_of(const std::vector<T>& v, const train::ShardLayout& layout, int r) {
  return std::vector<T>(v.begin() + layout.begin(r), v.begin() + layout.end(r));
}
}  // namespace

TEST(MpiCollectives, GradientSumIsTheSameBitsOnEveryRank) {
  if (!train::launched_by_mpi()) GTEST_SKIP() << "not started by mpirun (ctest runs this under mpirun -np 2, 3 and 4)";
  train::Communicator* comm = mpi_world();
  const int ranks = comm->size(), rank = comm->rank();
  ASSERT_GE(ranks, 2);
  // More than one bucket, with a partial last one.
  constexpr size_t kN = (size_t{1} << 20) + 333;
  std::vector<std::vector<float>> all;
  for (int r = 0; r < ranks; ++r) all.push_back(mixed_magnitude_floats(kN, 1000 + static_cast<uint32_t>(r)));
  std::vector<float> mine = all[static_cast<size_t>(rank)];
  // Loopback: every rank on this host, in rank order.
  EXPECT_EQ(comm->local_size(), ranks);
  EXPECT_EQ(comm->local_rank(), rank);
  comm->sum_gradients(mine);
  const auto sums = comm->all_gather(train::weights_checksum(mine));
  for (int r = 1; r < ranks; ++r) EXPECT_EQ(sums[static_cast<size_t>(r)], sums[0]) << "rank " << r << " got other bits";
  if ((ranks & (ranks - 1)) == 0) {
    // The balanced tree over ranks, as one process would add 'ranks' micro-batches.
    EXPECT_EQ(mine, tree_sum(all, 0, static_cast<size_t>(ranks)));
  } else {
    for (size_t i = 0; i < kN; i += 997) {
      double exact = 0;
      for (const auto& v : all) exact += v[i];
      EXPECT_NEAR(mine[i], exact, 1e-5 * (std::abs(exact) + 1.0));
    }
  }
  std::vector<double> slots(static_cast<size_t>(ranks), 0.0);
  slots[static_cast<size_t>(rank)] = rank + 0.5;
  comm->sum(slots);
  for (int r = 0; r < ranks; ++r) EXPECT_EQ(slots[static_cast<size_t>(r)], r + 0.5);
  std::vector<int64_t> value = {rank == 0 ? int64_t{42} : int64_t{-1}};
  comm->broadcast_values(std::span(value), 0);
  EXPECT_EQ(value[0], 42);
  comm->barrier();
}

// ZeRO-1's collectives: each rank's slice of the reduce-scatter is the all-reduce's bits there (the
// tree over ranks with 2 and 4 ranks, MPI_Allreduce's with 3), over slices spanning several buckets;
// the all-gather, the gather to rank 0 and the scatter from it move every slice to its place.
TEST(MpiCollectives, ReduceScatterGivesEachRankTheGradientSumOfItsSlice) {
  if (!train::launched_by_mpi()) GTEST_SKIP() << "not started by mpirun";
  train::Communicator* comm = mpi_world();
  const int ranks = comm->size(), rank = comm->rank();
  const int64_t n = (int64_t{1} << 21) + 5 * ops::kSumOfSquaresChunk + 77;
  const train::ShardLayout layout = train::optimizer_shards(n, ranks);
  std::vector<std::vector<float>> all;
  for (int r = 0; r < ranks; ++r) all.push_back(mixed_magnitude_floats(static_cast<size_t>(n), 500 + static_cast<uint32_t>(r)));
  std::vector<float> summed = all[static_cast<size_t>(rank)], scattered = summed;
  comm->sum_gradients(summed);
  comm->reduce_scatter_gradients(scattered, layout);
  EXPECT_EQ(slice_of(scattered, layout, rank), slice_of(summed, layout, rank));
  if ((ranks & (ranks - 1)) == 0) {
    EXPECT_EQ(slice_of(scattered, layout, rank), slice_of(tree_sum(all, 0, static_cast<size_t>(ranks)), layout, rank));
  }

  // All-gather: only the own slice is set before; every slice is the owner's after.
  std::vector<float> gathered(static_cast<size_t>(n), 0.0f);
  const auto& mine = all[static_cast<size_t>(rank)];
  std::copy(mine.begin() + layout.begin(rank), mine.begin() + layout.end(rank), gathered.begin() + layout.begin(rank));
  comm->all_gather_shards(std::as_writable_bytes(std::span(gathered)), layout.scaled(sizeof(float)));
  for (int r = 0; r < ranks; ++r) EXPECT_EQ(slice_of(gathered, layout, r), slice_of(all[static_cast<size_t>(r)], layout, r));

  // Gather to rank 0, then scatter back: the slices of rank r's vector reach rank 0, then rank r.
  const std::vector<float> own = slice_of(mine, layout, rank);
  std::vector<float> whole(rank == 0 ? static_cast<size_t>(n) : 0);
  comm->gather_shards_to_root(std::as_bytes(std::span(own)), std::as_writable_bytes(std::span(whole)),
                              layout.scaled(sizeof(float)));
  if (rank == 0) {
    for (int r = 0; r < ranks; ++r) EXPECT_EQ(slice_of(whole, layout, r), slice_of(all[static_cast<size_t>(r)], layout, r));
  }
  std::vector<float> back(own.size(), 0.0f);
  comm->scatter_shards_from_root(std::as_bytes(std::span(whole)), std::as_writable_bytes(std::span(back)),
                                 layout.scaled(sizeof(float)));
  EXPECT_EQ(back, own);
}

// ZeRO-2's overlapped reduce-scatter: buckets of uneven lengths (some inside one rank's slice, some
// across slice edges, an empty one), started in backward order and polled between starts with at
// most one or three left in flight, give each rank bitwise reduce_scatter_gradients' slice.
TEST(MpiCollectives, BucketedReduceScatterIsTheWholeReduceScatterBitwise) {
  if (!train::launched_by_mpi()) GTEST_SKIP() << "not started by mpirun";
  train::Communicator* comm = mpi_world();
  const int ranks = comm->size(), rank = comm->rank();
  const int64_t n = 6 * ops::kSumOfSquaresChunk + 1234;
  const train::ShardLayout layout = train::optimizer_shards(n, ranks);
  const auto mine = mixed_magnitude_floats(static_cast<size_t>(n), 700 + static_cast<uint32_t>(rank));
  std::vector<float> whole = mine;
  comm->reduce_scatter_gradients(whole, layout);
  for (size_t keep_in_flight : {1, 3}) {  // 3: later buckets' levels may be posted before earlier ones'
    std::vector<float> bucketed = mine;
    std::vector<std::pair<int64_t, int64_t>> started, finished;
    int64_t end = n;
    for (int64_t first : {n - 5000, n - 5000, n - 40000, int64_t{20000}, int64_t{19999}, int64_t{0}}) {
      comm->start_reduce_scatter(bucketed, first, end, layout);
      started.emplace_back(first, end);
      end = first;
      for (const auto& f : comm->poll_reduce_scatters(keep_in_flight)) finished.push_back(f);
    }
    for (const auto& f : comm->poll_reduce_scatters(0)) finished.push_back(f);
    EXPECT_EQ(finished, started);
    EXPECT_EQ(slice_of(bucketed, layout, rank), slice_of(whole, layout, rank)) << keep_in_flight << " in flight";
  }
}

// A sharded AdamW (each rank its slice's moments, the norm from gathered chunk sums, weights
// all-gathered) against the replicated one on the same summed gradients: the same weights, norms
// and, gathered on rank 0, moments, bit for bit, over steps that clip. The parameters' edges fall
// inside slices, so a weight-decay flag taken from the wrong offset would show.
TEST(MpiCollectives, ShardedAdamWStepsBitwiseLikeTheReplicatedOne) {
  if (!train::launched_by_mpi()) GTEST_SKIP() << "not started by mpirun";
  train::Communicator* comm = mpi_world();
  const int ranks = comm->size(), rank = comm->rank();
  const auto make_arena = [] {
    model::ParamArena a(ops::cpu());
    a.add("embedding", 1000, 33, false);
    a.add("matrix", 300, 257, true);
    a.add("norm", 1, 4099, false);
    a.add("tail", 123, 45, true);
    a.allocate();
    const auto w = mixed_magnitude_floats(a.values().size(), 3);
    std::copy(w.begin(), w.end(), a.values().begin());
    return a;
  };
  model::ParamArena replicated = make_arena(), sharded = make_arena();
  const int64_t n = static_cast<int64_t>(replicated.values().size());
  train::AdamWConfig config;
  config.clip_norm = 0.5f;  // the summed gradients' norm is far above: every step clips
  train::AdamW reference(replicated, config, ops::cpu());
  train::AdamW zero1(sharded, config, ops::cpu(), train::AdamWShards{comm, train::optimizer_shards(n, ranks)});
  for (int step = 0; step < 3; ++step) {
    const auto g = mixed_magnitude_floats(static_cast<size_t>(n), 900 + static_cast<uint32_t>(step * ranks + rank));
    std::copy(g.begin(), g.end(), replicated.grads().begin());
    std::copy(g.begin(), g.end(), sharded.grads().begin());
    comm->sum_gradients(replicated.grads());
    comm->reduce_scatter_gradients(sharded.grads(), zero1.shards()->layout);
    const double norm = reference.step(replicated, 1e-3f), sharded_norm = zero1.step(sharded, 1e-3f);
    EXPECT_EQ(sharded_norm, norm) << "step " << step;
    EXPECT_GT(norm, config.clip_norm);
    EXPECT_EQ(std::vector<float>(sharded.values().begin(), sharded.values().end()),
              std::vector<float>(replicated.values().begin(), replicated.values().end()))
        << "step " << step;
  }
  EXPECT_LT(zero1.state_bytes() * ranks, reference.state_bytes() + ranks * 9 * ops::kSumOfSquaresChunk);
  const train::AdamWState whole = zero1.gather_state();
  if (rank == 0) {
    EXPECT_EQ(whole.first, reference.first_moments());
    EXPECT_EQ(whole.second, reference.second_moments());
  } else {
    EXPECT_TRUE(whole.first.empty());
  }
  EXPECT_EQ(whole.steps, 3);
  // Round trip: the gathered state scattered into a fresh sharded optimizer steps on alike.
  train::AdamW resumed(sharded, config, ops::cpu(), zero1.shards());
  resumed.scatter_state(whole);
  EXPECT_EQ(resumed.steps(), 3);
  const train::AdamWState again = resumed.gather_state();
  if (rank == 0) {
    EXPECT_EQ(again.first, whole.first);
  }
}

namespace {
// Whole pages inside [p, p + count) that are resident (mincore).
int64_t resident_pages(const float* p, int64_t count) {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p + count)) / page * page;
  if (end <= begin) return 0;
  std::vector<unsigned char> in_core((end - begin) / page);
  EXPECT_EQ(::mincore(reinterpret_cast<void*>(begin), end - begin, in_core.data()), 0);
  int64_t resident = 0;
  for (unsigned char c : in_core) resident += c & 1;
  return resident;
}
}  // namespace

// distributed.fp4_param_gather: a linear's NVFP4 weight (16x16 tiles) gathered from the ranks' pieces
// is byte for byte the quantization of the whole weight, also where a slice boundary cuts a 16-row
// band (qkv at 2 and 4 ranks, down at 3, wide at 4) and where the amax sits in another rank's part.
// Within a weight version the pieces are kept (only codes and scales move); a new version quantizes
// again; the rank keeps no FP32 page outside its slice afterwards; a NaN in one rank's part is a
// NumericalError naming the weight on every rank.
TEST(MpiCollectives, QuantizedWeightGatherIsTheWholeWeightsQuantization) {
  if (!train::launched_by_mpi()) GTEST_SKIP() << "not started by mpirun";
  train::Communicator* comm = mpi_world();
  const int ranks = comm->size(), rank = comm->rank();
  model::ParamArena arena(ops::cpu());
  arena.add("embedding", 1000, 77, false);
  arena.add("qkv", 96, 64, true);
  arena.add("down", 64, 336, true);
  arena.add("wide", 48, 1024, true);
  arena.allocate();
  const int64_t n = static_cast<int64_t>(arena.values().size());
  std::vector<float> whole = mixed_magnitude_floats(static_cast<size_t>(n), 23);
  const model::ParamInfo& wide = arena.find("wide");
  whole[static_cast<size_t>(wide.offset + wide.size() - 1)] = 4096.0f;  // the last rank's part holds its amax
  const train::ShardLayout layout = train::optimizer_shards(n, ranks, train::ShardMode::full);
  const int64_t own_begin = layout.begin(rank), own_end = layout.end(rank);
  float* values = arena.values().data();
  for (int64_t i = 0; i < n; ++i) values[i] = i >= own_begin && i < own_end ? whole[i] : std::nanf("");
  train::WeightShards shards(*comm, layout, arena, ops::cpu());
  QuantOptions o;
  o.format = Format::nvfp4;
  o.tile_16x16 = true;
  ASSERT_TRUE(shards.provides_quantized(o));
  QuantOptions rht = o;
  rht.rht = true;
  EXPECT_FALSE(shards.provides_quantized(rht));
  std::unique_ptr<ops::Quantized> q = ops::cpu().new_quantized();
  const auto expect_whole_quantization = [&](const model::ParamInfo& w, int64_t version) {
    SCOPED_TRACE(w.name + " version " + std::to_string(version));
    shards.acquire_quantized(w, o, version, *q);
    const QuantizedTensor got = q->to_host();
    const QuantizedTensor want = cpu::quantize(
        std::span<const float>(whole.data() + w.offset, static_cast<size_t>(w.size())), w.rows, w.cols, o);
    EXPECT_EQ(got.rows, want.rows);
    EXPECT_EQ(got.cols, want.cols);
    EXPECT_EQ(got.block, BlockShape::tile_16x16);
    EXPECT_EQ(got.codes, want.codes);
    EXPECT_EQ(got.scales, want.scales);
    EXPECT_EQ(got.amax, want.amax);
    EXPECT_EQ(got.decode_scale, want.decode_scale);
    // The bands cut by slice boundaries came whole and went back; only the pages they share with
    // their neighbours (which a phase may hold) can stay: two at most for each of the ranks - 1 cuts.
    EXPECT_LE(resident_pages(values, own_begin) + resident_pages(values + own_end, n - own_end), 2 * (ranks - 1));
  };
  for (const char* name : {"qkv", "down", "wide"}) expect_whole_quantization(arena.find(name), 0);
  // The same version again: the codes and scales of the others' bands, nothing more.
  const model::ParamInfo& down = arena.find("down");
  const int64_t before = shards.gathered_quantized_bytes();
  expect_whole_quantization(down, 0);
  const int64_t bands = down.rows / 16;
  const int64_t own_bands = std::clamp((own_end - down.offset + 16 * down.cols - 1) / (16 * down.cols), int64_t{0}, bands) -
                            std::clamp((own_begin - down.offset + 16 * down.cols - 1) / (16 * down.cols), int64_t{0}, bands);
  EXPECT_EQ(shards.gathered_quantized_bytes() - before, (bands - own_bands) * 16 * (down.cols / 2 + down.cols / 16));
  // New weights, new version: quantized again from them.
  for (int64_t i = own_begin; i < own_end; ++i) values[i] *= -2.0f;
  for (float& v : whole) v *= -2.0f;
  for (const char* name : {"qkv", "down", "wide"}) expect_whole_quantization(arena.find(name), 1);
  // A NaN in the last rank's part of `wide`: every rank refuses, naming the weight.
  if (rank == ranks - 1) values[wide.offset + wide.size() - 1] = std::nanf("");
  try {
    shards.acquire_quantized(wide, o, 2, *q);
    ADD_FAILURE() << "a NaN weight was gathered";
  } catch (const NumericalError& e) {
    EXPECT_NE(std::string(e.what()).find("weight wide holds a non-finite value in rank " + std::to_string(ranks - 1)),
              std::string::npos)
        << e.what();
  }
}

// ZeRO-3's gathers (train/weight_shards.h): each rank starts with its slice valid and the rest NaN;
// acquiring any range gives every rank the owners' bits there and counts the bytes received;
// releasing gives the whole pages outside the slice back (not resident), the slice untouched;
// gather_to_root gives rank 0 the whole arena.
TEST(MpiCollectives, WeightShardsGatherTheOwnersBitsAndReleaseTheRest) {
  if (!train::launched_by_mpi()) GTEST_SKIP() << "not started by mpirun";
  train::Communicator* comm = mpi_world();
  const int ranks = comm->size(), rank = comm->rank();
  model::ParamArena arena(ops::cpu());
  arena.add("embedding", 1000, 77, false);
  arena.add("matrix", 600, 257, true);
  arena.add("norm", 1, 4099, false);
  arena.add("tail", 123, 45, true);
  arena.allocate();
  const int64_t n = static_cast<int64_t>(arena.values().size());
  const std::vector<float> whole = mixed_magnitude_floats(static_cast<size_t>(n), 5);
  const train::ShardLayout layout = train::optimizer_shards(n, ranks, train::ShardMode::full);
  const int64_t own_begin = layout.begin(rank), own_end = layout.end(rank);
  float* values = arena.values().data();
  for (int64_t i = 0; i < n; ++i) values[i] = i >= own_begin && i < own_end ? whole[i] : std::nanf("");
  train::WeightShards shards(*comm, layout, arena, ops::cpu());
  EXPECT_EQ(shards.owned_begin(), own_begin);
  shards.drop_unowned();
  EXPECT_EQ(resident_pages(values, own_begin), 0);
  EXPECT_EQ(resident_pages(values + own_end, n - own_end), 0);
  std::mt19937_64 rng(17);  // the same ranges on every rank: acquire is collective
  int64_t expected_bytes = 0;
  for (int k = 0; k < 8; ++k) {
    const int64_t begin = static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
    const int64_t end = k == 0 ? n : begin + 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(n - begin));
    shards.acquire(k == 0 ? 0 : begin, end);
    const int64_t first = k == 0 ? 0 : begin;
    EXPECT_EQ(std::vector<float>(values + first, values + end), std::vector<float>(whole.begin() + first, whole.begin() + end))
        << "range " << k;
    const int64_t own = std::max<int64_t>(0, std::min(end, own_end) - std::max(first, own_begin));
    expected_bytes += 4 * (end - first - own);
    shards.release(first, end);
    EXPECT_EQ(resident_pages(values + first, std::max<int64_t>(0, std::min(end, own_begin) - first)), 0) << k;
    EXPECT_EQ(resident_pages(values + std::max(first, own_end), std::max<int64_t>(0, end - std::max(first, own_end))), 0)
        << k;
  }
  EXPECT_EQ(shards.gathered_bytes(), expected_bytes);
  EXPECT_EQ(std::vector<float>(values + own_begin, values + own_end),
            std::vector<float>(whole.begin() + own_begin, whole.begin() + own_end));
  shards.gather_to_root();
  if (rank == 0) {
    EXPECT_EQ(std::vector<float>(values, values + n), whole);
  }
}
