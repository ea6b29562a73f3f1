// Training on the CUDA backend (device=cuda) against the CPU, on a GPU (skipped with the reason
// without one; the CPU-only parts run everywhere):
//  * one whole-model step in FP32 (quantization=none): the loss and every parameter gradient;
//  * NVFP4 training: the loss curve of a 200-step GPU run against CPU runs of the same model;
//  * sampling over a KV cache on the GPU against the CPU's;
//  * the state moves between devices: the weights and AdamW moments a GPU run has are the ones a
//    CPU run continues from.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "model/transformer.h"
#include "train/trainer.h"
#include "support/tiny_model.h"
#if defined(NIBBLE_HAVE_CUDA)
#include "kernels/cuda/cuda_error.h"
#endif

using namespace nibble;

namespace {

model::ModelConfig small_model() {
  return nibble_test::tiny_model({.vocab = 48, .layers = 2, .width = 64, .context = 32, .mlp_hidden = 128});
}

// A corpus with structure to learn: a noisy walk over the vocabulary (next = current + small step).
std::vector<int32_t> walk_corpus(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> c(static_cast<size_t>(n));
  int32_t x = 0;
  for (auto& t : c) {
    x = static_cast<int32_t>((x + 1 + static_cast<int32_t>(rng() % 3)) % vocab);
    t = x;
  }
  return c;
}

train::TrainConfig small_run(Quantization q, ops::Device device, uint64_t seed, int64_t steps) {
  train::TrainConfig c;
  c.model = small_model();
  c.recipe.quantization = q;
  c.batch = 4;
  c.seq = 32;
  c.grad_accum = 2;
  c.eval_batches = 2;
  c.seed = seed;
  c.device = device;
  c.schedule.total_steps = steps;
  c.schedule.warmup_steps = 10;
  c.schedule.lr = 3e-3f;
  c.schedule.min_lr = 3e-4f;
  return c;
}

TEST(CudaTraining, DeviceCudaWithoutAGpuIsRefusedNamingTheFix) {
#if defined(NIBBLE_HAVE_CUDA)
  if (cuda::probe_devices().available) GTEST_SKIP() << "a GPU is usable here";
#endif
  const auto corpus = walk_corpus(4000, 48, 1);
  try {
    train::Trainer t(small_run(Quantization::nvfp4, ops::Device::cuda, 1, 10), corpus);
    FAIL() << "device=cuda trained without a GPU";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("device=cpu"), std::string::npos) << e.what();
  }
}

#if defined(NIBBLE_HAVE_CUDA)

class CudaTrainingOnGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto a = cuda::probe_devices();
    if (!a.available) GTEST_SKIP() << "skipping GPU test: " << a.reason;
  }
};

// Both models start from the same weights and see the same batch; every op is FP32 on both sides.
// They differ by summation order only (cuBLASLt's GEMMs, the device's expf), so each gradient tensor
// differs from the CPU's by a relative amount bounded by the error of its longest FP32 sums, chained
// through the layers: relative Frobenius error <= 4 (layers + 2) K u with K the largest reduction
// length (tokens, width, hidden or vocabulary) and u = 2^-24.
TEST_F(CudaTrainingOnGpu, WholeModelStepMatchesTheCpu) {
  const model::ModelConfig m = small_model();
  model::Transformer cpu_model(m, ops::cpu()), gpu_model(m, ops::cuda());
  cpu_model.init_weights(7);
  gpu_model.init_weights(7);
  ASSERT_EQ(cpu_model.params().host_values(), gpu_model.params().host_values());
  const int64_t batch = 4, seq = 32, N = batch * seq;
  const auto tokens = walk_corpus(N + 1, m.vocab, 3);
  const std::vector<int32_t> inputs(tokens.begin(), tokens.end() - 1), targets(tokens.begin() + 1, tokens.end());
  model::ModelStep step;  // no recipe: FP32 everywhere
  const double cpu_loss = cpu_model.forward(inputs, targets, batch, seq, step);
  const double gpu_loss = gpu_model.forward(inputs, targets, batch, seq, step);
  cpu_model.backward(1.0f);
  gpu_model.backward(1.0f);
  const double u = std::ldexp(1.0, -24);
  const int64_t K = std::max({N, m.width, m.hidden(), m.vocab});
  const double tol = 4.0 * static_cast<double>(m.layers + 2) * static_cast<double>(K) * u;
  EXPECT_NEAR(gpu_loss, cpu_loss, tol * cpu_loss);
  const auto g_cpu = cpu_model.params().host_grads(), g_gpu = gpu_model.params().host_grads();
  for (const auto& p : cpu_model.params().params()) {
    double diff = 0, norm = 0;
    for (int64_t i = p.offset; i < p.offset + p.size(); ++i) {
      diff += (static_cast<double>(g_gpu[i]) - g_cpu[i]) * (static_cast<double>(g_gpu[i]) - g_cpu[i]);
      norm += static_cast<double>(g_cpu[i]) * g_cpu[i];
    }
    EXPECT_LE(std::sqrt(diff), tol * std::sqrt(norm)) << p.name;
  }
}

// Sampling (Transformer::decode over a KV cache, `nibble generate --device cuda`): the next-token
// logits of a prompt and of one more token, within the same FP32 bound as a step.
TEST_F(CudaTrainingOnGpu, DecodingMatchesTheCpu) {
  const model::ModelConfig m = small_model();
  model::Transformer cpu_model(m, ops::cpu()), gpu_model(m, ops::cuda());
  cpu_model.init_weights(8);
  gpu_model.init_weights(8);
  model::KvCache cpu_cache(m, ops::cpu()), gpu_cache(m, ops::cuda());
  const auto prompt = walk_corpus(12, m.vocab, 4);
  const double u = std::ldexp(1.0, -24);
  const double tol = 4.0 * static_cast<double>(m.layers + 2) * static_cast<double>(std::max(m.hidden(), m.vocab)) * u;
  for (int round = 0; round < 2; ++round) {
    const std::vector<int32_t> feed = round == 0 ? prompt : std::vector<int32_t>{5};
    const auto c = cpu_model.decode(cpu_cache, feed);
    const std::vector<float> want(c.begin(), c.end());
    const auto g = gpu_model.decode(gpu_cache, feed);
    double scale = 0;
    for (float v : want) scale = std::max(scale, static_cast<double>(std::fabs(v)));
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(g[i], want[i], tol * scale) << "round " << round << " logit " << i;
  }
}

// The mean loss of the last 20 steps of a 200-step NVFP4 run: the GPU's must lie within the spread of
// CPU runs that differ only in their seed, widened by that spread on each side (the criterion:
// a GPU run is as good as another CPU run).
TEST_F(CudaTrainingOnGpu, Nvfp4LossCurveMatchesTheCpuRuns) {
  const int64_t steps = 200;
  const auto corpus = walk_corpus(60000, 48, 5);
  auto final_loss = [&](ops::Device device, uint64_t seed, std::vector<double>* curve) {
    train::Trainer t(small_run(Quantization::nvfp4, device, seed, steps), corpus);
    double tail = 0;
    for (int64_t s = 0; s < steps; ++s) {
      const double loss = t.step().loss;
      if (curve) curve->push_back(loss);
      if (s >= steps - 20) tail += loss / 20.0;
    }
    return tail;
  };
  std::vector<double> cpu_finals;
  for (uint64_t seed : {11, 12, 13}) cpu_finals.push_back(final_loss(ops::Device::cpu, seed, nullptr));
  std::vector<double> gpu_curve;
  const double gpu_final = final_loss(ops::Device::cuda, 11, &gpu_curve);
  const auto [lo, hi] = std::minmax_element(cpu_finals.begin(), cpu_finals.end());
  const double spread = *hi - *lo;
  std::printf("final loss (mean of the last 20 steps): cpu %.4f %.4f %.4f, gpu %.4f\n", cpu_finals[0], cpu_finals[1],
              cpu_finals[2], gpu_final);
  EXPECT_GE(gpu_final, *lo - spread);
  EXPECT_LE(gpu_final, *hi + spread);
  EXPECT_LT(gpu_curve.back(), gpu_curve.front() * 0.8) << "the GPU run did not learn";
}

// The state a GPU run holds is plain host data once copied: a CPU trainer given it holds the GPU's
// weights and moments bit for bit and continues from them (what a checkpoint carries across devices).
TEST_F(CudaTrainingOnGpu, StateMovesBetweenDevicesBitForBit) {
  const auto corpus = walk_corpus(8000, 48, 9);
  train::Trainer gpu(small_run(Quantization::nvfp4, ops::Device::cuda, 21, 20), corpus);
  for (int i = 0; i < 3; ++i) gpu.step();
  train::Trainer cpu(small_run(Quantization::nvfp4, ops::Device::cpu, 21, 20), corpus);
  cpu.model().params().set_values(gpu.model().params().host_values());
  cpu.optimizer().set_moments(gpu.optimizer().first_moments(), gpu.optimizer().second_moments());
  cpu.optimizer().set_steps(gpu.optimizer().steps());
  EXPECT_EQ(cpu.model().params().host_values(), gpu.model().params().host_values());
  EXPECT_EQ(cpu.optimizer().first_moments(), gpu.optimizer().first_moments());
  EXPECT_TRUE(std::isfinite(cpu.step().loss));
  EXPECT_EQ(cpu.optimizer().steps(), 4);
}

// distributed.shard=optimizer (ZeRO-1) on a GPU, one process: the sharded optimizer's path (the norm
// from the slice's chunk sums, AdamW on its slice, the state gathered through the host) trains
// bitwise like the replicated one. Several GPUs run the NCCL collectives it adds in
// test_cuda_collective (and under the CUDA model in CI).
TEST_F(CudaTrainingOnGpu, ShardedOptimizerTrainsLikeTheReplicatedOne) {
  const auto corpus = walk_corpus(8000, 48, 13);
  train::TrainConfig replicated_config = small_run(Quantization::nvfp4, ops::Device::cuda, 31, 20), sharded_config = replicated_config;
  sharded_config.shard = train::ShardMode::optimizer;
  train::Trainer replicated(replicated_config, corpus), sharded(sharded_config, corpus);
  ASSERT_TRUE(sharded.optimizer().sharded());
  for (int i = 0; i < 3; ++i) {
    const train::StepResult a = replicated.step(), b = sharded.step();
    EXPECT_EQ(a.loss, b.loss) << "step " << i;
    EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << i;
  }
  EXPECT_EQ(replicated.model().params().host_values(), sharded.model().params().host_values());
  const train::AdamWState state = sharded.optimizer().gather_state();
  EXPECT_EQ(state.first, replicated.optimizer().first_moments());
  EXPECT_EQ(state.second, replicated.optimizer().second_moments());
}

// ZeRO-2 and ZeRO-3 on one GPU: nothing is unowned, but every micro-batch's gradients are released
// (the arena's chunks unmapped) and committed again stretch by stretch as the backward pass writes
// them, and the weights' phases go through commit; the run stays bitwise the replicated one, with
// one micro-batch and with two (the tree sum over them). The memory released between steps is
// what the chunks' mapping gives back.
TEST_F(CudaTrainingOnGpu, ShardedGradientsAndWeightsTrainLikeTheReplicatedOne) {
  const auto corpus = walk_corpus(8000, 48, 13);
  for (auto mode : {train::ShardMode::gradients, train::ShardMode::full})
    for (int64_t accumulation : {1, 2}) {
      train::TrainConfig replicated_config = small_run(Quantization::nvfp4, ops::Device::cuda, 31, 20);
      replicated_config.grad_accum = accumulation;
      train::TrainConfig sharded_config = replicated_config;
      sharded_config.shard = mode;
      train::Trainer replicated(replicated_config, corpus), sharded(sharded_config, corpus);
      for (int i = 0; i < 3; ++i) {
        const train::StepResult a = replicated.step(), b = sharded.step();
        EXPECT_EQ(a.loss, b.loss) << train::to_string(mode) << " x" << accumulation << ", step " << i;
        EXPECT_EQ(a.grad_norm, b.grad_norm) << train::to_string(mode) << " x" << accumulation << ", step " << i;
      }
      EXPECT_EQ(replicated.model().params().host_values(), sharded.model().params().host_values())
          << train::to_string(mode) << " x" << accumulation;
    }
}

#endif  // NIBBLE_HAVE_CUDA

}  // namespace
