// CPU GEMMs. Quantized operands use the TN layout cuBLASLt requires: both K-contiguous,
//   C[M,N] = alpha * A[M,K] . B[N,K]^T   (+ C when Output::accumulate)
// with FP32 output. For NVFP4 each 16-element partial product is exact (E2M1*2 are small
// integers), is multiplied by sA*sB and accumulated in FP32; the global factor
// amaxA*amaxB/2688^2 (decode_scale_A * decode_scale_B) is applied once at the end; a row-scaled
// operand (TE's row-scaled NVFP4) brings one decode scale per row instead: C[m,n] takes
// (alpha * S_decA[m]) * S_decB[n] in that epilogue.
// FP32 and BF16 GEMMs run nibble's packed FMA / BF16 kernels, which are bitwise the same for any
// thread count (training promises that; oneDNN's blocking follows the thread count); oneDNN's matmul
// stays available for comparisons (gemm_f32_onednn, gemm_bf16_onednn).
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "format/gemm_rules.h"
#include "format/quantized_tensor.h"

namespace nibble::cpu {

// Summation (how quantized products are summed: block_exact / fp32_products on AMX-BF16, and FP8
// also on AVX512-BF16), Output and Trans are the shared GEMM contract (format/gemm_rules.h).
using nibble::Output;
using nibble::Summation;
using nibble::Trans;
// True when Summation::fp32_products runs its own kernel for operands of `format` on this CPU
// (after NIBBLE_ISA): every format on AMX-BF16, FP8 (e4m3/e5m2) on AVX512-BF16 too; false when it
// falls back to block_exact.
bool fp32_products_available(Format format);

// Quantized x quantized. a: [M, K], b: [N, K], same K and compatible formats (nvfp4 x nvfp4 with
// any block shape on either side, mxfp4 x mxfp4, mxfp8 x mxfp8, fp8 x fp8 in any e4m3/e5m2 mix).
// c: row-major with leading dimension ldc >= N. Throws UsageError on mismatched shapes/formats.
void gemm(const QuantizedTensor& a, const QuantizedTensor& b, float* c, int64_t ldc, float alpha = 1.0f,
          Output output = Output::overwrite, Summation summation = Summation::block_exact);


// BLAS-style FP32 GEMM: C[M,N] = alpha * op(A) op(B) + beta * C, row-major, op(A) is [M,K], op(B)
// is [K,N]; lda/ldb/ldc are the row strides of the stored matrices. nibble's f32-family kernel of
// the active ISA (FMA, k summed in order by the one thread that owns each output).
void gemm_f32(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
// gemm_f32 always through oneDNN's matmul (for comparisons).
void gemm_f32_onednn(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
                     const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
// Same contract with operands rounded to BF16 (RN) and FP32 accumulation, on nibble's kernels (the
// operands are rounded while they are packed: no BF16 copy), bitwise the same for any thread count:
// where the CPU has AMX-BF16 the tile kernel (~2x oneDNN's BF16 matmul on the training shapes;
// FP32 subnormal inputs read as zero, its own bits); elsewhere the exact BF16 products are summed in
// pair order (per pair of k, the product at k + 1, then at k; BF16 subnormals read as zero), the
// order of AVX512-BF16's vdpbf16ps, by vdpbf16ps or by the FMA kernel of the active ISA on widened
// pair panels (bf16_pair_kernel()): the same bits on every ISA without AMX-BF16, but for sums below
// 2^-126, which vdpbf16ps flushes to zero.
void gemm_bf16(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
// Which instruction sums BF16 products in pair order where AMX-BF16 does not run them (gemm_bf16,
// FP8's fp32_products, attention's BF16 products): vdpbf16ps (two products a lane, on AVX512-BF16
// CPUs) or two FMAs on widened operands. Both give the same bits (sums below 2^-126, which
// vdpbf16ps flushes, aside), so this is speed, and the faster varies: vdpbf16ps on AMD's Zen 4/5,
// the FMAs on Intel's cores without AMX (docs/benchmarks.md). Below AVX512-BF16 it is fma; there it
// is fixed by the CPU's vendor (never by a timing, so a run resumed on the same machine takes the
// same kernel), unless $NIBBLE_BF16_PAIRS says fma or dpbf16.
enum class Bf16PairKernel { fma, dpbf16 };
Bf16PairKernel bf16_pair_kernel();
// For tests and benchmarks: force one (dpbf16 takes effect only on AVX512-BF16 CPUs); nullopt goes
// back to the CPU's choice.
void set_bf16_pair_kernel(std::optional<Bf16PairKernel> kernel);
std::string_view to_string(Bf16PairKernel kernel);
std::optional<Bf16PairKernel> parse_bf16_pair_kernel(std::string_view name);  // "fma", "dpbf16"
// How nibble's GEMMs (gemm, gemm_bf16 and gemm_f32 on nibble's kernels) write an output C that they
// overwrite and that is at least kStreamedOutputBytes: through the caches, or with non-temporal
// (streaming) stores that skip reading each line of C for ownership first. The same bits either way.
// A training step's outputs are activations and gradients far from every cache, so the read of each
// line before it is written doubled the write-back's memory traffic: streaming is the default from
// AVX2 up (measured faster on Intel Xeons and on AMD Zen 4: docs/benchmarks.md), unless
// $NIBBLE_C_STORES says streaming or cached. Below AVX2 it is cached (the streaming stores are whole
// AVX2 or AVX-512 vectors).
enum class CStores { cached, streaming };
inline constexpr int64_t kStreamedOutputBytes = int64_t{1} << 20;
CStores c_stores();
// For tests and benchmarks: force one (streaming takes effect only from AVX2 up); nullopt goes back
// to the CPU's choice.
void set_c_stores(std::optional<CStores> stores);
std::string_view to_string(CStores stores);
std::optional<CStores> parse_c_stores(std::string_view name);  // "cached", "streaming"
// gemm_bf16 always through oneDNN (the library a user would otherwise pick; for comparisons).
void gemm_bf16_onednn(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
                      const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace nibble::cpu

namespace nibble::ref {
// The spec in code: FP64 sum of the exact block products of the same quantized operands,
// times the scales. Slow; the law every kernel is tested against.
void gemm(const QuantizedTensor& a, const QuantizedTensor& b, double* c, int64_t ldc);
}  // namespace nibble::ref
