// Fused causal attention on the CPU (flash-style): per sequence and head, blocks of query rows
// against the keys up to their diagonal, the scores of one block in a small buffer, softmax in FP32,
// and the backward recomputing the probabilities from two numbers saved per row. No [S, S]
// probabilities tensor and no GEMM packing pass; the causal upper half is never computed.
//
// qkv: [batch*seq, qkv_stride] holding, per token, `heads` query heads, then `kv_heads` key heads,
// then `kv_heads` value heads, each head_dim wide. Query head h attends with key/value head
// h / (heads / kv_heads) (GQA/MQA).
#pragma once
#include <cstdint>

#include "format/attention_shape.h"

namespace nibble::cpu {

using nibble::AttentionShape;

// out: [batch*seq, heads*head_dim]; softmax_stats: [batch, heads, seq, 2].
//   S = scale Q K^T (causal);  P = softmax(S);  O = P V
// Work is split by (sequence, head), handed out dynamically, and each output is computed by the one
// thread that takes its task, in a fixed order, so any thread count and split gives the same bits; so
// do the scalar, AVX2, AVX-512 and AVX512-BF16 kernels (fused multiply-adds, or vdpbf16ps's exact
// products, in the same order; with s.bf16_matmuls the operands are rounded to BF16 with subnormals
// flushed, as vdpbf16ps reads them). exp is cpu::exp_f32 (its ISA's libmvec: one machine, one result).
void attention_forward(const AttentionShape& s, const float* qkv, float* out, float* softmax_stats);

// dqkv: [batch*seq, qkv_stride] overwritten with the gradients of q, k, v.
//   dP = dO V^T;  dS = P * (dP - rowsum(P * dP)) scale;  dQ = dS K;  dK = dS^T Q;  dV = P^T dO
// Split by (sequence, key/value head): the group's query heads add into dK and dV in a fixed order.
void attention_backward(const AttentionShape& s, const float* qkv, const float* softmax_stats, const float* dout,
                        float* dqkv);

// Incremental decoding with a KV cache (sampling): s.batch == 1 and s.seq == n new tokens at
// positions [past, past + n). Their keys and values (from qkv, after RoPE) are appended to the caches
// [capacity, kv_heads * head_dim] at rows [past, past + n); then each new query attends to the cached
// keys up to its own position. FP32 throughout (s.bf16_matmuls must be false), plain dot products in
// order; out: [n, heads * head_dim].
void attention_decode(const AttentionShape& s, int64_t past, const float* qkv, float* k_cache, float* v_cache,
                      float* out);

namespace attention_kernels {
// C[m][n] (+)= sum_k A[m * a_row + k * a_k] * B[k * ldb + n]: one FMA chain per output, from 0
// (accumulate = false) or from C, in k order (matmul_*: FP32 attention) or in pair order (pair_matmul_*:
// BF16 operands; for k = 0, 2, 4, ... the product at k + 1, then at k, a last odd k alone), the order
// of AVX512-BF16's vdpbf16ps, which pair_matmul_avx512bf16 runs. Exposed for the tests that compare
// the variants.
using Matmul = void (*)(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_row, int64_t a_k, const float* B,
                        int64_t ldb, float* C, int64_t ldc, bool accumulate);
void matmul_scalar(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t,
                   bool);
void matmul_avx2(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t,
                 bool);
void matmul_avx512(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t,
                   bool);
void pair_matmul_scalar(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t, float*,
                        int64_t, bool);
void pair_matmul_avx2(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t, float*,
                      int64_t, bool);
void pair_matmul_avx512(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t, float*,
                        int64_t, bool);
// A and B must hold BF16 values with no subnormals (round_to_bf16_flushed): vdpbf16ps reads only
// their upper 16 bits and flushes subnormals.
void pair_matmul_avx512bf16(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t,
                            float*, int64_t, bool);
// AVX512-BF16's product with B's pairs packed once for several calls (attention packs a head's K^T,
// V, V^T and K once for all its query blocks): pack_pairs_avx512bf16 writes Bp[kp][n] (rows ldbp
// apart) for kp < (K + 1) / 2 and n < N / 16 * 16, B's row K read as 0 when K is odd;
// pair_matmul_packed_avx512bf16 is pair_matmul_avx512bf16 reading those columns from Bp (packed for
// exactly K rows, or more when K is even) and the rest from B.
void pack_pairs_avx512bf16(int64_t K, int64_t N, const float* B, int64_t ldb, uint32_t* Bp, int64_t ldbp);
void pair_matmul_packed_avx512bf16(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_row, int64_t a_k,
                                   const uint32_t* Bp, int64_t ldbp, const float* B, int64_t ldb, float* C,
                                   int64_t ldc, bool accumulate);
Matmul active_matmul();       // from active_isa()
Matmul active_pair_matmul();  // from active_isa()

// dst[c * dst_stride + r] = src[r * src_stride + c] for r < rows, c < cols: a head's rows of qkv
// into the column layout the products read. A copy, so every variant gives the same bits; the
// vector one moves 8 x 8 blocks through registers instead of the scalar loop's strided stores.
using Transpose = void (*)(const float* src, int64_t src_stride, int64_t rows, int64_t cols, float* dst,
                           int64_t dst_stride);
void transpose_scalar(const float*, int64_t, int64_t, int64_t, float*, int64_t);
void transpose_avx2(const float*, int64_t, int64_t, int64_t, float*, int64_t);
Transpose active_transpose();  // from active_isa()
}  // namespace attention_kernels

}  // namespace nibble::cpu
