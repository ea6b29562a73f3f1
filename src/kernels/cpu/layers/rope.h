// Rotary position embedding (RoPE), half-split convention: within each head, element i and
// element i + head_dim/2 form a pair rotated by angle pos * theta^(-2i/head_dim).
#pragma once
#include <cstdint>
#include <vector>

#include "format/source_amax.h"

namespace nibble::cpu {

template <typename T>
struct RopeTable {
  int64_t context = 0, head_dim = 0;
  std::vector<T> cos, sin;  // [context, head_dim/2], computed in double
  RopeTable(int64_t context, int64_t head_dim, double theta);
};

// x: [batch*seq, stride] with `heads` heads of head_dim starting at column `first_col`; token n sits
// at position first_position + n % seq (first_position > 0: tokens that continue a cached
// sequence). Rotates in place (forward); backward applies the inverse rotation to the gradient,
// because the rotation is orthogonal: dx = R^T dy.
template <typename T>
void rope_forward(T* x, int64_t tokens, int64_t seq, int64_t stride, int64_t first_col, int64_t heads,
                  const RopeTable<T>& table, int64_t first_position = 0);
template <typename T>
void rope_backward(T* dx, int64_t tokens, int64_t seq, int64_t stride, int64_t first_col, int64_t heads,
                   const RopeTable<T>& table, int64_t first_position = 0);
// rope_backward<float> of the query heads (from column query_first_col) and of the key heads (from
// key_first_col) of the same rows, with the SourceAmax of dx's whole rows gathered 16 rows at a time
// as they are rotated: dx [tokens, stride] is the qkv linear's dY, its value columns already written
// by attention's backward. stride % 16 == 0; with amax.rht, tokens % 16 == 0. dx is the two
// rope_backward calls' bits.
void rope_backward_gathering(float* dx, int64_t tokens, int64_t seq, int64_t stride, int64_t query_first_col,
                             int64_t query_heads, int64_t key_first_col, int64_t key_heads,
                             const RopeTable<float>& table, SourceAmax& amax);

}  // namespace nibble::cpu
