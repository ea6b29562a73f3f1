// Internal to the CPU GEMM: the packed-panel layouts and the per-ISA micro-kernels that run on
// them. gemm.cpp validates, packs both operands into panels, splits C into macro tiles, and calls
// one micro-kernel per (A panel, B panel, K chunk). The packers write the same bytes on every ISA
// (table lookups, or the SIMD packers tested byte for byte against them); the int8 panels come in
// two mirrored pairs (A signed + B biased, or A biased + B signed for the AVX2 kernel).
//
// Two kernel families:
//  * int8 blocks (NVFP4, MXFP4): a 4-bit E2M1 code doubled is an integer in [-12, 12], so a block
//    of 16 (or 32) products is an exact int32 dot product. One side is stored signed, the other as
//    unsigned u = 2*e2m1 + 12 in [0, 24] because vpdpbusd / vpmaddubsw multiply u8 x s8; the +12
//    is cancelled by starting each block's int32 sum at -12 * sum(the signed side's block), stored
//    with the signed side (which side is which depends on the kernel: see the panel layouts).
//    Each block's exact integer is converted to float, multiplied by sB and then fused-multiply-
//    added with sA into the FP32 accumulator: both products are exact (<= 12+4+4 significant bits),
//    so the only rounding is the one FP32 addition per block.
//  * f32 (FP8, MXFP8): elements times their power-of-two block scale are decoded exactly to FP32
//    and summed with FMA, one k at a time in order.
// In both, the per-output summation order is fixed by the packing (blocks in K order), never by
// the thread that computes the tile, so results are bitwise identical for any thread count.
#pragma once
#include <cstdint>

#include "format/quantized_tensor.h"
#include "kernels/cpu/gemm/gemm.h"  // Trans

namespace nibble::cpu::gemm_detail {

inline constexpr int kMr = 8;   // rows of A per micro-tile (broadcast operand)
inline constexpr int kNr = 32;  // columns of C per micro-tile: two 16-lane vectors of B
inline constexpr int kNrVectors = kNr / 16;

// Int8 panels of R rows (R = kMr for A, kNr for B), per block of `block_len` k (kg = block_len / 4
// groups of 4), in one of two kinds:
//   signed:  int8  codes[kg][R][4]   doubled E2M1 of rows r..r+R-1, 4 consecutive k per row
//            int32 init[R]           -12 * sum of the row's doubled codes in this block
//            float scale[R]          the decoded block scale (E4M3 or E8M0) of each row
//   biased:  uint8 codes[kg][R][4]   2*E2M1 + 12, in [0, 24]
//            float scale[R]
// vpmaddubsw / vpdpbusd multiply u8 x s8, so one side is biased and the other's init sums cancel
// the bias. The scalar and AVX-512 kernels take A signed (the broadcast side) and B biased; the AVX2
// kernel takes A biased and B signed, so that B's vectors are vpmaddubsw's memory operand and the
// correction is one vector per block shared by every row instead of a broadcast per row.
// Rows/columns past the matrix edge are packed as code 0 with scale 0: they contribute 0.
inline constexpr int64_t int8_signed_block_bytes(int64_t block_len, int64_t rows) { return block_len * rows + 8 * rows; }
inline constexpr int64_t int8_biased_block_bytes(int64_t block_len, int64_t rows) { return block_len * rows + 4 * rows; }
// The scalar / AVX-512 layout: A signed, B biased.
inline constexpr int64_t int8_a_block_bytes(int64_t block_len) { return int8_signed_block_bytes(block_len, kMr); }
inline constexpr int64_t int8_b_block_bytes(int64_t block_len) { return int8_biased_block_bytes(block_len, kNr); }

// AMX panels of the int8 family (gemm_amx.cpp) are 16 rows of A or 16 columns of B, per block:
//   A: int8 codes[16][block_len]       doubled E2M1, row-major: one tile row per matrix row
//   B: int8 codes[block_len/4][16][4]  doubled E2M1 in the tile unit's VNNI order (signed: the tile
//                                      unit multiplies s8 x s8, no +12 shift and no init sums)
//   then float scale[16] on both sides. 16*block_len + 64 bytes, a multiple of 64, so every block
//   starts 64-byte aligned in a 64-byte aligned panel. Padding rows/columns have code 0 and the
//   scale of the panel's first row (so a 16x16-tiled operand's scales stay uniform).
inline constexpr int kAmxTile = 16;
inline constexpr int64_t amx_block_bytes(int64_t block_len) { return kAmxTile * block_len + 4 * kAmxTile; }

// AMX-BF16 panels (gemm_bf16_amx.cpp, Summation::fp32_products) are 32 rows of A or
// 32 columns of B, per unit of 32 k (two NVFP4 blocks; an odd last block is padded with zeros):
//   A: bf16 [2 tiles][16 rows][32 k]              the decoded values e2m1 * block scale, exact
//   B: bf16 [2 tiles][16 k pairs][16 columns][2]  the tile unit's pair order
// Rows/columns past the matrix edge are zero. The micro-tile is 32x32 (four accumulator tiles).
inline constexpr int kBf16Panel = 32;
// The BF16 micro-kernel's accumulators live in the driver's scratch macro tile with this row
// stride (floats), so that a row of the macro tile is contiguous and is written back to C in one
// pass (per 32-column micro-tile cost too much on small GEMMs such as attention's).
inline constexpr int64_t kBf16AccStride = 256;
inline constexpr int64_t kBf16UnitK = 32;
inline constexpr int64_t kBf16UnitBytes = 2 * 16 * 32 * 2;
inline constexpr int64_t bf16_units(int64_t k) { return (k + kBf16UnitK - 1) / kBf16UnitK; }

// BF16-pair panels (AVX512-BF16 vdpbf16ps; gemm_bf16 and FP8 with fp32_products where AMX-BF16 is
// absent), per unit of 2 k: uint32 a[kMr] and uint32 b[kNr], each the BF16 of k (low half) and of
// k + 1 (high half) of one row / column; an odd K's last high half and the rows/columns past the
// edge are zero. vdpbf16ps adds both exact products of a pair to the FP32 accumulator.
inline constexpr int64_t kBf16PairUnitK = 2;
inline constexpr int64_t bf16_pair_a_unit_bytes() { return 4 * kMr; }
inline constexpr int64_t bf16_pair_b_unit_bytes() { return 4 * kNr; }

// Packed panels of the f32 family, per k: float a[kMr] and float b[kNr].
inline constexpr int64_t f32_a_k_bytes() { return 4 * kMr; }
inline constexpr int64_t f32_b_k_bytes() { return 4 * kNr; }

// acc: kMr x kNr floats, row-major (stride kNr). When `first`, acc is overwritten, else added to.
using MicroKernel = void (*)(const uint8_t* packed_a, const uint8_t* packed_b, int64_t units, float* acc,
                             bool first);

// Micro-kernels for the int8 family take `units` = blocks; block_len 16 or 32.
MicroKernel int8_micro_kernel_scalar(int64_t block_len);
// b_uniform: B is 16x16-tiled, so each 16-column half of a panel has one scale per block.
MicroKernel int8_micro_kernel_avx2(int64_t block_len, bool b_uniform);
MicroKernel int8_micro_kernel_avx512(int64_t block_len, bool b_uniform);
// AMX: acc is 16x16 floats (stride 16, 64-byte aligned) and `first` only decides whether acc is
// read. a_uniform / b_uniform: all 16 rows of each A block (columns of each B block) of a panel
// have the same scale (16x16-tiled NVFP4), which saves one vector op per row.
MicroKernel int8_micro_kernel_amx(int64_t block_len, bool a_uniform, bool b_uniform);
// Tile state of the calling thread: configured for block_len before its first AMX micro-kernel,
// released after its last (other libraries on the same thread, e.g. oneDNN, configure their own).
void amx_thread_begin(int64_t block_len);
void amx_thread_end();
// AMX-BF16: acc is 32x32 floats (stride kBf16AccStride); `units` = 32-k units. The thread's
// tiles are configured by amx_bf16_thread_begin and released by amx_thread_end.
MicroKernel bf16_micro_kernel_amx();
void amx_bf16_thread_begin();
// out[j] = scale * in[j] for j < n with non-temporal stores of whole vectors from out's first
// vector-aligned float on (cached stores before it and for the tail): the write-back of a large
// overwritten C (gemm.h: c_stores). The caller fences (sfence) before another thread reads out.
using StreamScaled = void (*)(const float* in, int64_t n, float scale, float* out);
void stream_scaled_avx2(const float* in, int64_t n, float scale, float* out);
void stream_scaled_avx512(const float* in, int64_t n, float scale, float* out);
// Micro-kernels for the f32 family take `units` = k.
MicroKernel f32_micro_kernel_scalar();
MicroKernel f32_micro_kernel_avx2();
MicroKernel f32_micro_kernel_avx512();
// vdpbf16ps over BF16-pair panels; `units` = k pairs. acc as for the f32 family (8 x 32, stride 32).
MicroKernel bf16_pair_micro_kernel_avx512bf16();

enum class Family { int8_blocks, f32 };
// Throws UsageError unless C[M,N] = A . B^T is a supported product (gemm.h); returns which kernel
// family computes it. Shared by the kernels and the reference so both accept the same inputs.
Family validate_operands(const QuantizedTensor& a, const QuantizedTensor& b, const void* c, int64_t ldc);

// Packing (gemm_pack.cpp). `row0` is the first row of the panel; rows beyond q.rows are padding.
// pack_int8_*_panel: table lookups, one per byte (two codes), for CPUs below AVX2;
// pack_int8_*_panel_simd: the same bytes, 16 codes per pshufb and 4 x 4 word transposes into the
// panel order (gemm_avx2.cpp; AVX2 and AVX-512 CPUs), since packing runs on every GEMM's operands.
// a / b: the scalar and AVX-512 layout (A signed, B biased); biased_a / signed_b: the AVX2 one.
void pack_int8_a_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst);
void pack_int8_b_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst);
void pack_int8_biased_a_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst);
void pack_int8_signed_b_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst);
void pack_int8_a_panel_simd(const QuantizedTensor& q, int64_t row0, uint8_t* dst);
void pack_int8_b_panel_simd(const QuantizedTensor& q, int64_t row0, uint8_t* dst);
void pack_int8_biased_a_panel_simd(const QuantizedTensor& q, int64_t row0, uint8_t* dst);
void pack_int8_signed_b_panel_simd(const QuantizedTensor& q, int64_t row0, uint8_t* dst);
void pack_int8_a_panel_avx512(const QuantizedTensor& q, int64_t row0, uint8_t* dst);  // NVFP4 only
void pack_int8_b_panel_avx512(const QuantizedTensor& q, int64_t row0, uint8_t* dst);  // NVFP4 only
// Panels of E2M1 operands packed with SSSE3 nibble lookups in the ISA files (gemm_avx2.cpp,
// gemm_amx.cpp, gemm_bf16_amx.cpp) read plain pointers, so that no inline code of QuantizedTensor
// is compiled with AVX2 or AVX-512 flags (the linker could keep that copy for every caller).
struct E2m1PanelSource {
  const uint8_t* codes;  // packed E2M1, rows x cols/2
  const uint8_t* scales; // rows x cols/block_len block scale codes
  int64_t rows, cols, block_len;
  const float* scale_of;  // the 256 decoded block scales of the format
};
void pack_int8_a_panel_avx2(const E2m1PanelSource& q, int64_t row0, uint8_t* dst);
void pack_int8_b_panel_avx2(const E2m1PanelSource& q, int64_t row0, uint8_t* dst);
void pack_int8_biased_a_panel_avx2(const E2m1PanelSource& q, int64_t row0, uint8_t* dst);
void pack_int8_signed_b_panel_avx2(const E2m1PanelSource& q, int64_t row0, uint8_t* dst);
// The A panel (signed) and B panel (biased) of NVFP4 16-blocks with AVX-512BW, four blocks at a time
// (gemm_pack_avx512.cpp): the bytes of pack_int8_a_panel and pack_int8_b_panel; block_len 16 only.
void pack_int8_a_panel_avx512(const E2m1PanelSource& q, int64_t row0, uint8_t* dst);
void pack_int8_b_panel_avx512(const E2m1PanelSource& q, int64_t row0, uint8_t* dst);
void pack_amx_a_panel(const E2m1PanelSource& q, int64_t row0, uint8_t* dst);
void pack_amx_b_panel(const E2m1PanelSource& q, int64_t row0, uint8_t* dst);
void pack_bf16_a_panel(const E2m1PanelSource& q, int64_t row0, uint8_t* dst);  // NVFP4 and MXFP4
void pack_bf16_b_panel(const E2m1PanelSource& q, int64_t row0, uint8_t* dst);
// An FP32 operand of gemm_bf16 seen as `rows` x k: element (r, k) is p[r * ld + k] when
// k_contiguous, else p[k * ld + r]. Packing rounds to BF16 (RN-even, NaN kept quiet, FP32
// subnormals read as zero: vcvtne2ps2bf16).
struct F32Operand {
  const float* p;
  int64_t ld, rows, k;
  bool k_contiguous;
};
void pack_bf16_a_panel(const F32Operand& x, int64_t row0, uint8_t* dst);
void pack_bf16_b_panel(const F32Operand& x, int64_t row0, uint8_t* dst);

// Attention's BF16 products on the AMX-BF16 tiles (kernels/cpu/layers/attention.cpp), where one
// head's B operand serves many calls: B = [K][N] floats (rows ldb apart, BF16 values) packed once
// into ceil(N / 32) panels of bf16_units(K) units; then C [M][N] (+)= A B for A [M][k], k <= K (a
// prefix of B's rows), A's element (m, j) at A[m * a_row + j * a_k] with a_k or a_row 1. Scratch:
// a_panels of bf16_panels_bytes(k, M) bytes, acc of 32 x kBf16AccStride floats. Each output is summed
// by one call in the tile unit's order: the same bits for any thread count, and within the FP32
// accumulation bound of the pair order the other ISAs' attention products share.
inline constexpr int64_t bf16_panels_bytes(int64_t k, int64_t columns) {
  return (columns + kBf16Panel - 1) / kBf16Panel * bf16_units(k) * kBf16UnitBytes;
}
void pack_bf16_b_panels(int64_t K, int64_t N, const float* B, int64_t ldb, uint8_t* panels);
void bf16_product_amx(int64_t M, int64_t N, int64_t k, const float* A, int64_t a_row, int64_t a_k,
                      const uint8_t* b_panels, int64_t b_units, float* C, int64_t ldc, bool accumulate,
                      uint8_t* a_panels, float* acc);
// Per-tensor FP8 codes for the AMX-BF16 path (Summation::fp32_products): rows x k bytes, row-major;
// value_of: the 256 decoded values of the format (the tensor scale is applied at the end).
struct Fp8PanelSource {
  const uint8_t* codes;
  int64_t rows, k;
  const float* value_of;
};
void pack_bf16_a_panel(const Fp8PanelSource& x, int64_t row0, uint8_t* dst);
void pack_bf16_b_panel(const Fp8PanelSource& x, int64_t row0, uint8_t* dst);
void pack_bf16_fp8_a_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst);  // wrappers (gemm_pack.cpp)
void pack_bf16_fp8_b_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst);
// gemm_bf16 (gemm.h) on nibble's kernels, for arguments already checked, M, N, K > 0 and beta 0
// (overwrite) or 1 (accumulate); gemm_bf16 handles the rest. AMX-BF16 tiles where active, else pair
// order: vdpbf16ps on BF16-pair panels or the f32 family (FMA) on widened ones (bf16_pair_kernel).
void gemm_bf16_packed(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
                      const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
// gemm_f32 (gemm.h) on the f32 family with unrounded panels, same preconditions.
void gemm_f32_packed(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
                     const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void pack_bf16_a_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst);  // wrappers (gemm_pack.cpp)
void pack_bf16_b_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst);
void pack_amx_a_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst);  // wrappers (gemm_pack.cpp)
void pack_amx_b_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst);
void pack_f32_a_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst);
void pack_f32_b_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst);
// f32 panels of an FP32 operand of gemm_f32, as they are.
void pack_f32_a_panel(const F32Operand& x, int64_t row0, uint8_t* dst);
void pack_f32_b_panel(const F32Operand& x, int64_t row0, uint8_t* dst);
// The same two with AVX2 (gemm_avx2.cpp: 8 x 8 register transposes), byte for byte; AVX2 and
// AVX-512 CPUs.
void pack_f32_a_panel_avx2(const F32Operand& x, int64_t row0, uint8_t* dst);
void pack_f32_b_panel_avx2(const F32Operand& x, int64_t row0, uint8_t* dst);
// BF16-pair panels of an FP32 operand (each element rounded to BF16: RN-even, NaN kept quiet,
// subnormals kept, bf16_from_float_rn) and of per-tensor FP8 codes
// (exact in BF16; the tensor scale is applied at the end).
void pack_bf16_pair_a_panel(const F32Operand& x, int64_t row0, uint8_t* dst);
void pack_bf16_pair_b_panel(const F32Operand& x, int64_t row0, uint8_t* dst);
// The two above with AVX2 (gemm_avx2.cpp), byte for byte: what gemm_bf16 packs with on AVX512-BF16.
void pack_bf16_pair_a_panel_avx2(const F32Operand& x, int64_t row0, uint8_t* dst);
void pack_bf16_pair_b_panel_avx2(const F32Operand& x, int64_t row0, uint8_t* dst);
void pack_bf16_pair_fp8_a_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst);
void pack_bf16_pair_fp8_b_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst);
// BF16-pair panels widened for the f32 family's FMA kernels (where vdpbf16ps is absent, or slower
// than two FMAs: Intel's AVX512-BF16 cores without AMX), per pair p two k steps of f32 panel: the
// floats of k = 2p + 1 (the pair's high half), then of k = 2p, each BF16 subnormal flushed to a zero
// of its sign. The f32 kernel's FMA over them in step order is vdpbf16ps's pair order on the values
// vdpbf16ps reads: the same bits (sums below 2^-126, which vdpbf16ps also flushes, aside). Width
// rows, 2 * pairs steps of f32_*_k_bytes(); the pair panel is packed into the upper half first and
// widened in place. The _avx2 ones (AVX2 packer and widening) write the same bytes.
void pack_bf16_pair_widened_a_panel(const F32Operand& x, int64_t row0, uint8_t* dst);
void pack_bf16_pair_widened_b_panel(const F32Operand& x, int64_t row0, uint8_t* dst);
void pack_bf16_pair_widened_a_panel_avx2(const F32Operand& x, int64_t row0, uint8_t* dst);
void pack_bf16_pair_widened_b_panel_avx2(const F32Operand& x, int64_t row0, uint8_t* dst);
void pack_bf16_pair_widened_fp8_a_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst);
void pack_bf16_pair_widened_fp8_b_panel(const QuantizedTensor& q, int64_t row0, uint8_t* dst);
// The widening alone, in place: `pairs` units of a Width-row pair panel that starts at
// dst + pairs * Width * 4 become 2 * pairs f32 steps from dst (scalar, and AVX2 in gemm_avx2.cpp).
void widen_bf16_pairs(int64_t width, int64_t pairs, uint8_t* dst);
void widen_bf16_pairs_avx2(int64_t width, int64_t pairs, uint8_t* dst);
// The micro-kernel over widened pair panels, `units` = k pairs: an f32 kernel (F32Kernel: one of
// f32_micro_kernel_*) on 2 * units steps.
template <MicroKernel (*F32Kernel)()>
void widened_pairs(const uint8_t* pa, const uint8_t* pb, int64_t pairs, float* acc, bool first) {
  F32Kernel()(pa, pb, 2 * pairs, acc, first);
}

// Shared by the dense entry points (gemm_dense.cpp) and the oneDNN comparisons (gemm_onednn.cpp):
// throws UsageError naming `name` on a negative dimension or a leading dimension shorter than its
// stored row; C = beta * C (the whole result of an empty reduction, or beta applied before the
// kernels, which only overwrite or accumulate).
void check_dense_gemm_args(const char* name, Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, int64_t lda,
                           int64_t ldb, int64_t ldc);
void scale_c_by_beta(int64_t M, int64_t N, float beta, float* c, int64_t ldc);

}  // namespace nibble::cpu::gemm_detail
