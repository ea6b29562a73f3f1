// GPU quantization: the device twin of format/quantize.h, bit-identical to nibble::ref for
// round-to-nearest and for stochastic rounding (the same Philox stream, indexed by element).
//   quantize            row-wise blocks along K (cols): NVFP4 1x16 / 16x16, MXFP4/MXFP8, FP8.
//   quantize_both       one read of x gives the row-wise copy and the column-wise one (the
//                       quantization of x^T, = ref::quantize_transposed): the fused transposed copy.
// Every function runs two passes, as the spec's chain needs the tensor amax before any block: an
// amax reduction (which also finds the first non-finite value; with a deferred check, its last
// block to finish folds that into the context's sticky word) and the quantization, both on the
// context's stream. Global scales stay on the device (DeviceQuantized::globals).
#pragma once
#include <cstdint>

#include "format/codecs.h"
#include "format/quantized_tensor.h"
#include "kernels/cuda/context.h"

namespace nibble::cuda {

// A quantized tensor in device memory: the host tensor's layout (format/quantized_tensor.h) with
// device storage.
struct DeviceQuantized : QuantizedLayout {
  DeviceBuffer<uint8_t> codes;   // as QuantizedTensor::codes
  DeviceBuffer<uint8_t> scales;  // row-major [rows, scale_cols] (not swizzled)
  DeviceBuffer<float> globals;   // [0] amax, [1] decode scale (S_dec for nvfp4, 1/scale for fp8, 1 for mx;
                                 // 1 for row-scaled nvfp4)
  DeviceBuffer<float> row_globals;  // row_scaled only: [2 * rows], each row's amax, then each row's S_dec
  // KernelOptions::write_bf16_operand (NVFP4) only, else empty: [rows, cols] BF16 bits of code x block
  // scale, what dequantize_block_scaled_bf16 writes; the emulated GEMM multiplies it as it is.
  DeviceBuffer<uint16_t> bf16;

  QuantizedLayout& layout() { return *this; }
  const QuantizedLayout& layout() const { return *this; }
};

// Knobs that only the GPU path has.
struct KernelOptions {
  // Read back the first non-finite input index (one small synchronising copy) and throw NumericalError
  // naming it, as the reference does. Off: non-finite input gives unspecified codes, no sync.
  bool check_finite = true;
  // With check_finite: instead of reading the result back (a host synchronisation per quantization),
  // fold it into the context's sticky word (one tiny kernel, no sync); throw_deferred_nonfinite reads
  // it once, where the caller synchronises anyway (the CUDA backend: where the loss and the gradient
  // norm are read, before the optimizer writes the weights), and throws for the first offending
  // quantization, as its own check would have.
  bool defer_finite_check = false;
  // sm_100a/103a only, SR only: the hardware's cvt.rs stochastic rounding (random bits from the
  // same Philox stream) instead of the reference's comparison. Same statistics, not the same bits.
  bool hardware_stochastic_rounding = false;
  // Use the Blackwell conversion instructions when the device has them (bit-identical for RN).
  bool allow_sm100_kernels = true;
  // Device pointers to amaxes computed elsewhere (fused into a previous kernel, or a previous
  // quantization's globals[0]): the amax pass is skipped, and with it the non-finite check. For
  // quantize_both, given_amax is the row-wise copy's and given_column_amax the column-wise one's
  // (unused for 16x16 tiles, which share the row-wise amax); both must be given to skip the pass.
  const float* given_amax = nullptr;
  const float* given_column_amax = nullptr;
  // NVFP4 (other formats ignore it): the quantize kernel also writes DeviceQuantized::bf16, the
  // operand of the emulated GEMM, from the codes and scales it has just made. For GPUs without FP4
  // tensor cores (Hopper): the GEMM then runs no dequantize pass (one read of the codes and one
  // write of 2 bytes a value fewer per operand; the tensor holds the BF16 copy until it dies).
  bool write_bf16_operand = false;
  // Stochastic rounding only: a device pointer to the per-micro-step part of the seed (recipe.h,
  // sr_step_hash). When set, every SR seed of the call is sr_seed_of(*sr_step_hash, opt.seed), opt.seed
  // then being the quantization's salt (sr_salt): the kernels read the hash when they run, so a
  // captured step (a CUDA graph) replays with the hash its buffer holds then, not a frozen argument.
  const uint64_t* sr_step_hash = nullptr;
};

// Device pointers, row-major [rows, cols], 16-byte aligned. Throws UsageError for the shapes and
// options the reference refuses (same messages) and for non-finite input (with check_finite).
DeviceQuantized quantize(const float* x, int64_t rows, int64_t cols, const QuantOptions& opt,
                         Context& ctx = default_context(), const KernelOptions& kopt = {});
DeviceQuantized quantize(const bf16* x, int64_t rows, int64_t cols, const QuantOptions& opt,
                         Context& ctx = default_context(), const KernelOptions& kopt = {});

struct QuantizedPair {
  DeviceQuantized rowwise;     // quantize(x, row_opt)
  DeviceQuantized columnwise;  // ref::quantize_transposed(x, col_opt): [cols, rows]
};
// NVFP4 only, rows % 16 == 0. For 16x16 tiles (col_opt == row_opt) the column-wise copy is the exact
// transpose of the row-wise codes and scales (with Four Over Six, one choice per tile serves both); for 1x16 it is an independent quantization of x^T
// with its own options (RHT along tokens, SR seed/offset), as the wgrad GEMM needs.
QuantizedPair quantize_both(const float* x, int64_t rows, int64_t cols, const QuantOptions& row_opt,
                            const QuantOptions& col_opt, Context& ctx = default_context(),
                            const KernelOptions& kopt = {});
QuantizedPair quantize_both(const bf16* x, int64_t rows, int64_t cols, const QuantOptions& row_opt,
                            const QuantOptions& col_opt, Context& ctx = default_context(),
                            const KernelOptions& kopt = {});
// The column-wise copy alone (any format; NVFP4 through the fused kernel).
DeviceQuantized quantize_transposed(const float* x, int64_t rows, int64_t cols, const QuantOptions& opt,
                                    Context& ctx = default_context(), const KernelOptions& kopt = {});

// max |x| over n values into *amax_out (device pointer), on ctx's stream.
void amax(const float* x, int64_t n, float* amax_out, Context& ctx = default_context());

// Values in the original domain (inverse RHT applied when q.rht), FP32, row-major.
void dequantize(const DeviceQuantized& q, float* out, Context& ctx = default_context());
// codes * block scale, global scale left out, as BF16 bits: exact for NVFP4 (e2m1 x e4m3 has at most
// 6 significant bits), MXFP4, FP8; the operand of the emulated GEMM (the global scale goes to alpha).
void dequantize_block_scaled_bf16(const DeviceQuantized& q, uint16_t* out, Context& ctx = default_context());

// The exact transpose t of a 16x16-tile tensor s (layers.h, transpose_nvfp4_tiles) takes s's BF16
// operand transposed (a code times its tile's scale is the same value in either orientation), so
// the emulated GEMM on t runs no dequantize pass either. Nothing when s has none.
void transpose_bf16_operand(const DeviceQuantized& s, DeviceQuantized& t, Context& ctx = default_context());

// The 128x4 tile layout cuBLASLt reads block scales in (spec section 7), zero-padded:
// out must hold dm::swizzled_scale_bytes(q.rows, q.scale_cols()) bytes.
void swizzle_scales(const DeviceQuantized& q, uint8_t* out, Context& ctx = default_context());
void swizzle_scales(const uint8_t* scales, int64_t rows, int64_t scale_cols, uint8_t* out, Context& ctx);

// The deferred non-finite checks since the last call (KernelOptions::defer_finite_check): nothing when
// none is pending; else one small synchronising read, the word reset, and NumericalError naming the
// first quantization (in call order) that met a non-finite input and the value's index, when one did.
void throw_deferred_nonfinite(Context& ctx);

// Host <-> device (synchronising), for tests and checkpoints.
QuantizedTensor to_host(const DeviceQuantized& q);
DeviceQuantized to_device(const QuantizedTensor& q, Context& ctx = default_context());

// The shape/option checks of ref::validate that need no data (the values are checked on the device).
void validate_shape(int64_t rows, int64_t cols, const QuantOptions& opt);

}  // namespace nibble::cuda
