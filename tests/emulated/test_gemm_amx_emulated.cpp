// The AMX-INT8 GEMM path (src/kernels/cpu/gemm/gemm_amx.cpp: its panel packers, tile configuration, the
// software-pipelined tile products and the three scale epilogues) compiled against a software model
// of the AMX, AVX-512 and SSE intrinsics it uses (amx_int8_intrinsics.h), run on any CPU against a
// plain statement of what the micro-kernel computes: per 16-column block of K in order, the exact
// integer dot product of the doubled E2M1 codes, times sB, times sA, added to the FP32 accumulator
// (each product exact, so one rounding per block, as every int8 kernel). On CPUs with AMX, test_gemm
// runs the real instructions through cpu::gemm.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "format/codecs.h"
#include "kernels/cpu/gemm/gemm_kernels.h"
#include "spread_inputs.h"

namespace nibble::cpu::gemm_detail {
namespace {

using emulated_tests::quantized;

int doubled_code(const QuantizedTensor& q, int64_t r, int64_t k) {
  const uint8_t byte = q.codes[r * (q.cols / 2) + k / 2];
  return kE2M1TimesTwo[k % 2 ? byte >> 4 : byte & 15];
}
float block_scale(const QuantizedTensor& q, int64_t r, int64_t blk) {
  const uint8_t s = q.scales[r * (q.cols / q.block_len()) + blk];
  return q.format == Format::nvfp4 ? e4m3_decode(s) : e8m0_decode(s);
}

// The 16 x 16 accumulator the micro-kernel leaves for A rows [0, 16) and B rows [0, 16): rows past
// an operand's edge are zero.
std::vector<float> model(const QuantizedTensor& a, const QuantizedTensor& b) {
  const int64_t block_len = a.block_len(), blocks = a.cols / block_len;
  std::vector<float> c(16 * 16, 0.0f);
  for (int64_t m = 0; m < std::min<int64_t>(16, a.rows); ++m)
    for (int64_t n = 0; n < std::min<int64_t>(16, b.rows); ++n) {
      float acc = 0.0f;
      for (int64_t blk = 0; blk < blocks; ++blk) {
        int32_t dot = 0;
        for (int64_t k = blk * block_len; k < (blk + 1) * block_len; ++k) dot += doubled_code(a, m, k) * doubled_code(b, n, k);
        acc = acc + (static_cast<float>(dot) * block_scale(b, n, blk)) * block_scale(a, m, blk);
      }
      c[m * 16 + n] = acc;
    }
  return c;
}

TEST(AmxInt8Emulated, PackersAndKernelMatchTheBlockModel) {
  struct Case {
    Format format;
    int64_t a_rows, b_rows, blocks;
    bool a_tiles, b_tiles;  // 16x16-tiled NVFP4: the uniform-scale epilogues
  };
  // One block, odd block counts (the pipeline's tail), edge panels, each epilogue, 32-element blocks.
  const Case cases[] = {{Format::nvfp4, 16, 16, 1, false, false}, {Format::nvfp4, 11, 9, 5, false, false},
                        {Format::nvfp4, 16, 14, 8, true, false},  {Format::nvfp4, 13, 16, 7, false, true},
                        {Format::nvfp4, 16, 16, 4, true, true},   {Format::mxfp4, 16, 12, 3, false, false},
                        {Format::mxfp4, 5, 16, 6, false, false}};
  uint64_t seed = 700;
  for (const Case& t : cases) {
    const int64_t block_len = t.format == Format::nvfp4 ? 16 : 32, K = t.blocks * block_len;
    const std::string what = std::string(to_string(t.format)) + " " + std::to_string(t.a_rows) + "x" +
                             std::to_string(t.b_rows) + " blocks " + std::to_string(t.blocks) + " tiles " +
                             std::to_string(t.a_tiles) + std::to_string(t.b_tiles);
    const QuantizedTensor a = quantized(t.format, t.a_rows, K, seed++, t.a_tiles);
    const QuantizedTensor b = quantized(t.format, t.b_rows, K, seed++, t.b_tiles);
    const int64_t stride = amx_block_bytes(block_len);
    std::vector<uint8_t> pa(static_cast<size_t>(t.blocks * stride + 64)), pb(pa.size());
    uint8_t* a64 = pa.data() + (64 - reinterpret_cast<uintptr_t>(pa.data()) % 64) % 64;  // 64-byte aligned panels
    uint8_t* b64 = pb.data() + (64 - reinterpret_cast<uintptr_t>(pb.data()) % 64) % 64;
    pack_amx_a_panel(a, 0, a64);
    pack_amx_b_panel(b, 0, b64);
    const std::vector<float> want = model(a, b);
    amx_thread_begin(block_len);
    for (const int64_t chunk : {int64_t{1}, int64_t{2}, t.blocks}) {
      alignas(64) float acc[16 * 16];
      std::fill(acc, acc + 256, std::nanf(""));
      for (int64_t u0 = 0; u0 < t.blocks; u0 += chunk)
        int8_micro_kernel_amx(block_len, t.a_tiles, t.b_tiles)(a64 + u0 * stride, b64 + u0 * stride,
                                                              std::min(chunk, t.blocks - u0), acc, u0 == 0);
      for (int i = 0; i < 256; ++i)
        ASSERT_EQ(std::memcmp(&want[i], &acc[i], 4), 0)
            << what << " chunk " << chunk << ": C[" << i / 16 << "," << i % 16 << "] = " << acc[i] << ", model " << want[i];
    }
    amx_thread_end();
  }
}

}  // namespace
}  // namespace nibble::cpu::gemm_detail
