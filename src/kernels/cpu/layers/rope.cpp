#include "kernels/cpu/common/parallel.h"
#include "kernels/cpu/common/simd_clones.h"
#include "kernels/cpu/layers/rope.h"
#include "kernels/cpu/quantize/gather_stripes.h"

#include <cmath>

#include "common/error.h"

namespace nibble::cpu {

template <typename T>
RopeTable<T>::RopeTable(int64_t context_, int64_t head_dim_, double theta) : context(context_), head_dim(head_dim_) {
  NIBBLE_CHECK(head_dim % 2 == 0, "RoPE: an even head_dim");
  const int64_t half = head_dim / 2;
  cos.resize(static_cast<size_t>(context * half));
  sin.resize(cos.size());
  for (int64_t p = 0; p < context; ++p)
    for (int64_t i = 0; i < half; ++i) {
      double angle = static_cast<double>(p) * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
      cos[p * half + i] = static_cast<T>(std::cos(angle));
      sin[p * half + i] = static_cast<T>(std::sin(angle));
    }
}

namespace {
// The heads of one token (simd_clones.h: per-ISA copies).
template <typename T>
NIBBLE_SIMD_CLONES void rotate_token(T* __restrict row, int64_t heads, int64_t hd, const T* __restrict c,
                                     const T* __restrict s, T direction) {
  const int64_t half = hd / 2;
  for (int64_t h = 0; h < heads; ++h) {
    T* v = row + h * hd;
    // v[i] and v[i + half] never meet across iterations, which the compiler cannot see through one
    // pointer (it left the loop scalar).
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const T a = v[i], b = v[i + half], si = direction * s[i];
      v[i] = a * c[i] - b * si;
      v[i + half] = a * si + b * c[i];
    }
  }
}

// `heads` heads from column first_col of a row at position `pos`.
template <typename T>
void rotate_at(T* row, int64_t pos, int64_t first_col, int64_t heads, const RopeTable<T>& t, T direction) {
  const int64_t half = t.head_dim / 2;
  rotate_token(row + first_col, heads, t.head_dim, t.cos.data() + pos * half, t.sin.data() + pos * half, direction);
}

template <typename T>
void check_positions(const RopeTable<T>& t, int64_t seq, int64_t first_position) {
  NIBBLE_CHECK(first_position >= 0 && first_position + seq <= t.context, "RoPE: positions inside the table's context");
}

template <typename T>
void rotate(T* x, int64_t tokens, int64_t seq, int64_t stride, int64_t first_col, int64_t heads,
            const RopeTable<T>& t, T direction, int64_t first_position) {
  check_positions(t, seq, first_position);
#pragma omp parallel for schedule(dynamic, dynamic_chunk(tokens)) if (tokens * heads * t.head_dim >= kMinParallelWork)
  for (int64_t n = 0; n < tokens; ++n) rotate_at(x + n * stride, first_position + n % seq, first_col, heads, t, direction);
}
}  // namespace

template <typename T>
void rope_forward(T* x, int64_t tokens, int64_t seq, int64_t stride, int64_t first_col, int64_t heads,
                  const RopeTable<T>& table, int64_t first_position) {
  rotate(x, tokens, seq, stride, first_col, heads, table, T(1), first_position);
}

template <typename T>
void rope_backward(T* dx, int64_t tokens, int64_t seq, int64_t stride, int64_t first_col, int64_t heads,
                   const RopeTable<T>& table, int64_t first_position) {
  rotate(dx, tokens, seq, stride, first_col, heads, table, T(-1), first_position);
}

void rope_backward_gathering(float* dx, int64_t tokens, int64_t seq, int64_t stride, int64_t query_first_col,
                             int64_t query_heads, int64_t key_first_col, int64_t key_heads,
                             const RopeTable<float>& table, SourceAmax& amax) {
  check_positions(table, seq, 0);
  for_stripes_gathering(tokens, stride, amax, [&](int64_t r0, int64_t r1) {
    for (int64_t n = r0; n < r1; ++n) {
      rotate_at(dx + n * stride, n % seq, query_first_col, query_heads, table, -1.0f);
      rotate_at(dx + n * stride, n % seq, key_first_col, key_heads, table, -1.0f);
    }
    return dx;
  });
}

template struct RopeTable<float>;
template struct RopeTable<double>;
template void rope_forward<float>(float*, int64_t, int64_t, int64_t, int64_t, int64_t, const RopeTable<float>&, int64_t);
template void rope_forward<double>(double*, int64_t, int64_t, int64_t, int64_t, int64_t, const RopeTable<double>&, int64_t);
template void rope_backward<float>(float*, int64_t, int64_t, int64_t, int64_t, int64_t, const RopeTable<float>&, int64_t);
template void rope_backward<double>(double*, int64_t, int64_t, int64_t, int64_t, int64_t, const RopeTable<double>&, int64_t);

}  // namespace nibble::cpu
