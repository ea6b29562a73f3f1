// The model layers' per-row and per-element arithmetic as __host__ __device__ functions, written in
// the CPU kernels' operation order (kernels/cpu/layers/{rmsnorm,rope,embedding,adamw}.cpp), so the CUDA
// kernels (layers.cu) that map threads onto these functions give the CPU's bits. test_cuda_backend
// runs these very functions on the host against the CPU kernels, so the port is checked in CI
// without a GPU; every FP32 operation goes through dm::nb_* (no FMA contraction on the device).
//
// The transcendental layers (SwiGLU, softmax, cross-entropy, attention) use the device's expf/logf,
// which are not the CPU's libmvec: those agree with the CPU within a bound, not bit for bit.
#pragma once
#include <cmath>
#include <cstdint>

#include "format/attention_shape.h"
#include "kernels/cuda/device_math.h"

namespace nibble::cuda::lm {

using dm::nb_add;
using dm::nb_add_d;
using dm::nb_div;
using dm::nb_fma;
using dm::nb_mul;
using dm::nb_mul_d;
using dm::nb_sqrt;
using dm::nb_sub;

NIBBLE_HD float nb_exp(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);  // <= 2 ulps (CUDA's documented bound); not glibc's, so not the CPU's bits
#else
  return std::exp(x);
#endif
}
NIBBLE_HD float nb_log(float x) {
#if defined(__CUDA_ARCH__)
  return logf(x);
#else
  return std::log(x);
#endif
}

// Sum of term(c) over c < width in 16 interleaved partial sums (lane c % 16), folded in a fixed tree:
// kernels/cpu/common/lane_sum.h (RMSNorm, cross-entropy, the attention row sums).
template <class Term>
NIBBLE_HD float lane_sum16(int64_t width, Term term) {
  float lanes[16] = {};
  int64_t c = 0;
  for (; c + 16 <= width; c += 16)
    for (int l = 0; l < 16; ++l) lanes[l] = nb_add(lanes[l], term(c + l));
  for (int l = 0; c < width; ++c, ++l) lanes[l] = nb_add(lanes[l], term(c));
  for (int half = 8; half >= 1; half /= 2)
    for (int l = 0; l < half; ++l) lanes[l] = nb_add(lanes[l], lanes[l + half]);
  return lanes[0];
}

// ---- RMSNorm ----------------------------------------------------------------------------------------
// One row: y = x * rstd * gain; returns rstd = 1 / sqrt(mean(x^2) + eps).
NIBBLE_HD float rmsnorm_row_forward(const float* x, const float* gain, int64_t width, float eps, float* y) {
  const float ss = lane_sum16(width, [x](int64_t c) { return nb_mul(x[c], x[c]); });
  const float r = nb_div(1.0f, nb_sqrt(nb_add(nb_div(ss, static_cast<float>(width)), eps)));
  for (int64_t c = 0; c < width; ++c) y[c] = nb_mul(nb_mul(x[c], r), gain[c]);
  return r;
}
// One row of dx += r (dy gain - x r mean(dy gain x r)).
NIBBLE_HD void rmsnorm_row_backward(const float* x, const float* gain, float r, const float* dy, int64_t width,
                                    float* dx) {
  const float dot =
      lane_sum16(width, [=](int64_t c) { return nb_mul(nb_mul(nb_mul(dy[c], gain[c]), x[c]), r); });
  const float mean_dot = nb_div(dot, static_cast<float>(width));
  for (int64_t c = 0; c < width; ++c)
    dx[c] = nb_add(dx[c], nb_mul(r, nb_sub(nb_mul(dy[c], gain[c]), nb_mul(nb_mul(x[c], r), mean_dot))));
}
// RMSNorm's gain gradient sums each column in token tiles (ops::kGainTileTokens): a tile's terms in
// token order from 0, then the tiles' sums in order, so a GPU sums the tiles side by side.
inline constexpr int64_t kGainTileTokens = 256;
// Column c's sum over rows [i0, i1), in row order, of dy x rstd.
NIBBLE_HD float rmsnorm_gain_tile(const float* x, const float* rstd, const float* dy, int64_t i0, int64_t i1,
                                  int64_t width, int64_t c) {
  float s = 0.0f;
  for (int64_t i = i0; i < i1; ++i) s = nb_add(s, nb_mul(nb_mul(dy[i * width + c], x[i * width + c]), rstd[i]));
  return s;
}
// One column of dgain += the tiles' sums in order.
NIBBLE_HD void rmsnorm_gain_column(const float* x, const float* rstd, const float* dy, int64_t n, int64_t width,
                                   int64_t c, float* dgain) {
  float s = 0.0f;
  for (int64_t i0 = 0; i0 < n; i0 += kGainTileTokens)
    s = nb_add(s, rmsnorm_gain_tile(x, rstd, dy, i0, i0 + kGainTileTokens < n ? i0 + kGainTileTokens : n, width, c));
  dgain[c] = nb_add(dgain[c], s);
}

// ---- RoPE ---------------------------------------------------------------------------------------------
// The pair (v[i], v[i + half]) rotated by the angle whose cos/sin are c, s (direction -1: inverse).
NIBBLE_HD void rope_pair(float* a_ptr, float* b_ptr, float c, float s, float direction) {
  const float a = *a_ptr, b = *b_ptr, si = nb_mul(direction, s);
  *a_ptr = nb_sub(nb_mul(a, c), nb_mul(b, si));
  *b_ptr = nb_add(nb_mul(a, si), nb_mul(b, c));
}
// cos/sin of position p, pair i: computed in double from theta, as kernels/cpu/layers/rope.cpp's table (on
// the host; the device reads the uploaded table).
inline void rope_angle(int64_t p, int64_t i, int64_t head_dim, double theta, float* c, float* s) {
  const double angle =
      static_cast<double>(p) * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
  *c = static_cast<float>(std::cos(angle));
  *s = static_cast<float>(std::sin(angle));
}

// ---- AdamW and the gradient norm -------------------------------------------------------------------
struct AdamWScalars {
  float clip, b1, b2, bias1, bias2, decay, lr, eps;
};
// kernels/cpu/layers/adamw.cpp's update of one element.
NIBBLE_HD void adamw_element(const AdamWScalars& k, float g_in, float* mp, float* vp, float* wp, uint8_t decay_flag) {
  const float g = nb_mul(g_in, k.clip);
  const float m = nb_add(nb_mul(k.b1, *mp), nb_mul(nb_sub(1.0f, k.b1), g));
  const float v = nb_add(nb_mul(k.b2, *vp), nb_mul(nb_mul(nb_sub(1.0f, k.b2), g), g));
  *mp = m;
  *vp = v;
  const float m_hat = nb_div(m, k.bias1), v_hat = nb_div(v, k.bias2);
  const float w = nb_sub(*wp, nb_mul(nb_mul(static_cast<float>(decay_flag), k.decay), *wp));
  *wp = nb_sub(w, nb_div(nb_mul(k.lr, m_hat), nb_add(nb_sqrt(v_hat), k.eps)));
}

inline constexpr int64_t kSumOfSquaresChunk = int64_t{1} << 14;
// The sum of squares of one chunk [begin, end) in eight interleaved double lanes folded in a fixed
// tree (kernels/cpu/layers/adamw.cpp's sum_of_squares); the chunks' sums are then added in order.
NIBBLE_HD double sum_of_squares_chunk(const float* g, int64_t begin, int64_t end) {
  double lanes[8] = {};
  int64_t i = begin;
  for (; i + 8 <= end; i += 8)
    for (int l = 0; l < 8; ++l) {
      const double x = static_cast<double>(g[i + l]);
      lanes[l] = nb_add_d(lanes[l], nb_mul_d(x, x));
    }
  for (; i < end; ++i) {
    const double x = static_cast<double>(g[i]);
    lanes[0] = nb_add_d(lanes[0], nb_mul_d(x, x));
  }
  return nb_add_d(nb_add_d(nb_add_d(lanes[0], lanes[1]), nb_add_d(lanes[2], lanes[3])),
                  nb_add_d(nb_add_d(lanes[4], lanes[5]), nb_add_d(lanes[6], lanes[7])));
}

// ---- 16x16-tile NVFP4 transpose ---------------------------------------------------------------------
// Byte i of the transposed codes ([cols, rows/2]): source column c, rows r and r + 1.
NIBBLE_HD uint8_t transposed_tile_code_byte(const uint8_t* codes, int64_t rows, int64_t cols, int64_t i) {
  const int64_t t_row_bytes = rows / 2, c = i / t_row_bytes, r = (i % t_row_bytes) * 2;
  const auto code = [&](int64_t row) {
    const uint8_t byte = codes[row * (cols / 2) + c / 2];
    return static_cast<uint8_t>((c % 2) ? byte >> 4 : byte & 0x0F);
  };
  return static_cast<uint8_t>(code(r) | (code(r + 1) << 4));
}
// Scale i of the transposed tensor ([cols, rows/16]): the tile's one scale.
NIBBLE_HD uint8_t transposed_tile_scale(const uint8_t* scales, int64_t rows, int64_t cols, int64_t i) {
  const int64_t c = i / (rows / 16), b = i % (rows / 16);
  return scales[(b * 16) * (cols / 16) + c / 16];
}

// ---- element-wise layers ------------------------------------------------------------------------------
// SwiGLU of element e of a [n, hidden]: a = g / (1 + exp(-g)) * u (kernels/cpu/layers/swiglu.cpp's order).
NIBBLE_HD float swiglu_element(const float* gate_up, int64_t hidden, int64_t e) {
  const int64_t i = e / hidden, c = e % hidden;
  const float g = gate_up[i * 2 * hidden + c], u = gate_up[i * 2 * hidden + hidden + c];
  return nb_mul(nb_div(g, nb_add(1.0f, nb_exp(-g))), u);
}
NIBBLE_HD void swiglu_backward_element(const float* gate_up, const float* da, int64_t hidden, int64_t e,
                                       float* dgate_up) {
  const int64_t i = e / hidden, c = e % hidden;
  const float g = gate_up[i * 2 * hidden + c], u = gate_up[i * 2 * hidden + hidden + c], d = da[e];
  const float sig = nb_div(1.0f, nb_add(1.0f, nb_exp(-g)));
  const float silu = nb_mul(g, sig);
  dgate_up[i * 2 * hidden + c] = nb_mul(nb_mul(nb_mul(d, u), sig), nb_add(1.0f, nb_mul(g, nb_sub(1.0f, sig))));
  dgate_up[i * 2 * hidden + hidden + c] = nb_mul(d, silu);
}
// Cross-entropy of one row (kernels/cpu/layers/cross_entropy.cpp's order, the sum in lane_sum16's order):
// log(sum exp(l - max)) + max - l[target].
NIBBLE_HD float cross_entropy_row(const float* l, int32_t target, int64_t vocab) {
  float m = l[0];
  for (int64_t v = 1; v < vocab; ++v) m = dm::max_f(m, l[v]);
  const float sum = lane_sum16(vocab, [=](int64_t v) { return nb_exp(nb_sub(l[v], m)); });
  return nb_sub(nb_add(nb_log(sum), m), l[target]);
}
// d = scale (softmax(l) - onehot(target)); d may alias l (each element is read before it is written).
NIBBLE_HD void cross_entropy_backward_row(const float* l, int32_t target, int64_t vocab, float scale, float* d) {
  float m = l[0];
  for (int64_t v = 1; v < vocab; ++v) m = dm::max_f(m, l[v]);
  for (int64_t v = 0; v < vocab; ++v) d[v] = nb_exp(nb_sub(l[v], m));
  const float inv = nb_div(1.0f, lane_sum16(vocab, [=](int64_t v) { return d[v]; }));
  for (int64_t v = 0; v < vocab; ++v) d[v] = nb_mul(nb_mul(d[v], inv), scale);
  d[target] = nb_sub(d[target], scale);
}

// ---- causal GQA attention ---------------------------------------------------------------------------
// qkv [batch*seq, (heads + 2 kv_heads) head_dim]: per token the query heads, then the key heads, then
// the value heads; query head h reads key/value head h / (heads / kv_heads). Products as FMA chains
// in the CPU kernels' orders: k order in FP32; with bf16_matmuls the operands (Q, K, V, P, dO, dS) are
// rounded to BF16 with subnormals flushed, and each sum runs in pair order (kernels/cpu/layers/
// attention.h: for even k the product at k + 1, then at k; pairs aligned to even indices from the
// start of the sum, products the CPU multiplies by a masked zero left out, which adds nothing).
NIBBLE_HD float attention_operand(float x, bool bf16) {
  if (!bf16) return x;
  const float r = dm::round_to_bf16(x);
  return fabsf(r) < 1.17549435e-38f ? copysignf(0.0f, r) : r;  // FLT_MIN: vdpbf16ps's flush
}
// f(k) for k in [begin, end) in the order of a sum over [0, end) or [begin, end): k order, or pair
// order over the pairs (2u, 2u + 1) that meet the range.
template <class F>
NIBBLE_HD void for_each_in_product_order(int64_t begin, int64_t end, bool pairs, F f) {
  if (!pairs) {
    for (int64_t k = begin; k < end; ++k) f(k);
    return;
  }
  for (int64_t k = begin - begin % 2; k < end; k += 2) {
    if (k + 1 < end) f(k + 1);
    if (k >= begin) f(k);
  }
}
NIBBLE_HD float attention_dot(const float* a, const float* b, int64_t hd, bool bf16) {
  float d = 0.0f;
  for_each_in_product_order(0, hd, bf16, [&](int64_t i) {
    d = nb_fma(attention_operand(a[i], bf16), attention_operand(b[i], bf16), d);
  });
  return d;
}
// P[t][j] from a row's saved (max, 1/sum) (forward computes the same expression).
NIBBLE_HD float attention_probability(float score, const float* stats) {
  return nb_mul(nb_exp(nb_sub(score, stats[0])), stats[1]);
}

// Forward of query row `row` = (b, h, t): its (max, 1/sum) into stats[2 row..], O_t = sum_j P_tj V_j.
NIBBLE_HD void attention_forward_row(const AttentionShape& s, const float* qkv, int64_t row, float scale, float* out,
                                     float* stats) {
  const int64_t S = s.seq, hd = s.head_dim, stride = s.qkv_stride(), ow = s.heads * hd;
  const int64_t b = row / (s.heads * S), h = (row / S) % s.heads, t = row % S;
  const float* base = qkv + b * S * stride;
  const float* q = base + t * stride + h * hd;
  const int64_t kcol = (s.heads + h / s.group()) * hd, vcol = (s.heads + s.kv_heads + h / s.group()) * hd;
  const auto score = [&](int64_t j) { return nb_mul(attention_dot(q, base + j * stride + kcol, hd, s.bf16_matmuls), scale); };
  float maxv = -INFINITY;
  for (int64_t j = 0; j <= t; ++j) maxv = dm::max_f(maxv, score(j));
  const float sum = lane_sum16(t + 1, [&](int64_t j) { return nb_exp(nb_sub(score(j), maxv)); });
  float* st = stats + row * 2;
  st[0] = maxv;
  st[1] = nb_div(1.0f, sum);
  float* o = out + (b * S + t) * ow + h * hd;
  for (int64_t i = 0; i < hd; ++i) o[i] = 0.0f;
  for_each_in_product_order(0, t + 1, s.bf16_matmuls, [&](int64_t j) {
    const float p = attention_operand(attention_probability(score(j), st), s.bf16_matmuls);
    const float* v = base + j * stride + vcol;
    for (int64_t i = 0; i < hd; ++i) o[i] = nb_fma(p, attention_operand(v[i], s.bf16_matmuls), o[i]);
  });
}

// Backward of query row `row` = (b, h, t): D_t = sum_j P_tj dP_tj into row_dot[row] (the key rows
// need it), and dQ_t = sum_j dS_tj K_j with dS_tj = P_tj (dP_tj - D_t) scale, dP_tj = dO_t . V_j.
NIBBLE_HD void attention_backward_query_row(const AttentionShape& s, const float* qkv, const float* stats,
                                            const float* dout, int64_t row, float scale, float* dqkv, float* row_dot) {
  const int64_t S = s.seq, hd = s.head_dim, stride = s.qkv_stride(), ow = s.heads * hd;
  const bool bf = s.bf16_matmuls;
  const int64_t b = row / (s.heads * S), h = (row / S) % s.heads, t = row % S;
  const float* base = qkv + b * S * stride;
  const float* q = base + t * stride + h * hd;
  const float* dO = dout + (b * S + t) * ow + h * hd;
  const int64_t kcol = (s.heads + h / s.group()) * hd, vcol = (s.heads + s.kv_heads + h / s.group()) * hd;
  const float* st = stats + row * 2;
  const auto p_of = [&](int64_t j) {
    return attention_probability(nb_mul(attention_dot(q, base + j * stride + kcol, hd, bf), scale), st);
  };
  const float d = lane_sum16(t + 1, [&](int64_t j) { return nb_mul(p_of(j), attention_dot(dO, base + j * stride + vcol, hd, bf)); });
  row_dot[row] = d;
  float* dq = dqkv + (b * S + t) * stride + h * hd;
  for (int64_t i = 0; i < hd; ++i) dq[i] = 0.0f;
  for_each_in_product_order(0, t + 1, bf, [&](int64_t j) {
    const float* k = base + j * stride + kcol;
    const float ds = attention_operand(
        nb_mul(nb_mul(p_of(j), nb_sub(attention_dot(dO, base + j * stride + vcol, hd, bf), d)), scale), bf);
    for (int64_t i = 0; i < hd; ++i) dq[i] = nb_fma(ds, attention_operand(k[i], bf), dq[i]);
  });
}

// Backward of key row `krow` = (b, g, j) of key/value head g: dK_j = sum_h sum_{t >= j} dS_tj Q_t and
// dV_j = sum_h sum_{t >= j} P_tj dO_t over the group's query heads, heads then rows in order (the CPU
// kernel's order). Needs every query row's row_dot first.
NIBBLE_HD void attention_backward_key_row(const AttentionShape& s, const float* qkv, const float* stats,
                                          const float* dout, const float* row_dot, int64_t krow, float scale,
                                          float* dqkv) {
  const int64_t S = s.seq, hd = s.head_dim, stride = s.qkv_stride(), ow = s.heads * hd, group = s.group();
  const bool bf = s.bf16_matmuls;
  const int64_t b = krow / (s.kv_heads * S), g = (krow / S) % s.kv_heads, j = krow % S;
  const float* base = qkv + b * S * stride;
  const int64_t kcol = (s.heads + g) * hd, vcol = (s.heads + s.kv_heads + g) * hd;
  const float* k = base + j * stride + kcol;
  const float* v = base + j * stride + vcol;
  float* dk = dqkv + (b * S + j) * stride + kcol;
  float* dv = dqkv + (b * S + j) * stride + vcol;
  for (int64_t i = 0; i < hd; ++i) dk[i] = dv[i] = 0.0f;
  for (int64_t h = g * group; h < (g + 1) * group; ++h)
    for_each_in_product_order(j, S, bf, [&](int64_t t) {
      const int64_t row = (b * s.heads + h) * S + t;
      const float* q = base + t * stride + h * hd;
      const float* dO = dout + (b * S + t) * ow + h * hd;
      const float p = attention_probability(nb_mul(attention_dot(q, k, hd, bf), scale), stats + row * 2);
      const float ds = attention_operand(nb_mul(nb_mul(p, nb_sub(attention_dot(dO, v, hd, bf), row_dot[row])), scale), bf);
      const float pb = attention_operand(p, bf);
      for (int64_t i = 0; i < hd; ++i) {
        dk[i] = nb_fma(ds, attention_operand(q[i], bf), dk[i]);
        dv[i] = nb_fma(pb, attention_operand(dO[i], bf), dv[i]);
      }
    });
}

// Decoding with a KV cache (s.batch == 1, s.seq new tokens at positions [past, past + seq)):
// element e of the appended keys and values, then the attention of (new token t, head h) = e over
// the cached keys up to its position (kernels/cpu/layers/attention_decode.cpp's loops and order).
NIBBLE_HD void kv_append_element(const AttentionShape& s, int64_t past, const float* qkv, int64_t e, float* k_cache,
                                 float* v_cache) {
  const int64_t kv_width = s.kv_heads * s.head_dim, t = e / kv_width, c = e % kv_width;
  const float* row = qkv + t * s.qkv_stride() + s.heads * s.head_dim;
  k_cache[(past + t) * kv_width + c] = row[c];
  v_cache[(past + t) * kv_width + c] = row[kv_width + c];
}
NIBBLE_HD void attention_decode_head(const AttentionShape& s, int64_t past, const float* qkv, const float* k_cache,
                                     const float* v_cache, int64_t e, float scale, float* out) {
  const int64_t H = s.heads, hd = s.head_dim, kv_width = s.kv_heads * hd;
  const int64_t t = e / H, h = e % H, g = h / s.group(), last = past + t;
  const float* q = qkv + t * s.qkv_stride() + h * hd;
  const auto score = [&](int64_t j) {
    float dot = 0.0f;
    for (int64_t i = 0; i < hd; ++i) dot = nb_add(dot, nb_mul(q[i], k_cache[j * kv_width + g * hd + i]));
    return nb_mul(dot, scale);
  };
  float maxv = -INFINITY;
  for (int64_t j = 0; j <= last; ++j) maxv = dm::max_f(maxv, score(j));
  float sum = 0.0f;
  for (int64_t j = 0; j <= last; ++j) sum = nb_add(sum, nb_exp(nb_sub(score(j), maxv)));
  float* o = out + t * H * hd + h * hd;
  for (int64_t i = 0; i < hd; ++i) o[i] = 0.0f;
  for (int64_t j = 0; j <= last; ++j) {
    const float p = nb_div(nb_exp(nb_sub(score(j), maxv)), sum);
    for (int64_t i = 0; i < hd; ++i) o[i] = nb_add(o[i], nb_mul(p, v_cache[j * kv_width + g * hd + i]));
  }
}

}  // namespace nibble::cuda::lm
