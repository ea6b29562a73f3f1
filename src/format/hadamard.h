// The 16-point random Hadamard transform (RHT) of the NVFP4 wgrad recipe (spec section 4):
// each 16-element block x becomes x @ H with H = diag(s) * Sylvester16 / 4 and TE's fixed signs s.
// H is orthogonal (H H^T = I), so applying it to both GEMM operands along K leaves the product
// unchanged up to quantization while spreading outliers across the block.
#pragma once
#include <cstdint>
#include <span>

namespace nibble {

inline constexpr int kRhtSize = 16;
inline constexpr float kRhtSigns[kRhtSize] = {1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1};

// In place on one block of 16: v <- v @ H. The order of FP32 operations (sign, a 4-stage
// butterfly, then * 1/4, which is exact) is part of the reference: fast paths use the same one.
void rht16_forward(float* v);
// In place: v <- v @ H^T (the inverse).
void rht16_inverse(float* v);

// Row-wise transform of a row-major [rows, cols] tensor (cols % 16 == 0), optionally rounding the
// transformed values to BF16 as Transformer Engine does before amax and quantization.
void rht_rows(std::span<const float> x, int64_t rows, int64_t cols, std::span<float> out, bool round_bf16);
void rht_rows_inverse(std::span<float> x, int64_t rows, int64_t cols);

}  // namespace nibble
