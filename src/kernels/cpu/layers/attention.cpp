#include "kernels/cpu/layers/attention.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "common/error.h"
#include "format/codecs.h"
#include "kernels/cpu/common/cpu_features.h"
#include "kernels/cpu/common/lane_sum.h"
#include "kernels/cpu/common/simd_clones.h"
#include "kernels/cpu/gemm/gemm.h"
#include "kernels/cpu/gemm/gemm_kernels.h"
#include "kernels/cpu/layers/vector_math.h"

namespace nibble::cpu {

namespace attention_kernels {
Matmul active_matmul() {
  const Isa isa = active_isa();
  if (isa >= Isa::avx512) return &matmul_avx512;
  if (isa == Isa::avx2) return &matmul_avx2;
  return &matmul_scalar;
}
Matmul active_pair_matmul() {
  const Isa isa = active_isa();
  // vdpbf16ps where it beats two FMAs (gemm.h: bf16_pair_kernel); the same bits either way.
  if (bf16_pair_kernel() == Bf16PairKernel::dpbf16) return &pair_matmul_avx512bf16;
  if (isa >= Isa::avx512) return &pair_matmul_avx512;
  if (isa == Isa::avx2) return &pair_matmul_avx2;
  return &pair_matmul_scalar;
}
Transpose active_transpose() { return active_isa() >= Isa::avx2 ? &transpose_avx2 : &transpose_scalar; }
}  // namespace attention_kernels

namespace {

// Query rows per block: the block's scores (kQueryBlock x seq floats) stay in L1/L2 between the
// softmax and the products, and the masked part of the diagonal block stays small.
constexpr int64_t kQueryBlock = 16;
// On the AMX-BF16 tiles: one 32-row micro-tile of queries (dK and dV then sum one whole 32-k unit of
// them per call). The pair path's bits do not depend on the block: its pairs start at even queries.
constexpr int64_t kQueryBlockAmx = 32;
// Below this many multiply-adds a call runs on one thread (OpenMP start-up would dominate).
constexpr int64_t kMinParallelWork = int64_t{1} << 16;

// The element-wise loops around the products are cloned per ISA (simd_clones.h): the baseline
// x86-64 build runs them one float or four at a time, a visible share of a training step.
// Reductions stay in order, unvectorised.
#define NIBBLE_ELEMENTWISE NIBBLE_SIMD_CLONES

// A BF16 operand of the products: x rounded to BF16, a subnormal result flushed to a zero of its sign
// (vdpbf16ps reads BF16 subnormals as zero; every ISA's operands are flushed alike).
inline float round_to_bf16_flushed(float x) {
  const float r = round_to_bf16(x);
  return std::fabs(r) < std::numeric_limits<float>::min() ? std::copysign(0.0f, r) : r;
}

// out[i] = round_to_bf16_flushed(in[i]) for i < n.
NIBBLE_ELEMENTWISE void round_to_bf16_n(const float* __restrict in, int64_t n, float* __restrict out) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = round_to_bf16_flushed(in[i]);
}
NIBBLE_ELEMENTWISE void round_to_bf16_in_place(float* x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] = round_to_bf16_flushed(x[i]);
}

// rows [S][hd] of one head (stride apart) -> contiguous [S][hd], rounded when bf16.
// The rows are a head's slice of each token's row (strides of several KB), which the hardware
// prefetchers do not follow: the row kPrefetchRows ahead is requested while this one is copied.
constexpr int64_t kPrefetchRows = 4;

void gather_rows(const float* src, int64_t stride, int64_t S, int64_t hd, bool bf16, float* dst) {
  for (int64_t t = 0; t < S; ++t) {
    const float* in = src + t * stride;
    if (t + kPrefetchRows < S)
      for (int64_t i = 0; i < hd; i += 16) __builtin_prefetch(in + kPrefetchRows * stride + i);
    float* out = dst + t * hd;
    if (bf16)
      round_to_bf16_n(in, hd, out);
    else
      std::copy(in, in + hd, out);
  }
}
// rows [S][hd] of one head -> transposed [hd][S], rows `ld` apart, rounded when bf16.
void gather_columns(attention_kernels::Transpose transpose, const float* src, int64_t stride, int64_t S, int64_t hd,
                    int64_t ld, bool bf16, float* dst) {
  transpose(src, stride, S, hd, dst, ld);
  if (bf16)
    for (int64_t d = 0; d < hd; ++d) round_to_bf16_in_place(dst + d * ld, S);
}

// What forward and backward derive from the shape.
struct Dims {
  int64_t S, hd, stride, ow, group;
  // Row stride of the key-indexed buffers (K^T, V^T, P, dP): S rounded up to 16 floats, plus 16, so
  // that consecutive rows start in different L1 sets. With S a multiple of 1024 floats the rows sit
  // 4 KiB apart, all in one set, and the products that walk down a column (K^T's and V^T's rows per k;
  // dS^T and P^T for dK and dV) evict their own lines, and forward and backward slow down.
  int64_t ld;
  float scale;  // 1 / sqrt(head_dim)
  bool bf16;
  attention_kernels::Matmul matmul;
  attention_kernels::Transpose transpose;
  bool parallel;  // enough work to share between threads
  // BF16 products on the AMX-BF16 tiles (the tile unit's own summation order: these CPUs' attention
  // bits are their own, as their GEMMs' are); a head's K^T, V, V^T and K go to tile panels once.
  bool amx;
  int64_t query_block() const { return amx ? kQueryBlockAmx : kQueryBlock; }
  // The product runs on AVX512-BF16 (the kernel dispatch chose it): a head's K^T, V, V^T and K go to
  // pairs once (Operand).
  bool packed() const { return !amx && matmul == &attention_kernels::pair_matmul_avx512bf16; }
};

Dims dims_of(const AttentionShape& s) {
  NIBBLE_CHECK(s.kv_heads > 0 && s.heads % s.kv_heads == 0 && s.head_dim > 0 && s.seq > 0,
               "attention shape: positive sizes and heads a multiple of kv_heads");
  return {s.seq,
          s.head_dim,
          s.qkv_stride(),
          s.out_width(),
          s.heads / s.kv_heads,
          (s.seq + 15) / 16 * 16 + 16,
          1.0f / std::sqrt(static_cast<float>(s.head_dim)),
          s.bf16_matmuls,
          s.bf16_matmuls ? attention_kernels::active_pair_matmul() : attention_kernels::active_matmul(),
          attention_kernels::active_transpose(),
          s.batch * s.heads * s.seq * s.seq * s.head_dim >= kMinParallelWork,
          s.bf16_matmuls && amx_bf16_active()};
}

// A product's B operand: its floats (rows `ld` apart) and, with Dims::packed(), its BF16 pairs packed
// once for every query block of a head (rows pairs_ld apart), or with Dims::amx its tile panels over
// `panel_units` units of 32 rows; without them the kernel packs per call.
struct Operand {
  const float* values;
  int64_t ld;
  const uint32_t* pairs = nullptr;
  int64_t pairs_ld = 0;
  const uint8_t* panels = nullptr;
  int64_t panel_units = 0;
};

// B = [K][N] floats as an Operand: with Dims::packed() its pairs for the whole columns of 16 go to
// `store` (K a head's full extent: calls with fewer rows take a prefix, as pair_matmul_packed allows).
Operand operand(const Dims& d, int64_t K, int64_t N, const float* B, int64_t ldb, std::vector<uint32_t>& store) {
  if (d.amx) {
    store.resize(static_cast<size_t>(gemm_detail::bf16_panels_bytes(K, N) / 4 + 1));
    auto* panels = reinterpret_cast<uint8_t*>(store.data());
    gemm_detail::pack_bf16_b_panels(K, N, B, ldb, panels);
    return {B, ldb, nullptr, 0, panels, gemm_detail::bf16_units(K)};
  }
  if (!d.packed()) return {B, ldb};
  const int64_t n16 = N / 16 * 16;
  store.resize(static_cast<size_t>((K + 1) / 2 * n16 + 1));
  if (n16 > 0) attention_kernels::pack_pairs_avx512bf16(K, n16, B, ldb, store.data(), n16);
  return {B, ldb, store.data(), n16};
}

// C (+)= A B on the AMX-BF16 tiles, B's panels packed here unless the operand has them.
void multiply_amx(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_row, int64_t a_k, const Operand& B,
                  float* C, int64_t ldc, bool accumulate) {
  struct Buffers {
    std::vector<uint8_t> a, b;
    std::vector<float> acc = std::vector<float>(static_cast<size_t>(gemm_detail::kBf16Panel * gemm_detail::kBf16AccStride));
  };
  static thread_local Buffers w;  // grown once per thread
  w.a.resize(static_cast<size_t>(gemm_detail::bf16_panels_bytes(K, M)));
  const uint8_t* panels = B.panels;
  int64_t units = B.panel_units;
  if (!panels) {
    w.b.resize(static_cast<size_t>(gemm_detail::bf16_panels_bytes(K, N)));
    gemm_detail::pack_bf16_b_panels(K, N, B.values, B.ld, w.b.data());
    panels = w.b.data(), units = gemm_detail::bf16_units(K);
  }
  gemm_detail::bf16_product_amx(M, N, K, A, a_row, a_k, panels, units, C, ldc, accumulate, w.a.data(), w.acc.data());
}

// C (+)= A B through the ISA's product kernel (pair order for BF16 operands, k order in FP32).
void multiply(const Dims& d, int64_t M, int64_t N, int64_t K, const float* A, int64_t a_row, int64_t a_k,
              const Operand& B, float* C, int64_t ldc, bool accumulate) {
  if (d.amx && (a_k == 1 || a_row == 1))  // (every call below has one unit stride)
    multiply_amx(M, N, K, A, a_row, a_k, B, C, ldc, accumulate);
  else if (B.pairs)
    attention_kernels::pair_matmul_packed_avx512bf16(M, N, K, A, a_row, a_k, B.pairs, B.pairs_ld, B.values, B.ld, C,
                                                     ldc, accumulate);
  else
    d.matmul(M, N, K, A, a_row, a_k, B.values, B.ld, C, ldc, accumulate);
}

// Scores of query rows [i0, i0 + rows) against keys [0, i0 + rows): scale * q . k, rows `ld` apart
// (k_columns' rows too).
// Then, per row t, the probabilities p_j = exp(s_j - max) * (1 / sum) for j <= t and 0 after, with
// the row's (max, 1/sum) computed into new_stats (forward) or read from saved_stats (backward). One
// code path for both, so backward's probabilities are the forward's bits. p_operand (bf16
// products, else null) gets them rounded to BF16 in the same loop; it may be p itself when the
// unrounded values are not needed (forward).
NIBBLE_ELEMENTWISE void causal_probabilities(const Dims& d, const float* q_rows, const Operand& k_columns, int64_t i0,
                                             int64_t rows, const float* saved_stats, float* new_stats, float* p,
                                             float* p_operand) {
  const int64_t keys = i0 + rows, hd = d.hd, ld = d.ld;
  const float scale = d.scale;
  multiply(d, rows, keys, hd, q_rows + i0 * hd, hd, 1, k_columns, p, ld, false);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = i0 + r + 1;
    float* row = p + r * ld;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) row[j] *= scale;
    float maxv, inv_sum;
    if (new_stats) {
      // Scores are never -0 (each is scale times an FMA chain started from +0), so this is the
      // running maximum's value.
      maxv = lane_max<float>(n, [row](int64_t j) { return row[j]; });
    } else {
      maxv = saved_stats[(i0 + r) * 2];
    }
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) row[j] -= maxv;
    exp_f32(row, row, n);
    if (new_stats) {
      inv_sum = 1.0f / lane_sum<float>(n, [row](int64_t j) { return row[j]; });
      new_stats[(i0 + r) * 2] = maxv, new_stats[(i0 + r) * 2 + 1] = inv_sum;
    } else {
      inv_sum = saved_stats[(i0 + r) * 2 + 1];
    }
    std::fill(row + n, row + keys, 0.0f);
    if (!p_operand) {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) row[j] *= inv_sum;
      continue;
    }
    float* op = p_operand + r * ld;
    if (op == row) {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) row[j] = round_to_bf16_flushed(row[j] * inv_sum);
      continue;
    }
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {
      const float v = row[j] * inv_sum;
      row[j] = v;
      op[j] = round_to_bf16_flushed(v);
    }
    std::fill(op + n, op + keys, 0.0f);
  }
}

// dS = P (dP - pdp) scale for one query row of n keys, in place of dP, zero up to `keys`, with
// pdp = rowsum(P dP).
NIBBLE_ELEMENTWISE void softmax_backward_row(const float* __restrict prow, int64_t n, int64_t keys, float scale,
                                             bool bf16, float* __restrict row) {
  const float pdp = lane_sum<float>(n, [prow, row](int64_t j) { return prow[j] * row[j]; });
  if (bf16) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) row[j] = round_to_bf16_flushed(prow[j] * (row[j] - pdp) * scale);
  } else {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) row[j] = prow[j] * (row[j] - pdp) * scale;
  }
  std::fill(row + n, row + keys, 0.0f);
}

struct Scratch {
  std::vector<float> q, k_columns, k_rows, v_rows, v_columns, dout, p, p_operand, dp, dk, dv;
  std::vector<uint32_t> k_column_pairs, k_row_pairs, v_row_pairs, v_column_pairs;  // Dims::packed()
  void size(int64_t S, int64_t hd, int64_t ld, bool backward) {
    const auto n = static_cast<size_t>(S * hd), columns = static_cast<size_t>(hd * ld),
               blk = static_cast<size_t>(std::max(kQueryBlock, kQueryBlockAmx) * ld);
    q.resize(n), k_columns.resize(columns), v_rows.resize(n), p.resize(blk);
    if (backward)
      k_rows.resize(n), v_columns.resize(columns), dout.resize(n), p_operand.resize(blk), dp.resize(blk),
          dk.resize(n), dv.resize(n);
  }
};

Scratch& thread_scratch() {
  static thread_local Scratch s;  // grown once per thread, reused by every call
  return s;
}

}  // namespace

void attention_forward(const AttentionShape& s, const float* qkv, float* out, float* softmax_stats) {
  const Dims d = dims_of(s);
  const int64_t S = d.S, hd = d.hd, stride = d.stride, ow = d.ow, group = d.group, ld = d.ld;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if (d.parallel)
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      Scratch& w = thread_scratch();
      w.size(S, hd, ld, false);
      const float* base = qkv + b * S * stride;
      gather_rows(base + h * hd, stride, S, hd, d.bf16, w.q.data());
      gather_columns(d.transpose, base + (s.heads + h / group) * hd, stride, S, hd, ld, d.bf16, w.k_columns.data());
      gather_rows(base + (s.heads + s.kv_heads + h / group) * hd, stride, S, hd, d.bf16, w.v_rows.data());
      const Operand k_columns = operand(d, hd, S, w.k_columns.data(), ld, w.k_column_pairs);
      const Operand v_rows = operand(d, S, hd, w.v_rows.data(), hd, w.v_row_pairs);
      float* stats = softmax_stats + (b * s.heads + h) * S * 2;
      for (int64_t i0 = 0; i0 < S; i0 += d.query_block()) {
        const int64_t rows = std::min(d.query_block(), S - i0), keys = i0 + rows;
        // P (rounded in place for bf16 products: the forward needs no unrounded copy).
        causal_probabilities(d, w.q.data(), k_columns, i0, rows, nullptr, stats, w.p.data(),
                             d.bf16 ? w.p.data() : nullptr);
        // O[i0 : i0 + rows] = P V: every row runs over the block's keys (zeros past its diagonal).
        multiply(d, rows, hd, keys, w.p.data(), ld, 1, v_rows, out + (b * S + i0) * ow + h * hd, ow, false);
      }
    }
}

void attention_backward(const AttentionShape& s, const float* qkv, const float* softmax_stats, const float* dout,
                        float* dqkv) {
  const Dims d = dims_of(s);
  const int64_t S = d.S, hd = d.hd, stride = d.stride, ow = d.ow, group = d.group, ld = d.ld;
  const bool bf16 = d.bf16;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if (d.parallel)
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t g = 0; g < s.kv_heads; ++g) {
      Scratch& w = thread_scratch();
      w.size(S, hd, ld, true);
      const float* base = qkv + b * S * stride;
      float* dbase = dqkv + b * S * stride;
      const int64_t kcol = (s.heads + g) * hd, vcol = (s.heads + s.kv_heads + g) * hd;
      gather_rows(base + kcol, stride, S, hd, bf16, w.k_rows.data());
      d.transpose(w.k_rows.data(), hd, S, hd, w.k_columns.data(), ld);  // from the copy: qkv is read once
      gather_columns(d.transpose, base + vcol, stride, S, hd, ld, bf16, w.v_columns.data());
      const Operand k_columns = operand(d, hd, S, w.k_columns.data(), ld, w.k_column_pairs);
      const Operand v_columns = operand(d, hd, S, w.v_columns.data(), ld, w.v_column_pairs);
      const Operand k_rows = operand(d, S, hd, w.k_rows.data(), hd, w.k_row_pairs);
      // dK and dV gather in contiguous [S][hd] buffers (L2) and go to dqkv's strided rows at the end.
      std::fill(w.dk.begin(), w.dk.begin() + S * hd, 0.0f);
      std::fill(w.dv.begin(), w.dv.begin() + S * hd, 0.0f);
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        gather_rows(base + h * hd, stride, S, hd, bf16, w.q.data());
        gather_rows(dout + b * S * ow + h * hd, ow, S, hd, bf16, w.dout.data());
        const float* stats = softmax_stats + (b * s.heads + h) * S * 2;
        for (int64_t i0 = 0; i0 < S; i0 += d.query_block()) {
          const int64_t rows = std::min(d.query_block(), S - i0), keys = i0 + rows;
          causal_probabilities(d, w.q.data(), k_columns, i0, rows, stats, nullptr, w.p.data(),
                               bf16 ? w.p_operand.data() : nullptr);
          // dP = dO V^T for the block, then dS = P (dP - rowsum(P dP)) scale in place of dP.
          multiply(d, rows, keys, hd, w.dout.data() + i0 * hd, hd, 1, v_columns, w.dp.data(), ld, false);
          for (int64_t r = 0; r < rows; ++r)
            softmax_backward_row(w.p.data() + r * ld, i0 + r + 1, keys, d.scale, bf16, w.dp.data() + r * ld);
          const float* p = bf16 ? w.p_operand.data() : w.p.data();
          const float* ds = w.dp.data();
          // dQ[i0 : i0 + rows] = dS K;  dK[0 : keys] += dS^T Q[i0 : i0 + rows];  dV[0 : keys] += P^T dO.
          multiply(d, rows, hd, keys, ds, ld, 1, k_rows, dbase + i0 * stride + h * hd, stride, false);
          multiply(d, keys, hd, rows, ds, 1, ld, {w.q.data() + i0 * hd, hd}, w.dk.data(), hd, true);
          multiply(d, keys, hd, rows, p, 1, ld, {w.dout.data() + i0 * hd, hd}, w.dv.data(), hd, true);
        }
      }
      for (int64_t t = 0; t < S; ++t) {
        std::copy(w.dk.data() + t * hd, w.dk.data() + (t + 1) * hd, dbase + t * stride + kcol);
        std::copy(w.dv.data() + t * hd, w.dv.data() + (t + 1) * hd, dbase + t * stride + vcol);
      }
    }
}

}  // namespace nibble::cpu
