// Fused attention's product for BF16 operands on AVX512-BF16: vdpbf16ps adds, per FP32 lane, the
// product of a pair's odd elements (k + 1), then of its even ones (k), each rounded once (Intel SDM's
// pseudo-code; test_attention checks the CPU's instruction against it). A product of two BF16 values
// is exact in FP32, so each step is the FMA kernels' fma(a, b, c): this is attention_matmul.inc's
// pair order, the same bits as every other ISA, at twice the multiply-adds per instruction. The
// instruction reads BF16 subnormals as zero and flushes subnormal sums: attention's BF16 operands
// are rounded with their subnormals flushed on every ISA (round_to_bf16_flushed), and sums below
// FP32's normal range (2^-126) are the one place where the kernels may differ.
//
// The operands go to pair layouts: B's rows k and k + 1 interleaved (16 pairs a vector, [K/2][N
// rounded down to 16]; per call, or once for many calls: pair_matmul_packed_avx512bf16) and A's
// (m, k), (m, k + 1) as one 32-bit broadcast ([M][K/2] from A's rows, or [K/2][M] when A is read down
// its columns); the columns past the last whole vector run as std::fma in pair order. Tiles of 4 rows
// x 4 vectors.
#ifdef NIBBLE_EMULATED_INTRINSICS
// tests/emulated/: a software model of the intrinsics below (avx512bf16_intrinsics.h), so this file's
// packing and tiling are tested on CPUs without AVX512-BF16 too.
#include NIBBLE_EMULATED_INTRINSICS
#else
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

namespace nibble::cpu::attention_kernels {
namespace {

#include "kernels/cpu/layers/attention_dot.inc"

constexpr int64_t kWidth = 16, kRows = 4, kVectors = 4;

// A grown-only scratch array per thread (plain malloc: no std:: templates in an ISA file, see
// architecture.md).
struct PairBuffer {
  uint32_t* data = nullptr;
  size_t capacity = 0;
  ~PairBuffer() { std::free(data); }
  uint32_t* reserve(size_t n) {
    if (n > capacity) {
      std::free(data);
      capacity = 0;
      data = static_cast<uint32_t*>(std::malloc(n * sizeof(uint32_t)));
      if (!data) throw std::bad_alloc();
      capacity = n;
    }
    return data;
  }
};
thread_local PairBuffer a_pairs, b_pairs;

// The BF16 pair (k in the low half, k + 1 in the high half) of two BF16-valued floats.
inline uint32_t pair_of(float even, float odd) {
  uint32_t lo, hi;
  std::memcpy(&lo, &even, 4);
  std::memcpy(&hi, &odd, 4);
  return (lo >> 16) | (hi & 0xFFFF0000u);
}

// Xp[kp][n] (rows ldxp apart) = pair_of(X[2 kp][n], X[2 kp + 1][n]) for n < n16, X[K][n] read as 0
// when K is odd (B's pairs, and A's when A is read down its columns); columns in [n16, n_all) one at
// a time.
void pack_row_pairs(int64_t K, int64_t n16, int64_t n_all, const float* X, int64_t ldx, uint32_t* xp, int64_t ldxp) {
  const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t k = 0; k < K; k += 2) {
    const float* even = X + k * ldx;
    const float* odd = k + 1 < K ? X + (k + 1) * ldx : nullptr;
    uint32_t* out = xp + (k / 2) * ldxp;
    for (int64_t n = 0; n < n16; n += kWidth) {
      const __m512i lo = _mm512_srli_epi32(_mm512_loadu_si512(even + n), 16);
      const __m512i hi = odd ? _mm512_and_si512(_mm512_loadu_si512(odd + n), high_half) : _mm512_setzero_si512();
      _mm512_storeu_si512(out + n, _mm512_or_si512(lo, hi));
    }
    for (int64_t n = n16; n < n_all; ++n) out[n] = pair_of(even[n], odd ? odd[n] : 0.0f);
  }
}

// Ap[m][kp] = pair_of(A[m][2 kp], A[m][2 kp + 1]) for A's rows of K consecutive floats: 32 floats
// become 16 pairs in one vcvtne2ps2bf16 (exact: the values are BF16 without subnormals).
void pack_column_pairs(int64_t M, int64_t K, const float* A, int64_t a_row, uint32_t* ap) {
  const int64_t K2 = (K + 1) / 2, k32 = K / 32 * 32;
  for (int64_t m = 0; m < M; ++m) {
    const float* row = A + m * a_row;
    uint32_t* out = ap + m * K2;
    for (int64_t k = 0; k < k32; k += 32)
      _mm512_storeu_si512(out + k / 2, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(row + k + 16), _mm512_loadu_ps(row + k)));
    for (int64_t k = k32; k < K; k += 2) out[k / 2] = pair_of(row[k], k + 1 < K ? row[k + 1] : 0.0f);
  }
}

// The tile's A pair of row r and pair kp is ap[r * ap_row + kp * ap_pair].
template <int64_t Rows, int64_t Vectors>
inline void pair_tile(int64_t K2, const uint32_t* ap, int64_t ap_row, int64_t ap_pair, const uint32_t* bp, int64_t ldbp,
                      float* C, int64_t ldc, bool accumulate) {
  __m512 c[Rows][Vectors];
#pragma GCC unroll 16
  for (int64_t r = 0; r < Rows; ++r)
#pragma GCC unroll 16
    for (int64_t v = 0; v < Vectors; ++v) c[r][v] = accumulate ? _mm512_loadu_ps(C + r * ldc + v * kWidth) : _mm512_setzero_ps();
  for (int64_t kp = 0; kp < K2; ++kp) {
    __m512i b[Vectors];
#pragma GCC unroll 16
    for (int64_t v = 0; v < Vectors; ++v) b[v] = _mm512_loadu_si512(bp + kp * ldbp + v * kWidth);
#pragma GCC unroll 16
    for (int64_t r = 0; r < Rows; ++r) {
      const __m512i a = _mm512_set1_epi32(static_cast<int>(ap[r * ap_row + kp * ap_pair]));
#pragma GCC unroll 16
      for (int64_t v = 0; v < Vectors; ++v) c[r][v] = _mm512_dpbf16_ps(c[r][v], (__m512bh)a, (__m512bh)b[v]);
    }
  }
#pragma GCC unroll 16
  for (int64_t r = 0; r < Rows; ++r)
#pragma GCC unroll 16
    for (int64_t v = 0; v < Vectors; ++v) _mm512_storeu_ps(C + r * ldc + v * kWidth, c[r][v]);
}

template <int64_t Vectors>
void pair_strip(int64_t M, int64_t K2, const uint32_t* ap, int64_t ap_row, int64_t ap_pair, const uint32_t* bp,
                int64_t ldbp, float* C, int64_t ldc, bool accumulate) {
  int64_t m = 0;
  for (; m + kRows <= M; m += kRows)
    pair_tile<kRows, Vectors>(K2, ap + m * ap_row, ap_row, ap_pair, bp, ldbp, C + m * ldc, ldc, accumulate);
  for (; m < M; ++m) pair_tile<1, Vectors>(K2, ap + m * ap_row, ap_row, ap_pair, bp, ldbp, C + m * ldc, ldc, accumulate);
}

// The product with B's pairs for the columns below N / 16 * 16 in bp (rows ldbp apart) and B's
// floats for the rest; A's pairs packed here.
void pair_product(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_row, int64_t a_k, const uint32_t* bp,
                  int64_t ldbp, const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  const int64_t K2 = (K + 1) / 2, n16 = N / kWidth * kWidth;
  if (n16 > 0 && K > 0) {
    uint32_t* ap = a_pairs.reserve(static_cast<size_t>(M * K2));
    // A's pairs where its pairs lie: along its rows ([m][kp]) or, read down its columns, as B's ([kp][m]).
    int64_t ap_row = K2, ap_pair = 1;
    if (a_k == 1) {
      pack_column_pairs(M, K, A, a_row, ap);
    } else if (a_row == 1) {
      pack_row_pairs(K, M / kWidth * kWidth, M, A, a_k, ap, M);
      ap_row = 1, ap_pair = M;
    } else {
      for (int64_t m = 0; m < M; ++m)
        for (int64_t k = 0; k < K; k += 2)
          ap[m * K2 + k / 2] = pair_of(A[m * a_row + k * a_k], k + 1 < K ? A[m * a_row + (k + 1) * a_k] : 0.0f);
    }
    int64_t n = 0;
    for (; n + kVectors * kWidth <= n16; n += kVectors * kWidth)
      pair_strip<kVectors>(M, K2, ap, ap_row, ap_pair, bp + n, ldbp, C + n, ldc, accumulate);
    for (; n < n16; n += kWidth) pair_strip<1>(M, K2, ap, ap_row, ap_pair, bp + n, ldbp, C + n, ldc, accumulate);
  } else if (K == 0 && !accumulate) {
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < n16; ++n) C[m * ldc + n] = 0.0f;
  }
  // The columns past the last whole vector: the other kernels' scalar tail.
  for (int64_t n = n16; n < N; ++n)
    for (int64_t m = 0; m < M; ++m)
      C[m * ldc + n] = attention_dot<Order::pairs>(K, A + m * a_row, a_k, B + n, ldb, accumulate ? C[m * ldc + n] : 0.0f);
}

}  // namespace

void pair_matmul_avx512bf16(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_row, int64_t a_k,
                            const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  const int64_t n16 = N / kWidth * kWidth;
  uint32_t* bp = b_pairs.reserve(static_cast<size_t>((K + 1) / 2 * n16 + 1));
  pack_row_pairs(K, n16, n16, B, ldb, bp, n16);
  pair_product(M, N, K, A, a_row, a_k, bp, n16, B, ldb, C, ldc, accumulate);
}

void pack_pairs_avx512bf16(int64_t K, int64_t N, const float* B, int64_t ldb, uint32_t* bp, int64_t ldbp) {
  pack_row_pairs(K, N / kWidth * kWidth, N / kWidth * kWidth, B, ldb, bp, ldbp);
}

void pair_matmul_packed_avx512bf16(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_row, int64_t a_k,
                                   const uint32_t* bp, int64_t ldbp, const float* B, int64_t ldb, float* C,
                                   int64_t ldc, bool accumulate) {
  pair_product(M, N, K, A, a_row, a_k, bp, ldbp, B, ldb, C, ldc, accumulate);
}

}  // namespace nibble::cpu::attention_kernels
