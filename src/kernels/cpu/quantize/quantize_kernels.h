// Range kernels behind nibble::cpu::quantize / dequantize. quantize.cpp validates, computes the
// per-tensor constants and tables (with the scalar codecs of format/codecs.h, so they are the
// reference's numbers), splits the work over OpenMP threads and calls one of these tables, picked
// from active_isa(). Each ISA file (quantize_scalar.cpp, quantize_avx2.cpp, quantize_avx512.cpp)
// defines its SIMD primitives and includes quantize_kernels_impl.inc, which builds the kernels.
//
// Every kernel works on a range of independent blocks (or tiles, or elements) and reads nothing
// outside it, so the result does not depend on how the work is split between threads.
#pragma once
#include <cstdint>

namespace nibble::cpu::kernels {

// NVFP4 (1x16 rows or 16x16 tiles) with everything per-tensor precomputed.
struct Nvfp4Job {
  const float* x = nullptr;  // row-major [rows, cols], validated finite
  int64_t rows = 0, cols = 0;
  // 1x16 blocks: x holds the tensor from block x_first_block on (block i at x + (i - x_first_block)
  // * 16), so a caller can hand over a strip it produced into a small buffer. Tiles ignore it.
  int64_t x_first_block = 0;
  bool rht = false;            // transform each 16-block (and round to BF16) before quantizing
  // The input's max |x| is below 2^122, so every transformed value (and partial sum) is finite: no
  // Inf, no NaN (|WHT| <= 16 max |x|). Kernels may then skip the NaN handling of the RHT path.
  bool rht_finite = false;
  // Four Over Six (spec section 4, TE's rule): per 1x16 block, or per 16x16 tile, also quantize
  // with the block scale times 1.5 (block max to 4) and keep the candidate whose error against the
  // input is strictly lower (ref::four_over_six_candidates).
  bool four_over_six = false;
  bool four_over_six_mse = false;  // error measure: sum of squares (MSE), else of |error| (MAE)
  bool stochastic = false;       // 8 random bits per element: format/philox.h, philox_byte
  uint64_t seed = 0, offset = 0;
  float encode_times_rcp6 = 0;      // S_enc * (1/6), the reference's exact product
  float global_encode = 0;          // S_enc (Four Over Six scales: (b / 6) * S_enc, TE's order)
  float global_amax = 0;            // the tensor amax       } the Four Over Six error's
  float global_numerator = 0;       // 6 * the E4M3 ceiling  } ((code * scale) * amax) / numerator
  const float* enc_of_scale = nullptr;   // [256]: min(1 / (e4m3_decode(s) * S_dec), FLT_MAX)
  const float* value_of_scale = nullptr; // [256]: e4m3_decode(s) (Four Over Six error)
  uint8_t* codes = nullptr;   // rows*cols/2 packed
  uint8_t* scales = nullptr;  // rows*cols/16
};

// MXFP4 / MXFP8: blocks of 32 with an E8M0 scale rounded up.
struct MxJob {
  const float* x = nullptr;
  bool fp4 = true;  // else MXFP8 (E4M3 elements)
  bool stochastic = false;
  uint64_t seed = 0, offset = 0;
  float max_rcp = 0;                 // 1/6 (fp4) or 1/448 (fp8)
  const float* rcp_of_scale = nullptr;  // [256]: e8m0_decode_reciprocal(e)
  uint8_t* codes = nullptr;
  uint8_t* scales = nullptr;
};

struct Kernels {
  // max over |x| of the FP32 bit patterns with the sign cleared: for finite values the integer
  // order is the float order, and a result >= 0x7F800000 means an Inf or NaN is present.
  uint32_t (*max_abs_bits)(const float* x, int64_t n);
  // For the RHT path: max_abs_bits of the input and amax of the transformed, BF16-rounded values
  // (NaN ignored, as std::max(m, NaN) does in the reference). n % 16 == 0. Thread ranges combine by
  // taking the maximum of each.
  void (*rht_amax)(const float* x, int64_t n, uint32_t* input_max_abs_bits, float* transformed_amax);
  // 1x16 blocks [block_begin, block_end) of the flat tensor (a block never straddles rows).
  void (*nvfp4_blocks)(const Nvfp4Job& job, int64_t block_begin, int64_t block_end);
  // 16x16 tiles [tile_begin, tile_end), numbered row-major over (rows/16, cols/16).
  void (*nvfp4_tiles)(const Nvfp4Job& job, int64_t tile_begin, int64_t tile_end);
  // NVFP4 1x16 blocks of x^T straight from x (the wgrad operands), without a transposed copy. x is
  // [T, C] with row stride ld, C % 16 == 0, T % 16 == 0; the job describes x^T ([C, T]) and must be a
  // fast-path one (no Four Over Six; with RHT only when rht_finite). The work is numbered in x^T
  // "panels" of 16 rows x 256 columns (16 columns of x x 256 tokens), panel = token_batch *
  // (C / 16) + column_group, so consecutive panels share rows of x. Null where the ISA has none.
  void (*nvfp4_transposed)(const Nvfp4Job& job, const float* x, int64_t ld, int64_t panel_begin, int64_t panel_end);
  // For those panels: max |x| bits and the amax of the RHT-transformed, BF16-rounded blocks of x^T
  // (meaningful only when the max |x| is below 2^122). Null where nvfp4_transposed is.
  void (*rht_amax_transposed)(const float* x, int64_t ld, int64_t rows, int64_t cols, int64_t panel_begin,
                              int64_t panel_end, uint32_t* input_max_abs_bits, float* transformed_amax);
  // 32-element blocks [block_begin, block_end).
  void (*mx_blocks)(const MxJob& job, int64_t block_begin, int64_t block_end);
  // FP8 per tensor: out[i] = encode(x[i] * scale), E4M3 or E5M2, RN, satfinite.
  void (*fp8_range)(const float* x, int64_t n, float scale, bool e4m3, uint8_t* out);
  // E2M1 codes times a per-block factor (factor_of_scale[scale byte]); block_len 16 or 32.
  // When rht, each 16-block of the output is then inverse-transformed in place.
  void (*dequant_e2m1)(const uint8_t* codes, const uint8_t* scales, const float* factor_of_scale, int64_t block_len,
                       bool rht, int64_t block_begin, int64_t block_end, float* out);
  // Byte codes (FP8): out[i] = value_of_code[code] * factor, factor = factor_of_scale[scales[i/block_len]]
  // when scales is non-null, else tensor_factor. Elements [begin, end).
  void (*dequant_bytes)(const uint8_t* codes, const uint8_t* scales, const float* factor_of_scale,
                        int64_t block_len, float tensor_factor, const float* value_of_code, int64_t begin,
                        int64_t end, float* out);
  // out[c * rows + r] = x[r * ld + c] for r in [row_begin, row_end), c in [0, cols).
  void (*transpose)(const float* x, int64_t ld, int64_t rows, int64_t cols, float* out, int64_t row_begin,
                    int64_t row_end);
  void (*bf16_to_float)(const uint16_t* in, int64_t n, float* out);
};

const Kernels& scalar_kernels();
const Kernels& avx2_kernels();
const Kernels& avx512_kernels();
// Tests only: quantize, dequantize and the transposes use `k` instead of the cpuid choice until this
// is called again with null. tests/emulated runs the AVX-512 kernels, compiled against a software
// model of their intrinsics, through the whole quantize path this way on CPUs without AVX-512.
void set_kernels_override_for_tests(const Kernels* k);

}  // namespace nibble::cpu::kernels
