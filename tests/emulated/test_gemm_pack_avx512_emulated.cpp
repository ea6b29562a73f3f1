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

using Packer = void (*)(const QuantizedTensor&, int64_t, uint8_t*);

// The AVX-512 packer against the table packer on panels of `panel_rows` rows, every byte.
void expect_table_packers_bytes(Packer table, Packer avx512, int64_t panel_rows, int64_t block_bytes,
                                std::initializer_list<int64_t> row_counts, unsigned seed) {
  std::mt19937 rng(seed);
  for (int64_t rows : row_counts)
    for (int64_t blocks : {1, 2, 3, 4, 5, 7, 8, 24}) {
      QuantizedTensor q = emulated_tests::quantized(Format::nvfp4, rows, 16 * blocks, seed + rows * 31 + blocks);
      for (auto& c : q.codes) c = static_cast<uint8_t>(rng());
      for (auto& s : q.scales) s = static_cast<uint8_t>(rng());
      const int64_t bytes = blocks * block_bytes;
      for (int64_t row0 = 0; row0 < rows; row0 += panel_rows) {
        std::vector<uint8_t> want(bytes, 0xAA), got(bytes, 0x55);  // every byte must be written
        table(q, row0, want.data());
        avx512(q, row0, got.data());
        for (int64_t i = 0; i < bytes; ++i)
          ASSERT_EQ(want[i], got[i]) << "rows=" << rows << " blocks=" << blocks << " row0=" << row0 << ": byte " << i
                                     << " (block " << i / block_bytes << ", offset " << i % block_bytes << ")";
      }
    }
}

TEST(Avx512PackEmulated, Nvfp4APanelIsTheTablePackersBytes) {
  expect_table_packers_bytes(&pack_int8_a_panel, static_cast<Packer>(&pack_int8_a_panel_avx512), kMr,
                             int8_a_block_bytes(16), {1, 5, 8, 13, 16}, 40);
}

TEST(Avx512PackEmulated, Nvfp4BPanelIsTheTablePackersBytes) {
  expect_table_packers_bytes(&pack_int8_b_panel, static_cast<Packer>(&pack_int8_b_panel_avx512), kNr,
                             int8_b_block_bytes(16), {1, 5, 16, 17, 31, 32, 45}, 70);
}

}  // namespace
}  // namespace nibble::cpu::gemm_detail
