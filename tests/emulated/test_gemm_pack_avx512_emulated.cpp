// The AVX-512BW packers of the int8 kernels' A and B panels (src/kernels/cpu/gemm/gemm_pack_avx512.cpp)
// compiled against a software model of its intrinsics (avx512_pack_intrinsics.h), run on any CPU
// against the table packer byte for byte: every code and scale byte (random bytes, not only what a
// quantizer writes), full and edge panels, K with 0-3 blocks past the last group of four. On CPUs
// with AVX-512, test_gemm runs the real instructions (Gemm.SimdInt8PackingWritesTheTablePackersBytes).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/cpu/gemm/gemm_kernels.h"
#include "spread_inputs.h"

namespace nibble::cpu::gemm_detail {
namespace {

TEST(Avx512PackEmulated, Nvfp4APanelIsTheTablePackersBytes) {
  std::mt19937 rng(31);
  for (int64_t rows : {1, 5, 8, 13, 16})
    for (int64_t blocks : {1, 2, 3, 4, 5, 7, 8, 24}) {
      QuantizedTensor q = emulated_tests::quantized(Format::nvfp4, rows, 16 * blocks, 40 + rows * 31 + blocks);
      for (auto& c : q.codes) c = static_cast<uint8_t>(rng());
      for (auto& s : q.scales) s = static_cast<uint8_t>(rng());
      const int64_t bytes = blocks * int8_a_block_bytes(16);
      for (int64_t row0 = 0; row0 < rows; row0 += kMr) {
        std::vector<uint8_t> want(bytes, 0xAA), got(bytes, 0x55);  // every byte must be written
        pack_int8_a_panel(q, row0, want.data());
        pack_int8_a_panel_avx512(q, row0, got.data());
        for (int64_t i = 0; i < bytes; ++i)
          ASSERT_EQ(want[i], got[i]) << "rows=" << rows << " blocks=" << blocks << " row0=" << row0 << ": byte " << i
                                     << " (block " << i / int8_a_block_bytes(16) << ", offset "
                                     << i % int8_a_block_bytes(16) << ")";
      }
    }
}

TEST(Avx512PackEmulated, Nvfp4BPanelIsTheTablePackersBytes) {
  std::mt19937 rng(37);
  for (int64_t rows : {1, 5, 16, 17, 31, 32, 45})
    for (int64_t blocks : {1, 2, 3, 4, 5, 7, 8, 24}) {
      QuantizedTensor q = emulated_tests::quantized(Format::nvfp4, rows, 16 * blocks, 70 + rows * 31 + blocks);
      for (auto& c : q.codes) c = static_cast<uint8_t>(rng());
      for (auto& s : q.scales) s = static_cast<uint8_t>(rng());
      const int64_t bytes = blocks * int8_b_block_bytes(16);
      for (int64_t row0 = 0; row0 < rows; row0 += kNr) {
        std::vector<uint8_t> want(bytes, 0xAA), got(bytes, 0x55);  // every byte must be written
        pack_int8_b_panel(q, row0, want.data());
        pack_int8_b_panel_avx512(q, row0, got.data());
        for (int64_t i = 0; i < bytes; ++i)
          ASSERT_EQ(want[i], got[i]) << "rows=" << rows << " blocks=" << blocks << " row0=" << row0 << ": byte " << i
                                     << " (block " << i / int8_b_block_bytes(16) << ", offset "
                                     << i % int8_b_block_bytes(16) << ")";
      }
    }
}

}  // namespace
}  // namespace nibble::cpu::gemm_detail
