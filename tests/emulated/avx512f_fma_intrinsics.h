// A software model of the five AVX-512F intrinsics the fused attention's product kernel uses
// (src/kernels/cpu/layers/attention_avx512.cpp), lane by lane, so that kernel's tiling and tails are tested on
// CPUs without AVX-512 too. _mm512_fmadd_ps is one rounding per lane, as std::fma.
#pragma once
#include <cmath>
#include <cstring>

struct __m512 {
  float f[16];
};

inline __m512 _mm512_setzero_ps() { return {}; }
inline __m512 _mm512_set1_ps(float x) {
  __m512 r;
  for (float& v : r.f) v = x;
  return r;
}
inline __m512 _mm512_loadu_ps(const float* p) {
  __m512 r;
  std::memcpy(r.f, p, sizeof r.f);
  return r;
}
inline void _mm512_storeu_ps(float* p, __m512 v) { std::memcpy(p, v.f, sizeof v.f); }
inline __m512 _mm512_fmadd_ps(__m512 a, __m512 b, __m512 c) {
  for (int i = 0; i < 16; ++i) c.f[i] = std::fma(a.f[i], b.f[i], c.f[i]);
  return c;
}
