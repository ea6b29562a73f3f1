// The AVX-512 VNNI GEMM micro-kernels (src/kernels/cpu/gemm/gemm_avx512.cpp: the int8 kernel of NVFP4 and
// MXFP4, the FP32 kernel of FP8, MXFP8 and gemm_bf16) compiled against a software model of their
// intrinsics (avx512_vnni_intrinsics.h), run on any CPU against the scalar micro-kernels bit for bit, over the
// real packers' panels and several K chunks: the row groups, the two 16-column halves, the three
// scale epilogues (16-blocks with per-column or 16x16-uniform B scales, 32-blocks) and edge panels.
// On CPUs with AVX-512 VNNI, test_gemm runs the real instructions through cpu::gemm.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/gemm/gemm_kernels.h"
#include "spread_inputs.h"

namespace nibble::cpu::gemm_detail {
namespace {

using emulated_tests::quantized;
using emulated_tests::spread_values;

// Runs `want` and `got` over the packed panels in chunks of `chunk` units (the driver's walk: the first
// call overwrites, the later ones accumulate) and compares the 8 x 32 results bit for bit.
void expect_same_bits(MicroKernel want, MicroKernel got, const std::vector<uint8_t>& pa, int64_t a_unit_bytes,
                      const std::vector<uint8_t>& pb, int64_t b_unit_bytes, int64_t units, int64_t chunk,
                      const std::string& what) {
  std::vector<float> w(kMr * kNr, std::nanf("")), g(kMr * kNr, std::nanf(""));
  for (int64_t u0 = 0; u0 < units; u0 += chunk) {
    const int64_t n = std::min(chunk, units - u0);
    want(pa.data() + u0 * a_unit_bytes, pb.data() + u0 * b_unit_bytes, n, w.data(), u0 == 0);
    got(pa.data() + u0 * a_unit_bytes, pb.data() + u0 * b_unit_bytes, n, g.data(), u0 == 0);
  }
  for (int64_t i = 0; i < kMr * kNr; ++i)
    ASSERT_EQ(std::memcmp(&w[i], &g[i], 4), 0)
        << what << ": C[" << i / kNr << "," << i % kNr << "] = " << g[i] << ", scalar kernel " << w[i];
}

TEST(Avx512VnniEmulated, Int8KernelMatchesTheScalarKernelBitForBit) {
  struct Case {
    Format format;
    int64_t a_rows, b_rows, K;
    bool b_tiles;  // B 16x16-tiled NVFP4: the kernel's uniform-scale epilogue
  };
  // Full panels and edge panels (fewer than 8 rows of A, 32 columns of B), one block and many.
  const Case cases[] = {{Format::nvfp4, 8, 32, 16, false},  {Format::nvfp4, 5, 27, 400, false},
                        {Format::nvfp4, 8, 32, 1024, true}, {Format::nvfp4, 3, 16, 208, true},
                        {Format::mxfp4, 8, 32, 32, false},  {Format::mxfp4, 7, 20, 640, false}};
  uint64_t seed = 900;
  for (const Case& c : cases) {
    const std::string what = std::string(to_string(c.format)) + " " + std::to_string(c.a_rows) + "x" +
                             std::to_string(c.b_rows) + " K=" + std::to_string(c.K) + (c.b_tiles ? " B tiles" : "");
    const QuantizedTensor a = quantized(c.format, c.a_rows, c.K, seed++);
    const QuantizedTensor b = quantized(c.format, c.b_rows, c.K, seed++, c.b_tiles);
    const int64_t block_len = a.block_len(), blocks = c.K / block_len;
    std::vector<uint8_t> pa(static_cast<size_t>(blocks * int8_a_block_bytes(block_len)), 0xAB);
    std::vector<uint8_t> pb(static_cast<size_t>(blocks * int8_b_block_bytes(block_len)), 0xCD);
    pack_int8_a_panel(a, 0, pa.data());
    pack_int8_b_panel(b, 0, pb.data());
    for (const int64_t chunk : {int64_t{1}, int64_t{7}, blocks})
      expect_same_bits(int8_micro_kernel_scalar(block_len), int8_micro_kernel_avx512(block_len, c.b_tiles), pa,
                       int8_a_block_bytes(block_len), pb, int8_b_block_bytes(block_len), blocks, chunk,
                       what + " chunk " + std::to_string(chunk));
  }
}

TEST(Avx512VnniEmulated, F32KernelMatchesTheScalarKernelBitForBit) {
  uint64_t seed = 950;
  // FP8 and MXFP8 decoded exactly into the panels, and gemm_bf16's BF16-rounded panels: every product
  // is exact, so the scalar kernel's multiply-then-add is the vector kernels' FMA. (Unrounded FP32
  // products are not: there the scalar kernel rounds twice.)
  for (const Format format : {Format::fp8_e4m3, Format::mxfp8}) {
    const int64_t K = 96;
    const QuantizedTensor a = quantized(format, 6, K, seed++), b = quantized(format, 29, K, seed++);
    std::vector<uint8_t> pa(static_cast<size_t>(K * f32_a_k_bytes())), pb(static_cast<size_t>(K * f32_b_k_bytes()));
    pack_f32_a_panel(a, 0, pa.data());
    pack_f32_b_panel(b, 0, pb.data());
    for (const int64_t chunk : {int64_t{1}, int64_t{40}, K})
      expect_same_bits(f32_micro_kernel_scalar(), f32_micro_kernel_avx512(), pa, f32_a_k_bytes(), pb, f32_b_k_bytes(), K,
                       chunk, std::string(to_string(format)) + " chunk " + std::to_string(chunk));
  }
  // gemm_bf16's widened BF16 pairs (odd K: an empty last high half), walked in units of a pair.
  const int64_t K = 77, pairs = (K + 1) / 2;
  const std::vector<float> x = spread_values(8, K, seed++), y = spread_values(32, K, seed++);
  std::vector<uint8_t> pa(static_cast<size_t>(2 * pairs * f32_a_k_bytes())), pb(static_cast<size_t>(2 * pairs * f32_b_k_bytes()));
  pack_bf16_pair_widened_a_panel(F32Operand{x.data(), K, 8, K, true}, 0, pa.data());
  pack_bf16_pair_widened_b_panel(F32Operand{y.data(), K, 32, K, true}, 0, pb.data());
  expect_same_bits(&widened_pairs<&f32_micro_kernel_scalar>, &widened_pairs<&f32_micro_kernel_avx512>, pa, 2 * f32_a_k_bytes(), pb,
                   2 * f32_b_k_bytes(), pairs, 15, "widened BF16 pairs");
}

// The streamed write-back (c_stores): scale * in for every length and every start within a line
// (the model traps a store off a 64-byte boundary, as VMOVNTPS faults), nothing past n written.
TEST(EmulatedAvx512Gemm, StreamedWriteBackIsTheScaledInput) {
  const std::vector<float> in = spread_values(1, 96, 7);
  alignas(64) float out[128];
  for (int64_t offset = 0; offset < 16; ++offset)
    for (int64_t n = 0; n <= 70; ++n) {
      std::fill(std::begin(out), std::end(out), -7.0f);
      stream_scaled_avx512(in.data(), n, 0.375f, out + offset);
      for (int64_t j = 0; j < 128; ++j) {
        const bool inside = j >= offset && j < offset + n;
        const float want = inside ? 0.375f * in[j - offset] : -7.0f;
        ASSERT_EQ(std::memcmp(&out[j], &want, sizeof want), 0) << "offset " << offset << ", n " << n << ", element " << j;
      }
    }
}

}  // namespace
}  // namespace nibble::cpu::gemm_detail
