// The tensor-core attention (kernels/cuda/flash_attention.cuh) under the CUDA model: first the
// model's mma.sync m16n8k16 against a plain matrix product, then the tiled forward and backward
// against the CPU attention (kernels/cpu/layers/attention.*) with BF16 products, within bounds
// derived below, and the same bits under every schedule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/common/cpu_features.h"
#include "kernels/cpu/layers/attention.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/device_math.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/layers.h"
#include "kernels/cuda/mma.h"
#include "support/attention_bounds.h"
#include "support/check.h"
#include "support/random.h"

using namespace nibble;
using nibble_test::normal_floats;
using nibble_test::same_bits;

namespace {

constexpr double kU = 0x1p-24;    // FP32 unit roundoff (round to nearest)
double gamma(double n) { return n * kU / (1 - n * kU); }  // sum of n+1 terms in FP32, any order: |error| <= gamma(n) sum |terms|

// One warp: every lane builds its fragments of A [16x16], B [16x8] (BF16 bits) and C [16x8] by the
// PTX ISA's layout (mma.h), runs the mma and writes its D fragment back by the same layout.
__global__ void one_mma(const uint16_t* a, const uint16_t* b, const float* c, float* d) {
  const int lane = static_cast<int>(threadIdx.x), g = lane / 4, t = lane % 4;
  const auto two = [](uint16_t lo, uint16_t hi) { return static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16; };
  uint32_t fa[4], fb[2];
  float fc[4];
  for (int r = 0; r < 4; ++r) {
    const int row = g + 8 * (r % 2), col = 2 * t + 8 * (r / 2);
    fa[r] = two(a[row * 16 + col], a[row * 16 + col + 1]);
    fc[r] = c[(g + 8 * (r / 2)) * 8 + 2 * t + r % 2];
  }
  for (int r = 0; r < 2; ++r) fb[r] = two(b[(2 * t + 8 * r) * 8 + g], b[(2 * t + 8 * r + 1) * 8 + g]);
  cuda::mma::mma_bf16_16x8x16(fc, fa, fb);
  for (int r = 0; r < 4; ++r) d[(g + 8 * (r / 2)) * 8 + 2 * t + r % 2] = fc[r];
}

struct MmaCase {
  std::vector<uint16_t> a, b;  // BF16 bits
  std::vector<float> c;
};
std::vector<float> run_mma(const MmaCase& m) {
  cuda::Context ctx(0);
  auto a = cuda::DeviceBuffer<uint16_t>::from_host(m.a, ctx.stream());
  auto b = cuda::DeviceBuffer<uint16_t>::from_host(m.b, ctx.stream());
  auto c = cuda::DeviceBuffer<float>::from_host(m.c, ctx.stream());
  cuda::DeviceBuffer<float> d(128, ctx.stream());
  NIBBLE_LAUNCH(1, 32, 0, ctx.stream(), one_mma)(a.data(), b.data(), c.data(), d.data());
  return d.download();
}

// The model's mma is the matrix product: on small integers every sum is exact, so D must be the
// product's bits (a lane or register misplaced by the layout moves some product); on normal data
// the FP32 sum of C and 16 exact products, in any order, is within gamma(16) (|C| + sum |A B|) of
// the exact value (computed in double, itself within 16 2^-53 of the same magnitude).
TEST(CudaModelMma, M16n8k16Bf16IsTheMatrixProductByThePtxFragmentLayout) {
  for (bool integers : {true, false}) {
    const auto ra = normal_floats(256, integers ? 11 : 21), rb = normal_floats(128, integers ? 12 : 22),
               rc = normal_floats(128, integers ? 13 : 23);
    const auto value = [&](float x) { return integers ? std::nearbyint(4 * x) : x; };
    MmaCase m;
    for (float x : ra) m.a.push_back(cuda::dm::bf16_bits_rn(value(x)));
    for (float x : rb) m.b.push_back(cuda::dm::bf16_bits_rn(value(x)));
    for (float x : rc) m.c.push_back(value(x));
    const std::vector<float> d = run_mma(m);
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 8; ++j) {
        double exact = m.c[i * 8 + j], magnitude = std::fabs(exact);
        for (int k = 0; k < 16; ++k) {
          const double p = static_cast<double>(cuda::dm::bf16_bits_to_float(m.a[i * 16 + k])) *
                           cuda::dm::bf16_bits_to_float(m.b[k * 8 + j]);
          exact += p;
          magnitude += std::fabs(p);
        }
        const double bound = integers ? 0.0 : (gamma(16) + 16 * 0x1p-53) * magnitude;
        EXPECT_LE(std::fabs(d[i * 8 + j] - exact), bound) << "D[" << i << "][" << j << "], integers " << integers;
      }
  }
}

// (seed, SM count) of the schedules: block order and the interleaving of a block's threads.
constexpr std::pair<uint64_t, int> kFlashSchedules[] = {{5, 1}, {6, 3}};

class CudaModelFlash : public ::testing::Test {
 protected:
  void SetUp() override { cpu::set_isa_limit(cpu::Isa::scalar); }
  void TearDown() override { cpu::set_isa_limit(cpu::detected_isa()); }
};

// Sequence lengths around the 64-row tile (under one, one, ragged second and third tiles), GQA
// groups of 1, 2 and 3 query heads, both head dims of the tiled path, two sequences of a batch.
TEST_F(CudaModelFlash, ForwardAndBackwardAreWithinTheBf16BoundsOfTheCpuAndTheSameBitsUnderEverySchedule) {
  const AttentionShape shapes[] = {{2, 70, 4, 2, 32, true}, {1, 64, 2, 2, 64, true}, {1, 7, 3, 1, 64, true},
                                   {1, 150, 3, 1, 32, true}};
  uint32_t seed = 300;
  for (const AttentionShape& a : shapes) {
    ASSERT_EQ(a.head_dim == 32 || a.head_dim == 64, true);
    const auto qkv = normal_floats(a.batch * a.seq * a.qkv_stride(), ++seed);
    const auto dout = normal_floats(a.batch * a.seq * a.out_width(), ++seed);
    std::vector<float> out(dout.size()), stats(a.softmax_stats_size()), dqkv(qkv.size());
    cpu::attention_forward(a, qkv.data(), out.data(), stats.data());
    cpu::attention_backward(a, qkv.data(), stats.data(), dout.data(), dqkv.data());
    const nibble_test::AttentionBounds bound = nibble_test::attention_bounds(a, qkv, dout, kU);
    const std::string shape = "shape {" + std::to_string(a.batch) + ", " + std::to_string(a.seq) + ", " +
                              std::to_string(a.heads) + ", " + std::to_string(a.kv_heads) + ", " +
                              std::to_string(a.head_dim) + "}";
    std::vector<float> first_out, first_stats, first_dqkv;
    for (const auto& schedule : kFlashSchedules) {
      cuda_model::set_seed(schedule.first);
      cuda_model::set_sm_count(schedule.second);
      cuda::Context ctx(0);
      const uint64_t launches = cuda_model::launches();
      auto dq = cuda::DeviceBuffer<float>::from_host(qkv, ctx.stream());
      auto ddo = cuda::DeviceBuffer<float>::from_host(dout, ctx.stream());
      auto cpu_stats = cuda::DeviceBuffer<float>::from_host(stats, ctx.stream());
      cuda::DeviceBuffer<float> gout(out.size(), ctx.stream()), gstats(stats.size(), ctx.stream()),
          gdqkv(qkv.size(), ctx.stream());
      cuda::attention_forward(a, dq.data(), gout.data(), gstats.data(), ctx);
      EXPECT_NE(cuda_model::last_kernel_name().find("forward_kernel<"), std::string::npos) << cuda_model::last_kernel_name();
      cuda::attention_backward(a, dq.data(), cpu_stats.data(), ddo.data(), gdqkv.data(), ctx);
      EXPECT_EQ(cuda_model::launches() - launches, 4u);  // forward, then D, dK/dV and dQ
      const auto o = gout.download(), st = gstats.download(), g = gdqkv.download();
      int bad = 0;
      for (size_t i = 0; i < o.size(); ++i)
        if (!(std::fabs(o[i] - out[i]) <= bound.out[i]) && bad++ < 3)
          ADD_FAILURE() << shape << ": O[" << i << "] " << o[i] << " vs the CPU's " << out[i] << ", bound " << bound.out[i];
      for (size_t i = 0; i < st.size(); i += 2) {
        if (!(std::fabs(st[i] - stats[i]) <= bound.max_error) && bad++ < 6)
          ADD_FAILURE() << shape << ": row max " << i / 2 << ": " << st[i] << " vs " << stats[i];
        if (!(std::fabs(st[i + 1] - stats[i + 1]) <= bound.inverse_relative * stats[i + 1]) && bad++ < 6)
          ADD_FAILURE() << shape << ": row 1/sum " << i / 2 << ": " << st[i + 1] << " vs " << stats[i + 1];
      }
      for (size_t i = 0; i < g.size(); ++i)
        if (!(std::fabs(g[i] - dqkv[i]) <= bound.dqkv[i]) && bad++ < 9)
          ADD_FAILURE() << shape << ": dqkv[" << i << "] (token " << i / a.qkv_stride() << ", column "
                        << i % a.qkv_stride() << ") " << g[i] << " vs the CPU's " << dqkv[i] << ", bound " << bound.dqkv[i];
      EXPECT_EQ(bad, 0) << shape << ", seed " << schedule.first;
      // Given O as the forward wrote it (training keeps it per layer), the backward reads it for the row
      // sums of dO * O instead of recomputing it: three launches, the same bits.
      cuda::DeviceBuffer<float> recomputed(qkv.size(), ctx.stream()), given(qkv.size(), ctx.stream());
      cuda::attention_backward(a, dq.data(), gstats.data(), ddo.data(), recomputed.data(), ctx);
      const uint64_t before_given = cuda_model::launches();
      cuda::attention_backward(a, dq.data(), gstats.data(), ddo.data(), given.data(), ctx, gout.data());
      EXPECT_EQ(cuda_model::launches() - before_given, 3u);  // D from O, dK/dV, dQ
      EXPECT_TRUE(cuda::attention_backward_takes_output(a, ctx));
      EXPECT_TRUE(same_bits(given.download(), recomputed.download())) << shape << ", seed " << schedule.first;
      if (first_out.empty()) {
        first_out = o, first_stats = st, first_dqkv = g;
      } else {
        EXPECT_TRUE(same_bits(o, first_out) && same_bits(st, first_stats) && same_bits(g, first_dqkv))
            << shape << ": the bits changed with the schedule";
      }
    }
    // The bounds are tight enough to mean something: well under the values' own size.
    double largest = 0, widest = 0;
    for (size_t i = 0; i < dqkv.size(); ++i) largest = std::max(largest, std::fabs(double(dqkv[i]))), widest = std::max(widest, bound.dqkv[i]);
    EXPECT_LT(widest, largest / 16) << shape;
  }
}

// The tiles are staged four floats at a time from 16-byte-aligned rows, else one at a time: a qkv
// and dO one float past an aligned address take the scalar staging and give the same bits.
TEST_F(CudaModelFlash, UnalignedOperandsAreStagedOneFloatAtATimeToTheSameBits) {
  const AttentionShape a{1, 70, 2, 1, 64, true};
  const auto qkv = normal_floats(a.seq * a.qkv_stride(), 401), dout = normal_floats(a.seq * a.out_width(), 402);
  cuda::Context ctx(0);
  std::vector<std::vector<float>> results[2];
  for (int offset = 0; offset < 2; ++offset) {
    std::vector<float> padded_qkv(offset, 0.0f), padded_dout(offset, 0.0f);
    padded_qkv.insert(padded_qkv.end(), qkv.begin(), qkv.end());
    padded_dout.insert(padded_dout.end(), dout.begin(), dout.end());
    auto dq = cuda::DeviceBuffer<float>::from_host(padded_qkv, ctx.stream());
    auto ddo = cuda::DeviceBuffer<float>::from_host(padded_dout, ctx.stream());
    cuda::DeviceBuffer<float> out(dout.size(), ctx.stream()), stats(a.softmax_stats_size(), ctx.stream()),
        dqkv(qkv.size(), ctx.stream());
    cuda::attention_forward(a, dq.data() + offset, out.data(), stats.data(), ctx);
    cuda::attention_backward(a, dq.data() + offset, stats.data(), ddo.data() + offset, dqkv.data(), ctx);
    results[offset] = {out.download(), stats.download(), dqkv.download()};
  }
  EXPECT_TRUE(same_bits(results[0][0], results[1][0])) << "O";
  EXPECT_TRUE(same_bits(results[0][1], results[1][1])) << "softmax stats";
  EXPECT_TRUE(same_bits(results[0][2], results[1][2])) << "dqkv";
}

}  // namespace
