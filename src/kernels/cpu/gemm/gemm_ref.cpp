// nibble::ref::gemm: the spec in code. Every block product is formed exactly (in FP64, where
// products of E2M1/E4M3/E5M2 values are exact and a block's sum is exact or nearly so), multiplied
// by both block scales, summed in FP64 and multiplied by the global decode scales at the end (a
// row-scaled operand's of the output's row or column).
#include <cmath>
#include <vector>

#include "format/codecs.h"
#include "kernels/cpu/gemm/gemm.h"
#include "kernels/cpu/gemm/gemm_kernels.h"

namespace nibble::ref {
namespace {

double element_value(const QuantizedTensor& q, int64_t row, int64_t k) {
  switch (q.format) {
    case Format::nvfp4:
    case Format::mxfp4: {
      uint8_t byte = q.codes[static_cast<size_t>(row * (q.cols / 2) + k / 2)];
      return e2m1_decode(k % 2 == 0 ? unpack_e2m1_lo(byte) : unpack_e2m1_hi(byte));
    }
    case Format::mxfp8:
    case Format::fp8_e4m3: return e4m3_decode(q.codes[static_cast<size_t>(row * q.cols + k)]);
    case Format::fp8_e5m2: return e5m2_decode(q.codes[static_cast<size_t>(row * q.cols + k)]);
  }
  return NAN;
}

double block_scale(const QuantizedTensor& q, int64_t row, int64_t block) {
  if (q.block == BlockShape::per_tensor) return 1.0;
  uint8_t s = q.scales[static_cast<size_t>(row * (q.cols / q.block_len()) + block)];
  if (q.format == Format::nvfp4) return e4m3_decode(s);
  return s == 0xFF ? NAN : std::ldexp(1.0, static_cast<int>(s) - 127);  // E8M0, exact in FP64
}

}  // namespace

void gemm(const QuantizedTensor& a, const QuantizedTensor& b, double* c, int64_t ldc) {
  cpu::gemm_detail::validate_operands(a, b, c, ldc);
  const int64_t M = a.rows, N = b.rows, K = a.cols;
  const int64_t block_len = K == 0 ? 1 : a.block_len(), blocks = K == 0 ? 0 : K / block_len;
  // Decode each operand once: element values and block scales in FP64.
  auto decode = [&](const QuantizedTensor& q, std::vector<double>& values, std::vector<double>& scales) {
    values.resize(static_cast<size_t>(q.rows * K));
    scales.resize(static_cast<size_t>(q.rows * blocks));
    for (int64_t r = 0; r < q.rows; ++r) {
      for (int64_t k = 0; k < K; ++k) values[r * K + k] = element_value(q, r, k);
      for (int64_t bl = 0; bl < blocks; ++bl) scales[r * blocks + bl] = block_scale(q, r, bl);
    }
  };
  std::vector<double> av, as, bv, bs;
  decode(a, av, as);
  decode(b, bv, bs);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      // Per tensor, or per row of a row-scaled operand (A's row m, B's row n).
      const double global = static_cast<double>(a.decode_scale_of_row(m)) * b.decode_scale_of_row(n);
      double sum = 0.0;
      for (int64_t bl = 0; bl < blocks; ++bl) {
        const double* x = &av[m * K + bl * block_len];
        const double* y = &bv[n * K + bl * block_len];
        double block_product = 0.0;
        for (int64_t k = 0; k < block_len; ++k) block_product += x[k] * y[k];
        sum += block_product * (as[m * blocks + bl] * bs[n * blocks + bl]);
      }
      c[m * ldc + n] = sum * global;
    }
  }
}

}  // namespace nibble::ref
