// Quantized GEMM kernels against the FP64 reference, for every ISA variant this machine runs.
//
// Tolerance, from the math: a kernel forms each term exactly (int8 family: a block's integer dot
// product times sA*sB; f32 family: one FP8 x FP8 product times power-of-two scales) and sums the
// `terms` terms in FP32 in some order, then multiplies by the global factors (a few more FP32
// roundings). Recursive summation of n terms errs by at most gamma_{n-1} * sum |term|, with
// gamma_n = n*u/(1 - n*u), u = 2^-24. So |c - c_ref| <= gamma_{terms+4} * sum|term| * |global|
// (the +4 covering the scale products and the final multiply), plus a few FLT_MIN for underflow.
// The absolute-value sum is computed here in FP64 from the codes, independently of ref::gemm.
// Summation::fp32_products (AMX-BF16) forms every element product exactly and sums the K of them
// in FP32 (the tile unit rounds to nearest even), so the same bound holds with terms = K.
#include <cpuid.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "format/codecs.h"
#include "format/quantize.h"
#include "kernels/cpu/common/cpu_features.h"
#include "kernels/cpu/gemm/gemm.h"
#include "kernels/cpu/gemm/gemm_kernels.h"
#include "kernels/cpu/quantize/quantize.h"

namespace nibble {
namespace {

using cpu::Isa;

// Random rows whose magnitude varies by 2^±6 from block to block, so block scales differ.
std::vector<float> random_matrix(int64_t rows, int64_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> octave(-6.0f, 6.0f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    float magnitude = 1.0f;
    for (int64_t k = 0; k < cols; ++k) {
      if (k % 16 == 0) magnitude = std::exp2(octave(rng));
      x[r * cols + k] = normal(rng) * magnitude;
    }
  }
  return x;
}

QuantizedTensor make_operand(Format format, int64_t rows, int64_t cols, uint64_t seed, bool tile_16x16 = false) {
  QuantOptions opt;
  opt.format = format;
  opt.tile_16x16 = tile_16x16;
  std::vector<float> x = random_matrix(rows, cols, seed);
  return cpu::quantize(x, rows, cols, opt);
}

double element(const QuantizedTensor& q, int64_t r, int64_t k) {
  if (q.is_4bit()) {
    uint8_t byte = q.codes[r * (q.cols / 2) + k / 2];
    return e2m1_decode(k % 2 ? byte >> 4 : byte & 15);
  }
  uint8_t code = q.codes[r * q.cols + k];
  return q.format == Format::fp8_e5m2 ? e5m2_decode(code) : e4m3_decode(code);
}

double scale(const QuantizedTensor& q, int64_t r, int64_t k) {
  if (q.block == BlockShape::per_tensor) return 1.0;
  uint8_t s = q.scales[r * (q.cols / q.block_len()) + k / q.block_len()];
  return q.format == Format::nvfp4 ? e4m3_decode(s) : std::ldexp(1.0, s - 127);
}

double gamma(int64_t n) {
  const double u = std::ldexp(1.0, -24);
  return n * u / (1.0 - n * u);
}

// Per output element: the bound on |c - c_ref| described at the top of this file.
std::vector<double> error_bounds(const QuantizedTensor& a, const QuantizedTensor& b, float alpha,
                                 cpu::Summation summation = cpu::Summation::block_exact) {
  const int64_t M = a.rows, N = b.rows, K = a.cols;
  const bool int8_family = (a.format == Format::nvfp4 || a.format == Format::mxfp4) && summation == cpu::Summation::block_exact;
  const int64_t term_len = int8_family ? a.block_len() : 1;
  const int64_t terms = K / term_len;
  std::vector<double> bound(static_cast<size_t>(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      // Row-scaled operands: A's S_dec of row m, B's of row n.
      const double global = std::fabs(static_cast<double>(alpha) * a.decode_scale_of_row(m) * b.decode_scale_of_row(n));
      double abs_sum = 0.0;
      for (int64_t t = 0; t < terms; ++t) {
        double term = 0.0;
        for (int64_t k = t * term_len; k < (t + 1) * term_len; ++k) term += element(a, m, k) * element(b, n, k);
        abs_sum += std::fabs(term * scale(a, m, t * term_len) * scale(b, n, t * term_len));
      }
      bound[m * N + n] = gamma(terms + 4) * abs_sum * global + 4.0 * FLT_MIN;
    }
  return bound;
}

std::vector<Isa> runnable_isas() {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amx})
    if (isa <= cpu::detected_isa()) isas.push_back(isa);
  return isas;
}

// Restores the full ISA when a test ends, even on failure.
struct IsaGuard {
  ~IsaGuard() { cpu::set_isa_limit(cpu::detected_isa()); }
};
// And the BF16 pair kernel back to the CPU's choice.
struct Bf16PairKernelGuard {
  ~Bf16PairKernelGuard() { cpu::set_bf16_pair_kernel(std::nullopt); }
};

// Runs every variant on (a, b) with C poisoned by NaN and checks each element against the reference.
// NVFP4, MXFP4 and FP8 operands also run Summation::fp32_products (its own kernel where AMX-BF16 is
// active).
void expect_matches_reference(const QuantizedTensor& a, const QuantizedTensor& b, float alpha = 1.0f) {
  const int64_t M = a.rows, N = b.rows;
  const int64_t ldc = N + 3;  // the padding must stay untouched
  std::vector<double> ref(static_cast<size_t>(M * N));
  ref::gemm(a, b, ref.data(), N);
  std::vector<cpu::Summation> summations = {cpu::Summation::block_exact};
  const bool fp8 = a.format == Format::fp8_e4m3 || a.format == Format::fp8_e5m2;
  if (a.format == Format::nvfp4 || a.format == Format::mxfp4 || fp8) summations.push_back(cpu::Summation::fp32_products);
  IsaGuard guard;
  for (cpu::Summation summation : summations)
  for (Isa isa : runnable_isas()) {
    const std::vector<double> bound = error_bounds(a, b, alpha, summation);
    cpu::set_isa_limit(isa);
    std::vector<float> c(static_cast<size_t>(M * ldc), std::numeric_limits<float>::quiet_NaN());
    cpu::gemm(a, b, c.data(), ldc, alpha, Output::overwrite, summation);
    int64_t failures = 0;
    for (int64_t m = 0; m < M && failures < 5; ++m) {
      for (int64_t n = 0; n < N && failures < 5; ++n) {
        double want = alpha * ref[m * N + n], got = c[m * ldc + n];
        // Written as !(x <= bound) so that NaN fails.
        if (!(std::fabs(got - want) <= bound[m * N + n])) {
          ADD_FAILURE() << cpu::to_string(isa) << (summation == cpu::Summation::fp32_products ? " fp32_products " : " ")
                        << to_string(a.format) << " M=" << M << " N=" << N
                        << " K=" << a.cols << " C[" << m << "," << n << "] = " << got << ", reference " << want
                        << ", bound " << bound[m * N + n];
          ++failures;
        }
      }
      for (int64_t n = N; n < ldc; ++n) ASSERT_TRUE(std::isnan(c[m * ldc + n])) << "wrote past N";
    }
  }
}

struct Shape {
  int64_t M, N, K;
};

// Edges around the micro-tile (8 x 32) and the macro tile (96 x 256), and K around the 512-wide
// K chunk, plus a few random shapes.
std::vector<Shape> shapes(int64_t k_multiple) {
  std::vector<Shape> s = {{1, 1, 16},    {1, 33, 32},    {7, 31, 48},    {8, 32, 512},  {9, 33, 528},
                          {17, 65, 1024}, {95, 255, 64},  {96, 256, 160}, {97, 257, 96}, {300, 300, 256},
                          {5, 3, 4096},   {33, 40, 4096}, {128, 64, 2048}};
  std::mt19937 rng(1234);
  for (int i = 0; i < 6; ++i)
    s.push_back({1 + static_cast<int64_t>(rng() % 300), 1 + static_cast<int64_t>(rng() % 300),
                 16 * (1 + static_cast<int64_t>(rng() % 40))});
  for (Shape& x : s) x.K = (x.K + k_multiple - 1) / k_multiple * k_multiple;
  return s;
}

int64_t round_up16(int64_t x) { return (x + 15) / 16 * 16; }

TEST(Gemm, Nvfp4RowBlocksMatchReference) {
  uint64_t seed = 1;
  for (Shape s : shapes(16)) {
    SCOPED_TRACE("M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K));
    expect_matches_reference(make_operand(Format::nvfp4, s.M, s.K, seed), make_operand(Format::nvfp4, s.N, s.K, seed + 1));
    seed += 2;
  }
}

TEST(Gemm, Nvfp4TileBlocksOnEitherSideMatchReference) {
  // 16x16 tiles need a multiple of 16 rows.
  for (Shape s : {Shape{16, 48, 64}, Shape{96, 272, 512}, Shape{48, 16, 1040}}) {
    SCOPED_TRACE("M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K));
    QuantizedTensor x = make_operand(Format::nvfp4, s.M, s.K, 11);
    QuantizedTensor w = make_operand(Format::nvfp4, round_up16(s.N), s.K, 12, /*tile_16x16=*/true);
    QuantizedTensor wa = make_operand(Format::nvfp4, round_up16(s.M), s.K, 13, true);
    expect_matches_reference(x, w);
    expect_matches_reference(wa, x.rows == wa.rows ? w : make_operand(Format::nvfp4, s.N, s.K, 14));
    expect_matches_reference(wa, w);
  }
}

TEST(Gemm, Mxfp4MatchesReference) {
  uint64_t seed = 100;
  for (Shape s : shapes(32)) {
    SCOPED_TRACE("M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K));
    expect_matches_reference(make_operand(Format::mxfp4, s.M, s.K, seed), make_operand(Format::mxfp4, s.N, s.K, seed + 1));
    seed += 2;
  }
}

TEST(Gemm, Mxfp4WithExtremeScalesFallsBackExactly) {
  // E8M0 scales below 2^-125 would make BF16 subnormals (flushed by the tile unit): fp32_products
  // then runs the block kernel, and the result still meets the reference bound.
  std::vector<float> x = random_matrix(40, 256, 901), y = random_matrix(24, 256, 902);
  for (float& v : x) v *= std::ldexp(1.0f, -130);
  QuantOptions o;
  o.format = Format::mxfp4;
  expect_matches_reference(cpu::quantize(x, 40, 256, o), cpu::quantize(y, 24, 256, o));
}

TEST(Gemm, Mxfp8AndFp8MatchReference) {
  uint64_t seed = 200;
  for (Shape s : {Shape{1, 1, 32}, Shape{9, 33, 544}, Shape{97, 257, 128}, Shape{40, 70, 4096}, Shape{300, 300, 64}}) {
    SCOPED_TRACE("M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K));
    expect_matches_reference(make_operand(Format::mxfp8, s.M, s.K, seed), make_operand(Format::mxfp8, s.N, s.K, seed + 1));
    expect_matches_reference(make_operand(Format::fp8_e4m3, s.M, s.K, seed + 2),
                             make_operand(Format::fp8_e4m3, s.N, s.K, seed + 3));
    expect_matches_reference(make_operand(Format::fp8_e4m3, s.M, s.K, seed + 4),
                             make_operand(Format::fp8_e5m2, s.N, s.K, seed + 5));
    seed += 6;
  }
}

TEST(Gemm, AlphaScalesAndAccumulateAdds) {
  QuantizedTensor a = make_operand(Format::nvfp4, 37, 256, 300), b = make_operand(Format::nvfp4, 45, 256, 301);
  expect_matches_reference(a, b, -0.375f);
  std::vector<double> ref(37 * 45);
  ref::gemm(a, b, ref.data(), 45);
  const std::vector<double> bound = error_bounds(a, b, 2.0f);
  IsaGuard guard;
  for (Isa isa : runnable_isas()) {
    cpu::set_isa_limit(isa);
    std::vector<float> c(37 * 45);
    for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<float>(i % 7) - 3.0f;
    cpu::gemm(a, b, c.data(), 45, 2.0f, Output::accumulate);
    for (size_t i = 0; i < c.size(); ++i) {
      double want = 2.0 * ref[i] + (static_cast<double>(i % 7) - 3.0);
      ASSERT_LE(std::fabs(c[i] - want), bound[i] + std::ldexp(std::fabs(want), -23)) << cpu::to_string(isa) << " at " << i;
    }
  }
}

TEST(Gemm, BitwiseIdenticalForAnyThreadCount) {
  const int saved = omp_get_max_threads();
  IsaGuard guard;
  // 803 rows are 9 macro-tile rows: on 1 and 2 threads each thread packs the A panels of the tile
  // rows it takes (run_plan's local A), on 3 threads A is packed up front; both sum alike.
  constexpr int64_t M = 803;
  for (Format f : {Format::nvfp4, Format::mxfp4, Format::fp8_e4m3}) {
    QuantizedTensor a = make_operand(f, M, 1024, 400), b = make_operand(f, 517, 1024, 401);
    for (Isa isa : runnable_isas()) {
      cpu::set_isa_limit(isa);
      std::vector<std::vector<float>> results;
      for (int threads : {1, 2, 3}) {
        omp_set_num_threads(threads);
        results.emplace_back(M * 517, std::numeric_limits<float>::quiet_NaN());
        cpu::gemm(a, b, results.back().data(), 517);
      }
      omp_set_num_threads(saved);
      for (size_t i = 1; i < results.size(); ++i)
        EXPECT_EQ(0, std::memcmp(results[0].data(), results[i].data(), results[0].size() * sizeof(float)))
            << to_string(f) << " " << cpu::to_string(isa) << " differs between 1 and " << i + 1 << " threads";
    }
  }
}

TEST(Gemm, Fp32ProductsBitwiseIdenticalForAnyThreadCount) {
  if (!cpu::fp32_products_available(Format::fp8_e4m3))
    GTEST_SKIP() << "neither AMX-BF16 nor AVX512-BF16 on this CPU: fp32_products runs block_exact here";
  const int saved = omp_get_max_threads();
  IsaGuard guard;
  // K = 1296: 40.5 units of 32 (a zero-padded half unit) over six K chunks; 1x16 x 16x16 as in fprop.
  // K = 1297 for FP8: an odd K leaves a half-filled BF16 pair.
  for (Format f : {Format::nvfp4, Format::fp8_e4m3}) {
    const int64_t K = f == Format::nvfp4 ? 1296 : 1297;
    QuantizedTensor a = make_operand(f, 203, K, 410), b = make_operand(f, 528, K, 411, f == Format::nvfp4);
    for (Isa isa : runnable_isas()) {
      cpu::set_isa_limit(isa);
      if (!cpu::fp32_products_available(f)) continue;
      std::vector<std::vector<float>> results;
      for (int threads : {1, 2, 3}) {
        omp_set_num_threads(threads);
        results.emplace_back(203 * 528, std::numeric_limits<float>::quiet_NaN());
        cpu::gemm(a, b, results.back().data(), 528, 1.0f, Output::overwrite, cpu::Summation::fp32_products);
      }
      omp_set_num_threads(saved);
      for (size_t i = 1; i < results.size(); ++i)
        EXPECT_EQ(0, std::memcmp(results[0].data(), results[i].data(), results[0].size() * sizeof(float)))
            << to_string(f) << " " << cpu::to_string(isa) << ": fp32_products differs between 1 and " << i + 1
            << " threads";
    }
  }
}

// Per-tensor FP8 with fp32_products on AVX512-BF16 (no AMX-BF16) sums in pair order by vdpbf16ps or
// by two FMAs on widened pairs: the same bits, an odd K included.
TEST(Gemm, Fp8PairProductsAreTheSameBitsByEitherKernel) {
  IsaGuard guard;
  Bf16PairKernelGuard kernel_guard;
  if (cpu::detected_isa() < Isa::avx512bf16) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  cpu::set_isa_limit(Isa::avx512bf16);  // below AMX: the pairs, not the tiles
  const QuantizedTensor a = make_operand(Format::fp8_e4m3, 77, 1297, 430), b = make_operand(Format::fp8_e4m3, 45, 1297, 431);
  std::vector<float> c[2];
  int run = 0;
  for (cpu::Bf16PairKernel kernel : {cpu::Bf16PairKernel::fma, cpu::Bf16PairKernel::dpbf16}) {
    cpu::set_bf16_pair_kernel(kernel);
    c[run].assign(77 * 45, std::numeric_limits<float>::quiet_NaN());
    cpu::gemm(a, b, c[run].data(), 45, 1.0f, Output::overwrite, cpu::Summation::fp32_products);
    ++run;
  }
  EXPECT_EQ(0, std::memcmp(c[0].data(), c[1].data(), c[0].size() * sizeof(float)));
  std::vector<float> blocks(77 * 45);  // not vacuous: block_exact (k order) differs somewhere
  cpu::gemm(a, b, blocks.data(), 45, 1.0f, Output::overwrite, cpu::Summation::block_exact);
  EXPECT_NE(0, std::memcmp(c[0].data(), blocks.data(), blocks.size() * sizeof(float)));
}

TEST(Gemm, Fp32ProductsIsNotBlockExact) {
  // Guards against the fp32_products request silently running the block kernel (the reference tests
  // above would pass either way): on a long K the two summation orders must differ somewhere.
  // (Not MXFP4: its power-of-two scales keep the sums of these operands exact in FP32 on both paths,
  // so the two agree bit for bit -- measured on 4M outputs of a 2048^3 product.)
  // Only on the AMX-BF16 tiles, whose order was seen to differ from the k order: vdpbf16ps's
  // documented order (k + 1, then k, per pair) could coincide with it on some CPU.
  if (!cpu::amx_bf16_active()) GTEST_SKIP() << "no AMX-BF16 on this CPU";
  for (Format f : {Format::nvfp4, Format::fp8_e4m3}) {
    QuantizedTensor a = make_operand(f, 64, 2048, 420), b = make_operand(f, 64, 2048, 421);
    std::vector<float> exact(64 * 64), fast(64 * 64);
    cpu::gemm(a, b, exact.data(), 64, 1.0f, Output::overwrite, cpu::Summation::block_exact);
    cpu::gemm(a, b, fast.data(), 64, 1.0f, Output::overwrite, cpu::Summation::fp32_products);
    EXPECT_NE(0, std::memcmp(exact.data(), fast.data(), exact.size() * sizeof(float))) << to_string(f);
  }
}

TEST(Gemm, VariantsAgreeBitwise) {
  // Every product the kernels form is exact and each sums in K order, so the variants agree bit for
  // bit. The cases cover each AMX epilogue (scales uniform over A's rows, over B's columns, or
  // neither), MX blocks of 32, an odd number of blocks (the tile pipeline's tail) and edge tiles.
  struct Case {
    Format format;
    int64_t M, N, K;
    bool a_tile, b_tile;
  };
  const Case cases[] = {{Format::nvfp4, 70, 90, 768, false, false}, {Format::nvfp4, 80, 96, 784, false, true},
                        {Format::nvfp4, 96, 45, 784, true, false},  {Format::nvfp4, 48, 32, 16, true, true},
                        {Format::mxfp4, 37, 53, 480, false, false}, {Format::nvfp4, 1, 1, 48, false, false},
                        {Format::nvfp4, 64, 48, 272, false, true}};
  IsaGuard guard;
  uint64_t seed = 500;
  for (const Case& t : cases) {
    SCOPED_TRACE(std::string(to_string(t.format)) + " M=" + std::to_string(t.M) + " N=" + std::to_string(t.N) +
                 " K=" + std::to_string(t.K) + " tiles " + std::to_string(t.a_tile) + std::to_string(t.b_tile));
    QuantizedTensor a = make_operand(t.format, t.M, t.K, seed++, t.a_tile);
    QuantizedTensor b = make_operand(t.format, t.N, t.K, seed++, t.b_tile);
    std::vector<std::vector<float>> results;
    for (Isa isa : runnable_isas()) {
      cpu::set_isa_limit(isa);
      results.emplace_back(t.M * t.N, std::numeric_limits<float>::quiet_NaN());
      cpu::gemm(a, b, results.back().data(), t.N);
    }
    for (size_t i = 1; i < results.size(); ++i)
      EXPECT_EQ(0, std::memcmp(results[0].data(), results[i].data(), results[0].size() * sizeof(float)))
          << cpu::to_string(runnable_isas()[i]) << " differs from " << cpu::to_string(runnable_isas()[0]);
  }
}

TEST(Gemm, SimdInt8PackingWritesTheTablePackersBytes) {
  // Every code byte and scale byte (random, not only what a quantizer produces: -0, NaN scales),
  // panels with padding rows, NVFP4 16-blocks and MXFP4 32-blocks, both sides of both layouts.
  if (cpu::detected_isa() < Isa::avx2) GTEST_SKIP() << "the SIMD packer needs AVX2";
  std::mt19937 rng(77);
  for (Format f : {Format::nvfp4, Format::mxfp4})
    for (int64_t rows : {1, 7, 8, 9, 31, 32, 45})
      for (int64_t blocks : {1, 3, 4, 6, 9}) {
        QuantizedTensor q = make_operand(f, rows, blocks * (f == Format::nvfp4 ? 16 : 32), 900 + rows);
        for (auto& c : q.codes) c = static_cast<uint8_t>(rng());
        for (auto& s : q.scales) s = static_cast<uint8_t>(rng());
        const int64_t block_len = q.block_len();
        // The scalar/AVX-512 layout (A signed, B biased) and the AVX2 one (A biased, B signed).
        namespace gd = cpu::gemm_detail;
        struct Packers {
          const char* name;
          int64_t panel_rows, block_bytes;
          void (*table)(const QuantizedTensor&, int64_t, uint8_t*);
          void (*simd)(const QuantizedTensor&, int64_t, uint8_t*);
        };
        const Packers packers[] = {
            {"A signed", gd::kMr, gd::int8_signed_block_bytes(block_len, gd::kMr), &gd::pack_int8_a_panel,
             &gd::pack_int8_a_panel_simd},
            {"B biased", gd::kNr, gd::int8_biased_block_bytes(block_len, gd::kNr), &gd::pack_int8_b_panel,
             &gd::pack_int8_b_panel_simd},
            {"A biased", gd::kMr, gd::int8_biased_block_bytes(block_len, gd::kMr), &gd::pack_int8_biased_a_panel,
             &gd::pack_int8_biased_a_panel_simd},
            {"B signed", gd::kNr, gd::int8_signed_block_bytes(block_len, gd::kNr), &gd::pack_int8_signed_b_panel,
             &gd::pack_int8_signed_b_panel_simd},
            {"A signed, AVX-512", gd::kMr, gd::int8_signed_block_bytes(block_len, gd::kMr), &gd::pack_int8_a_panel,
             static_cast<void (*)(const QuantizedTensor&, int64_t, uint8_t*)>(&gd::pack_int8_a_panel_avx512)},
            {"B biased, AVX-512", gd::kNr, gd::int8_biased_block_bytes(block_len, gd::kNr), &gd::pack_int8_b_panel,
             static_cast<void (*)(const QuantizedTensor&, int64_t, uint8_t*)>(&gd::pack_int8_b_panel_avx512)},
        };
        for (const Packers& p : packers) {
          if ((p.simd == packers[4].simd || p.simd == packers[5].simd) &&
              (f != Format::nvfp4 || cpu::detected_isa() < Isa::avx512))
            continue;  // NVFP4's 16-blocks, where the CPU has AVX-512 (the emulated test runs it anywhere)
          const int64_t bytes = blocks * p.block_bytes;
          for (int64_t row0 = 0; row0 < rows; row0 += p.panel_rows) {
            std::vector<uint8_t> table(bytes, 0xAA), simd(bytes, 0x55);  // every byte must be written
            p.table(q, row0, table.data());
            p.simd(q, row0, simd.data());
            ASSERT_EQ(table, simd) << to_string(f) << " rows=" << rows << " blocks=" << blocks << " row0=" << row0
                                   << " " << p.name;
          }
        }
      }
}

TEST(Gemm, SimdF32PackingWritesTheScalarPackersBytes) {
  // FP32 operands of gemm_f32 as they are, and gemm_bf16's BF16 pairs (the AVX512-BF16 kernel's
  // panels) and the same pairs widened for the FMA kernels (subnormals flushed): values that round up, ties, subnormals, infinities and NaNs (quiet
  // and signalling, both signs); panels with padding rows, K with and without a tail of 8 or 16, odd
  // K (an empty last high half), a leading dimension past K, both storage orders.
  if (cpu::detected_isa() < Isa::avx2) GTEST_SKIP() << "the SIMD packer needs AVX2";
  namespace gd = cpu::gemm_detail;
  std::mt19937 rng(78);
  const uint32_t specials[] = {0x7F800000u, 0xFF800000u, 0x7FC00001u, 0xFF800001u, 0x7F80FFFFu, 0x00000001u,
                               0x80008000u, 0x3F808000u, 0x3F818000u, 0x3F807FFFu, 0x7F7FFFFFu, 0x00000000u};
  struct Packers {
    const char* name;
    int64_t width;
    void (*scalar)(const gd::F32Operand&, int64_t, uint8_t*);
    void (*simd)(const gd::F32Operand&, int64_t, uint8_t*);
    int pair_steps = 0;  // 0: a step per k; else steps per pair of k (1: a 32-bit lane per pair; 2: widened)
  };
  const Packers packers[] = {
      {"A f32", gd::kMr, &gd::pack_f32_a_panel, &gd::pack_f32_a_panel_avx2},
      {"B f32", gd::kNr, &gd::pack_f32_b_panel, &gd::pack_f32_b_panel_avx2},
      {"A bf16 pairs", gd::kMr, &gd::pack_bf16_pair_a_panel, &gd::pack_bf16_pair_a_panel_avx2, 1},
      {"B bf16 pairs", gd::kNr, &gd::pack_bf16_pair_b_panel, &gd::pack_bf16_pair_b_panel_avx2, 1},
      {"A bf16 pairs widened", gd::kMr, &gd::pack_bf16_pair_widened_a_panel, &gd::pack_bf16_pair_widened_a_panel_avx2, 2},
      {"B bf16 pairs widened", gd::kNr, &gd::pack_bf16_pair_widened_b_panel, &gd::pack_bf16_pair_widened_b_panel_avx2, 2},
  };
  for (int64_t rows : {1, 7, 8, 9, 31, 32, 45})
    for (int64_t k : {1, 2, 7, 8, 13, 16, 37, 64})
      for (bool k_contiguous : {true, false}) {
        const int64_t ld = (k_contiguous ? k : rows) + 3;
        std::vector<float> x((k_contiguous ? rows : k) * ld);
        for (float& v : x) {
          const uint32_t bits = rng() % 4 == 0 ? specials[rng() % std::size(specials)] : static_cast<uint32_t>(rng());
          std::memcpy(&v, &bits, 4);
        }
        const gd::F32Operand op{x.data(), ld, rows, k, k_contiguous};
        for (const Packers& p : packers)
          for (int64_t row0 = 0; row0 < rows; row0 += p.width) {
            const size_t bytes = static_cast<size_t>((p.pair_steps > 0 ? p.pair_steps * ((k + 1) / 2) : k) * p.width) * 4;
            std::vector<uint8_t> scalar(bytes, 0xAA), simd(bytes, 0x55);  // every byte must be written
            p.scalar(op, row0, scalar.data());
            p.simd(op, row0, simd.data());
            ASSERT_EQ(scalar, simd) << p.name << " rows=" << rows << " k=" << k << " row0=" << row0
                                    << (k_contiguous ? " k-contiguous" : " row-contiguous");
          }
      }
}

TEST(Gemm, Nvfp4BlockScalesAcrossTheWholeE4M3RangeAgreeBitwise) {
  // Rows spanning 2^-24 .. 2^4 under one tensor scale: block scales from E4M3's subnormals (and 0) to
  // 448. The AVX2 kernel multiplies the two block scales first for NVFP4 (exact for E4M3 values),
  // the scalar kernel the block product by each in turn: the same bits only if every product is exact.
  std::vector<float> x = random_matrix(48, 512, 911), y = random_matrix(40, 512, 912);
  for (int64_t r = 0; r < 48; ++r)
    for (int64_t k = 0; k < 512; ++k) x[r * 512 + k] *= std::ldexp(1.0f, static_cast<int>((r * 7 + k / 16) % 29) - 24);
  for (int64_t r = 0; r < 40; ++r)
    for (int64_t k = 0; k < 512; ++k) y[r * 512 + k] *= std::ldexp(1.0f, static_cast<int>((r * 5 + k / 16) % 23) - 18);
  QuantOptions o;
  o.format = Format::nvfp4;
  const QuantizedTensor a = cpu::quantize(x, 48, 512, o), b = cpu::quantize(y, 40, 512, o);
  const auto subnormal = [](uint8_t s) { return (s & 0x7F) != 0 && (s & 0x78) == 0; };
  const auto largest = [](uint8_t s) { return (s & 0x7F) == 0x7E; };  // 448
  ASSERT_GT(std::count_if(a.scales.begin(), a.scales.end(), subnormal), 0);
  ASSERT_GT(std::count_if(a.scales.begin(), a.scales.end(), largest), 0);
  expect_matches_reference(a, b);
  IsaGuard guard;
  std::vector<std::vector<float>> results;
  for (Isa isa : runnable_isas()) {
    cpu::set_isa_limit(isa);
    results.emplace_back(48 * 40, std::numeric_limits<float>::quiet_NaN());
    cpu::gemm(a, b, results.back().data(), 40);
  }
  for (size_t i = 1; i < results.size(); ++i)
    EXPECT_EQ(0, std::memcmp(results[0].data(), results[i].data(), results[0].size() * sizeof(float)))
        << cpu::to_string(runnable_isas()[i]) << " differs from " << cpu::to_string(runnable_isas()[0]);
}

// A row-scaled NVFP4 operand (TE's row_scaled_nvfp4): rows whose magnitudes differ by up to 2^±40,
// every fifth row all zero.
QuantizedTensor make_row_scaled(int64_t rows, int64_t cols, uint64_t seed) {
  std::vector<float> x = random_matrix(rows, cols, seed);
  std::mt19937_64 rng(seed + 99);
  std::uniform_real_distribution<float> octave(-40.0f, 40.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float row_scale = r % 5 == 4 ? 0.0f : std::exp2(octave(rng));
    for (int64_t k = 0; k < cols; ++k) x[r * cols + k] *= row_scale;
  }
  return cpu::quantize(x, rows, cols, QuantOptions{.format = Format::nvfp4, .row_scaled = true});
}

TEST(Gemm, RowScaledOperandsMatchReference) {
  // A row-scaled (fprop's X), B row-scaled (wgrad's X^T), both, against a per-tensor or 16x16 other
  // side: every ISA and both summations within the bound, whose global factor is per output.
  uint64_t seed = 700;
  for (const Shape& s : shapes(16)) {
    const int64_t M = s.M, N = s.N, K = s.K;
    QuantizedTensor a_rows = make_row_scaled(M, K, seed++), b_rows = make_row_scaled(N, K, seed++);
    QuantizedTensor a = make_operand(Format::nvfp4, M, K, seed++);
    QuantizedTensor b = make_operand(Format::nvfp4, N, K, seed++, /*tile_16x16=*/N % 16 == 0);
    expect_matches_reference(a_rows, b);
    expect_matches_reference(a, b_rows, 0.5f);
    expect_matches_reference(a_rows, b_rows);
  }
}

TEST(Gemm, RowScaledWithEqualRowAmaxIsThePerTensorProductBitwise) {
  // Rows that all share the tensor's amax get the per-tensor S_dec each, the per-tensor codes and
  // scales: the epilogue's per-row factor must then give the per-tensor GEMM's bits exactly.
  IsaGuard guard;
  std::vector<float> x = random_matrix(40, 256, 900), y = random_matrix(72, 256, 901);
  for (auto* m : {&x, &y}) {
    float amax = 0.0f;
    for (float v : *m) amax = std::max(amax, std::fabs(v));
    for (size_t r = 0; r < m->size() / 256; ++r) (*m)[r * 256 + 3] = r % 2 ? amax : -amax;
  }
  const QuantOptions plain{.format = Format::nvfp4}, rows{.format = Format::nvfp4, .row_scaled = true};
  const QuantizedTensor a = cpu::quantize(x, 40, 256, plain), a_rows = cpu::quantize(x, 40, 256, rows);
  const QuantizedTensor b = cpu::quantize(y, 72, 256, plain), b_rows = cpu::quantize(y, 72, 256, rows);
  ASSERT_EQ(a.codes, a_rows.codes);
  ASSERT_EQ(a.scales, a_rows.scales);
  for (Isa isa : runnable_isas())
    for (cpu::Summation summation : {cpu::Summation::block_exact, cpu::Summation::fp32_products})
      for (Output output : {Output::overwrite, Output::accumulate}) {
        cpu::set_isa_limit(isa);
        std::vector<float> want(40 * 72, 1.0f), got_a(40 * 72, 1.0f), got_b(40 * 72, 1.0f), got_ab(40 * 72, 1.0f);
        cpu::gemm(a, b, want.data(), 72, 3.0f, output, summation);
        cpu::gemm(a_rows, b, got_a.data(), 72, 3.0f, output, summation);
        cpu::gemm(a, b_rows, got_b.data(), 72, 3.0f, output, summation);
        cpu::gemm(a_rows, b_rows, got_ab.data(), 72, 3.0f, output, summation);
        for (auto* got : {&got_a, &got_b, &got_ab})
          EXPECT_EQ(0, std::memcmp(want.data(), got->data(), want.size() * sizeof(float))) << cpu::to_string(isa);
      }
}

TEST(Gemm, RowScaledBitwiseIdenticalForAnyThreadCount) {
  const int saved = omp_get_max_threads();
  IsaGuard guard;
  const QuantizedTensor a = make_row_scaled(203, 1024, 950), b = make_row_scaled(517, 1024, 951);
  for (Isa isa : runnable_isas()) {
    cpu::set_isa_limit(isa);
    std::vector<std::vector<float>> results;
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      results.emplace_back(203 * 517, std::numeric_limits<float>::quiet_NaN());
      cpu::gemm(a, b, results.back().data(), 517);
    }
    omp_set_num_threads(saved);
    for (size_t i = 1; i < results.size(); ++i)
      EXPECT_EQ(0, std::memcmp(results[0].data(), results[i].data(), results[0].size() * sizeof(float)))
          << cpu::to_string(isa) << " differs between 1 and " << i + 1 << " threads";
  }
}

TEST(Gemm, RowScaledReferenceAgreesWithDequantizedProduct) {
  // The law with per-row global scales, checked against the FP64 product of the dequantized
  // operands (each value e2m1 * (e4m3 * S_dec[row]), rounded to FP32 at most twice).
  const QuantizedTensor a = make_row_scaled(13, 320, 960), b = make_row_scaled(11, 320, 961);
  std::vector<float> da(13 * 320), db(11 * 320);
  ref::dequantize_codes(a, da);
  ref::dequantize_codes(b, db);
  std::vector<double> c(13 * 11);
  ref::gemm(a, b, c.data(), 11);
  for (int m = 0; m < 13; ++m)
    for (int n = 0; n < 11; ++n) {
      double want = 0.0, abs_sum = 0.0;
      for (int k = 0; k < 320; ++k) {
        want += static_cast<double>(da[m * 320 + k]) * db[n * 320 + k];
        abs_sum += std::fabs(static_cast<double>(da[m * 320 + k]) * db[n * 320 + k]);
      }
      EXPECT_LE(std::fabs(c[m * 11 + n] - want), 4 * std::ldexp(abs_sum, -24) + 1e-300) << m << "," << n;
    }
}

TEST(Gemm, RejectsRowScaledOperandWithoutItsRowScales) {
  QuantizedTensor a = make_row_scaled(8, 64, 970), b = make_operand(Format::nvfp4, 8, 64, 971);
  a.row_decode_scale.pop_back();
  std::vector<float> c(64);
  try {
    cpu::gemm(a, b, c.data(), 8);
    FAIL() << "accepted a row-scaled operand with 7 row scales for 8 rows";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("row-scaled"), std::string::npos) << e.what();
  }
}

TEST(Gemm, ReferenceAgreesWithDequantizedProduct) {
  // Independent check of the law itself: the FP64 product of the dequantized operands.
  for (Format f : {Format::nvfp4, Format::mxfp4, Format::mxfp8, Format::fp8_e4m3}) {
    QuantizedTensor a = make_operand(f, 13, 320, 600), b = make_operand(f, 11, 320, 601);
    std::vector<float> da(13 * 320), db(11 * 320);
    ref::dequantize_codes(a, da);
    ref::dequantize_codes(b, db);
    std::vector<double> c(13 * 11);
    ref::gemm(a, b, c.data(), 11);
    for (int m = 0; m < 13; ++m)
      for (int n = 0; n < 11; ++n) {
        double want = 0.0, abs_sum = 0.0;
        for (int k = 0; k < 320; ++k) {
          want += static_cast<double>(da[m * 320 + k]) * db[n * 320 + k];
          abs_sum += std::fabs(static_cast<double>(da[m * 320 + k]) * db[n * 320 + k]);
        }
        // Dequantized values are rounded to FP32 once or twice each.
        EXPECT_LE(std::fabs(c[m * 11 + n] - want), 4 * std::ldexp(abs_sum, -24) + 1e-30) << to_string(f);
      }
  }
}

TEST(Gemm, RejectsMismatchedOperands) {
  QuantizedTensor a = make_operand(Format::nvfp4, 8, 64, 1), b = make_operand(Format::nvfp4, 8, 32, 2);
  QuantizedTensor mx = make_operand(Format::mxfp4, 8, 64, 3);
  std::vector<float> c(64);
  EXPECT_THROW(cpu::gemm(a, b, c.data(), 8), UsageError);        // K differs
  EXPECT_THROW(cpu::gemm(a, mx, c.data(), 8), UsageError);       // format differs
  EXPECT_THROW(cpu::gemm(a, a, c.data(), 7), UsageError);        // ldc < N
  EXPECT_THROW(cpu::gemm(a, a, nullptr, 8), UsageError);         // no C
  QuantizedTensor rht = a;
  rht.rht = true;
  EXPECT_THROW(cpu::gemm(a, rht, c.data(), 8), UsageError);      // RHT on one side only
  QuantizedTensor odd = a;                                       // K not a multiple of the block
  odd.cols = 24;
  odd.codes.resize(8 * 12);
  odd.scales.resize(8);
  EXPECT_THROW(cpu::gemm(odd, odd, c.data(), 8), UsageError);
  std::vector<double> cd(64);
  EXPECT_THROW(ref::gemm(a, b, cd.data(), 8), UsageError);
}

// ------------------------------------------------------------------ FP32 / BF16 through oneDNN
// Reference in FP64; bound K * u * sum_k |a_ik b_kj| (with u = 2^-24, FP32 accumulation) and one
// more u for the alpha/beta epilogue.
enum class Dense { f32, bf16, bf16_onednn };

void check_dense_gemm(Dense kind, cpu::Trans ta, cpu::Trans tb, int64_t M, int64_t N, int64_t K, float alpha, float beta) {
  const bool bf16 = kind != Dense::f32;
  const int64_t lda = (ta == cpu::Trans::no ? K : M) + 5, ldb = (tb == cpu::Trans::no ? N : K) + 2, ldc = N + 7;
  std::vector<float> a = random_matrix(ta == cpu::Trans::no ? M : K, lda, 700);
  std::vector<float> b = random_matrix(tb == cpu::Trans::no ? K : N, ldb, 701);
  std::vector<float> c = random_matrix(M, ldc, 702), c0 = c;
  auto A = [&](int64_t m, int64_t k) {
    double v = ta == cpu::Trans::no ? a[m * lda + k] : a[k * lda + m];
    return bf16 ? static_cast<double>(round_to_bf16(static_cast<float>(v))) : v;
  };
  auto B = [&](int64_t k, int64_t n) {
    double v = tb == cpu::Trans::no ? b[k * ldb + n] : b[n * ldb + k];
    return bf16 ? static_cast<double>(round_to_bf16(static_cast<float>(v))) : v;
  };
  (kind == Dense::f32 ? cpu::gemm_f32 : kind == Dense::bf16 ? cpu::gemm_bf16 : cpu::gemm_bf16_onednn)(
      ta, tb, M, N, K, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
  const double u = std::ldexp(1.0, -24);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double dot = 0.0, abs_dot = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        dot += A(m, k) * B(k, n);
        abs_dot += std::fabs(A(m, k) * B(k, n));
      }
      double want = alpha * dot + beta * c0[m * ldc + n];
      double bound = (K + 2) * u * std::fabs(alpha) * abs_dot + 2 * u * std::fabs(beta * c0[m * ldc + n]) + 1e-30;
      ASSERT_LE(std::fabs(c[m * ldc + n] - want), bound) << (bf16 ? "bf16" : "f32") << " m=" << m << " n=" << n;
    }
    for (int64_t n = N; n < ldc; ++n) ASSERT_EQ(c[m * ldc + n], c0[m * ldc + n]) << "wrote past N";
  }
}

// gemm_bf16 is nibble's kernel of every ISA level (AMX-BF16 tiles, AVX512-BF16 pairs, FMA on
// AVX-512 / AVX2 / scalar); gemm_bf16_onednn is always oneDNN. The shapes cross the 8x32 and 32x32
// micro-tiles, the 96x256 macro tile and the 128/256/2048-k chunks, with K odd (a half-filled BF16
// pair) and beta 0, 1 and neither.
TEST(Gemm, OneDnnF32AndBf16WithTransposesAndStrides) {
  IsaGuard guard;
  for (Dense kind : {Dense::f32, Dense::bf16, Dense::bf16_onednn})
  for (Isa isa : kind == Dense::bf16 ? runnable_isas() : std::vector<Isa>{cpu::detected_isa()}) {
    SCOPED_TRACE(std::string(cpu::to_string(isa)));
    cpu::set_isa_limit(isa);
    for (cpu::Trans ta : {cpu::Trans::no, cpu::Trans::yes})
      for (cpu::Trans tb : {cpu::Trans::no, cpu::Trans::yes}) {
        check_dense_gemm(kind, ta, tb, 37, 53, 129, 1.0f, 0.0f);
        check_dense_gemm(kind, ta, tb, 64, 17, 300, -0.5f, 1.5f);
        if (kind == Dense::bf16) {
          check_dense_gemm(kind, ta, tb, 131, 290, 545, 2.0f, 1.0f);
          check_dense_gemm(kind, ta, tb, 33, 40, 2111, 1.0f, 1.0f);  // AMX-BF16: a second chunk reloads the sums
          check_dense_gemm(kind, ta, tb, 1, 1, 1, 1.0f, 0.0f);
        }
      }
  }
}

TEST(Gemm, Bf16BitwiseIdenticalForAnyThreadCount) {
  const int saved = omp_get_max_threads();
  IsaGuard guard;
  std::vector<float> a = random_matrix(300, 701, 710), b = random_matrix(701, 270, 711);
  for (Isa isa : runnable_isas()) {
    cpu::set_isa_limit(isa);
    std::vector<std::vector<float>> results;
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      results.emplace_back(300 * 270, 0.5f);
      // wgrad's form: A stored transposed (M-contiguous), B untransposed, accumulating; K odd. 300
      // rows are 4 macro-tile rows: on 1 thread it packs A a tile row at a time, on 2 and 3 up front.
      cpu::gemm_bf16(cpu::Trans::yes, cpu::Trans::no, 300, 270, 701, 1.0f, a.data(), 300, b.data(), 270, 1.0f,
                     results.back().data(), 270);
    }
    omp_set_num_threads(saved);
    for (size_t i = 1; i < results.size(); ++i)
      EXPECT_EQ(0, std::memcmp(results[0].data(), results[i].data(), results[0].size() * sizeof(float)))
          << cpu::to_string(isa) << ": gemm_bf16 differs between 1 and " << i + 1 << " threads";
  }
}

// Without AMX-BF16, gemm_bf16 sums the exact BF16 x BF16 products in vdpbf16ps's pair order (per
// pair of k: k + 1, then k), BF16 subnormals read as zero: vdpbf16ps itself, or the FMA kernel of
// the ISA on widened pairs (the faster, bf16_pair_kernel()). Every ISA and both kernels give the
// bits of that order written out; the k order (the FMA kernels' order before) differs.
float bf16_read_as_dpbf16_reads_it(float x) {
  const float r = round_to_bf16(x);
  return std::fpclassify(r) == FP_SUBNORMAL ? std::copysign(0.0f, r) : r;
}

TEST(Gemm, Bf16IsThePairOrderOnEveryIsaAndKernel) {
  IsaGuard guard;
  Bf16PairKernelGuard kernel_guard;
  const int64_t M = 77, N = 45, K = 515;  // K odd: a last pair with an empty high half
  std::vector<float> a = random_matrix(M, K, 720), b = random_matrix(K, N, 721), c0 = random_matrix(M, N, 722);
  // BF16 subnormals (and values that round to them), which vdpbf16ps reads as zeros of their sign.
  for (int64_t i = 0; i < M * K; i += 37) a[i] = (i % 2 ? -1.0f : 1.0f) * std::ldexp(1.0f + (i % 5) * 0.25f, -129 - i % 4);
  for (int64_t i = 0; i < K * N; i += 41) b[i] = std::ldexp(1.5f, -127 - i % 3);
  std::vector<float> pair_order(M * N), k_order(M * N);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const auto product = [&](int64_t k) {
        return bf16_read_as_dpbf16_reads_it(a[m * K + k]) * bf16_read_as_dpbf16_reads_it(b[k * N + n]);  // exact
      };
      float s = 0.0f, t = 0.0f;
      for (int64_t k = 0; k < K; k += 2) {
        if (k + 1 < K) s += product(k + 1);
        s += product(k);
      }
      for (int64_t k = 0; k < K; ++k) t += product(k);
      pair_order[m * N + n] = s + c0[m * N + n];  // beta = 1: the sum, then C added once
      k_order[m * N + n] = t + c0[m * N + n];
    }
  ASSERT_NE(0, std::memcmp(pair_order.data(), k_order.data(), pair_order.size() * sizeof(float)))
      << "the two orders agree on these inputs: the test would not see the order";
  int runs = 0;
  for (Isa isa : runnable_isas()) {
    if (isa > Isa::avx512bf16) continue;
    cpu::set_isa_limit(isa);
    for (cpu::Bf16PairKernel kernel : {cpu::Bf16PairKernel::fma, cpu::Bf16PairKernel::dpbf16}) {
      if (kernel == cpu::Bf16PairKernel::dpbf16 && isa < Isa::avx512bf16) continue;
      cpu::set_bf16_pair_kernel(kernel);
      ASSERT_EQ(cpu::bf16_pair_kernel(), kernel);
      for (bool transposed : {false, true}) {  // A stored as is, or transposed (wgrad's form)
        std::vector<float> at(static_cast<size_t>(K * M));
        for (int64_t m = 0; m < M; ++m)
          for (int64_t k = 0; k < K; ++k) at[k * M + m] = a[m * K + k];
        std::vector<float> c = c0;
        cpu::gemm_bf16(transposed ? cpu::Trans::yes : cpu::Trans::no, cpu::Trans::no, M, N, K, 1.0f,
                       transposed ? at.data() : a.data(), transposed ? M : K, b.data(), N, 1.0f, c.data(), N);
        ++runs;
        for (int64_t i = 0; i < M * N; ++i)
          ASSERT_EQ(std::bit_cast<uint32_t>(c[i]), std::bit_cast<uint32_t>(pair_order[i]))
              << cpu::to_string(isa) << " " << cpu::to_string(kernel) << (transposed ? " A^T" : "") << " C[" << i / N
              << "," << i % N << "] = " << c[i] << ", pair order " << pair_order[i];
      }
    }
  }
  EXPECT_GE(runs, 2);
}

// The choice is fma below AVX512-BF16 whatever is forced, and $NIBBLE_BF16_PAIRS's spellings parse.
TEST(Gemm, Bf16PairKernelChoice) {
  IsaGuard guard;
  Bf16PairKernelGuard kernel_guard;
  EXPECT_EQ(cpu::parse_bf16_pair_kernel("fma"), cpu::Bf16PairKernel::fma);
  EXPECT_EQ(cpu::parse_bf16_pair_kernel("dpbf16"), cpu::Bf16PairKernel::dpbf16);
  EXPECT_EQ(cpu::parse_bf16_pair_kernel("vdpbf16ps"), std::nullopt);
  cpu::set_bf16_pair_kernel(cpu::Bf16PairKernel::dpbf16);
  cpu::set_isa_limit(Isa::avx512);
  EXPECT_EQ(cpu::bf16_pair_kernel(), cpu::Bf16PairKernel::fma);
  if (cpu::detected_isa() >= Isa::avx512bf16) {
    cpu::set_isa_limit(Isa::avx512bf16);
    EXPECT_EQ(cpu::bf16_pair_kernel(), cpu::Bf16PairKernel::dpbf16);
    cpu::set_bf16_pair_kernel(std::nullopt);  // the CPU's choice: the FMAs on Intel, vdpbf16ps elsewhere
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    ASSERT_TRUE(__get_cpuid(0, &eax, &ebx, &ecx, &edx));
    const bool intel = ebx == 0x756E6547u && edx == 0x49656E69u && ecx == 0x6C65746Eu;  // "Genu" "ineI" "ntel"
    EXPECT_EQ(cpu::bf16_pair_kernel(), intel ? cpu::Bf16PairKernel::fma : cpu::Bf16PairKernel::dpbf16);
  }
}

// And C's stores back to the CPU's choice.
struct CStoresGuard {
  ~CStoresGuard() { cpu::set_c_stores(std::nullopt); }
};

// A large overwritten C written with non-temporal stores (c_stores) holds the cached stores' bits, on
// every ISA and kernel family (NVFP4 block-exact and fp32_products, FP8, gemm_bf16, gemm_f32), with
// rows that start off any vector boundary (ldc = N + 3) or on one (ldc = N, N a multiple of 16), and
// the padding past N untouched.
TEST(Gemm, StreamedOutputsAreTheCachedOutputsBits) {
  IsaGuard guard;
  CStoresGuard stores_guard;
  const int64_t M = 520, K = 64;
  for (const int64_t N : {int64_t{512}, int64_t{531}}) {
    ASSERT_GE(M * N * static_cast<int64_t>(sizeof(float)), cpu::kStreamedOutputBytes);  // it streams
    const QuantizedTensor a = make_operand(Format::nvfp4, M, K, 31), b = make_operand(Format::nvfp4, N, K, 32);
    const QuantizedTensor a8 = make_operand(Format::fp8_e4m3, M, K, 33), b8 = make_operand(Format::fp8_e4m3, N, K, 34);
    const std::vector<float> af = random_matrix(M, K, 35), bf = random_matrix(N, K, 36);
    for (const int64_t ldc : {N, N + 3})
      for (Isa isa : runnable_isas()) {
        cpu::set_isa_limit(isa);
        const auto run = [&](cpu::CStores stores) {
          cpu::set_c_stores(stores);
          std::vector<std::vector<float>> outs;
          const auto fresh = [&] { return outs.emplace_back(static_cast<size_t>(M * ldc), -7.0f).data(); };
          cpu::gemm(a, b, fresh(), ldc, 0.75f);
          if (cpu::fp32_products_available(Format::nvfp4))
            cpu::gemm(a, b, fresh(), ldc, 0.75f, cpu::Output::overwrite, cpu::Summation::fp32_products);
          cpu::gemm(a8, b8, fresh(), ldc, 1.25f);
          cpu::gemm_bf16(cpu::Trans::no, cpu::Trans::yes, M, N, K, 0.5f, af.data(), K, bf.data(), K, 0.0f, fresh(), ldc);
          cpu::gemm_f32(cpu::Trans::no, cpu::Trans::yes, M, N, K, 0.5f, af.data(), K, bf.data(), K, 0.0f, fresh(), ldc);
          return outs;
        };
        const auto cached = run(cpu::CStores::cached), streamed = run(cpu::CStores::streaming);
        ASSERT_EQ(cached.size(), streamed.size());
        for (size_t g = 0; g < cached.size(); ++g) {
          EXPECT_EQ(std::memcmp(cached[g].data(), streamed[g].data(), cached[g].size() * sizeof(float)), 0)
              << "GEMM " << g << ", ISA " << cpu::to_string(isa) << ", N " << N << ", ldc " << ldc;
          for (int64_t m = 0; m < M && ldc > N; ++m) ASSERT_EQ(streamed[g][m * ldc + N], -7.0f) << "padding of row " << m;
        }
      }
  }
}

TEST(Gemm, CStoresChoice) {
  IsaGuard isa_guard;
  CStoresGuard guard;
  EXPECT_EQ(cpu::parse_c_stores("cached"), cpu::CStores::cached);
  EXPECT_EQ(cpu::parse_c_stores("streaming"), cpu::CStores::streaming);
  EXPECT_EQ(cpu::parse_c_stores("nt"), std::nullopt);
  cpu::set_c_stores(cpu::CStores::cached);
  EXPECT_EQ(cpu::c_stores(), cpu::CStores::cached);
  cpu::set_c_stores(cpu::CStores::streaming);
  cpu::set_isa_limit(Isa::scalar);
  EXPECT_EQ(cpu::c_stores(), cpu::CStores::cached);  // streaming stores are whole AVX2/AVX-512 vectors
  cpu::set_isa_limit(cpu::detected_isa());
  if (cpu::detected_isa() >= Isa::avx2) {
    EXPECT_EQ(cpu::c_stores(), cpu::CStores::streaming);
  }
  cpu::set_c_stores(std::nullopt);  // the CPU's choice: streaming from AVX2 up, on every vendor
  if (std::getenv("NIBBLE_C_STORES") == nullptr) {
    EXPECT_EQ(cpu::c_stores(), cpu::detected_isa() >= Isa::avx2 ? cpu::CStores::streaming : cpu::CStores::cached);
  }
}

TEST(Gemm, OneDnnRejectsBadLeadingDimensions) {
  std::vector<float> a(64), b(64), c(64);
  EXPECT_THROW(cpu::gemm_f32(cpu::Trans::no, cpu::Trans::no, 4, 4, 8, 1, a.data(), 7, b.data(), 4, 0, c.data(), 4),
               UsageError);
  EXPECT_THROW(cpu::gemm_f32(cpu::Trans::no, cpu::Trans::no, 4, 4, 4, 1, a.data(), 4, b.data(), 4, 0, c.data(), 3),
               UsageError);
}

}  // namespace
}  // namespace nibble
