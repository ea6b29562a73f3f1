// A software model of the AVX-512 intrinsics gemm_avx512bf16.cpp and attention_avx512bf16.cpp use, for
// test_gemm_avx512bf16_emulated and test_attention_avx512bf16_emulated: the kernel sources are
// compiled against it on any x86-64 CPU.
// _mm512_dpbf16_ps follows the Intel SDM's pseudo-code for VDPBF16PS: per FP32 lane, the odd BF16
// pair's product is added first, then the even one's, each with round-to-nearest-even, BF16
// subnormal inputs read as zero (DAZ) and subnormal results flushed (FTZ).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

struct __m512 {
  float f[16];
};
struct __m512i {
  uint32_t u[16];
};
struct __m512bh {
  uint16_t h[32];
  __m512bh(const __m512i& x) { std::memcpy(h, x.u, sizeof h); }  // the kernel's (__m512bh) casts
  explicit operator __m512i() const {                              // and (__m512i) ones
    __m512i r;
    std::memcpy(r.u, h, sizeof h);
    return r;
  }
};

inline __m512 _mm512_setzero_ps() { return {}; }
inline __m512 _mm512_loadu_ps(const float* p) {
  __m512 r;
  std::memcpy(r.f, p, sizeof r.f);
  return r;
}
inline __m512i _mm512_loadu_si512(const void* p) {
  __m512i r;
  std::memcpy(r.u, p, sizeof r.u);
  return r;
}
inline __m512i _mm512_set1_epi32(int32_t v) {
  __m512i r;
  for (uint32_t& x : r.u) x = static_cast<uint32_t>(v);
  return r;
}
inline void _mm512_storeu_ps(float* p, __m512 v) { std::memcpy(p, v.f, sizeof v.f); }
// The integer moves the fused attention's pair packing (attention_avx512bf16.cpp) uses.
inline __m512i _mm512_setzero_si512() { return {}; }
inline void _mm512_storeu_si512(void* p, __m512i v) { std::memcpy(p, v.u, sizeof v.u); }
inline __m512i _mm512_srli_epi32(__m512i v, unsigned n) {
  for (uint32_t& x : v.u) x = n < 32 ? x >> n : 0;
  return v;
}
inline __m512i _mm512_and_si512(__m512i a, __m512i b) {
  for (int i = 0; i < 16; ++i) a.u[i] &= b.u[i];
  return a;
}
inline __m512i _mm512_or_si512(__m512i a, __m512i b) {
  for (int i = 0; i < 16; ++i) a.u[i] |= b.u[i];
  return a;
}

namespace emulated_bf16 {
inline float widen(uint16_t h) {
  if ((h & 0x7F80) == 0) h &= 0x8000;  // DAZ: a BF16 subnormal reads as a signed zero
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float flush(float f) { return std::fpclassify(f) == FP_SUBNORMAL ? std::copysign(0.0f, f) : f; }
}  // namespace emulated_bf16

// VCVTNE2PS2BF16: a's 16 floats become BF16 elements 16..31, b's elements 0..15, rounded to nearest
// even, subnormal inputs read as zero (a NaN stays a quiet NaN).
inline __m512bh _mm512_cvtne2ps_pbh(__m512 a, __m512 b) {
  const auto convert = [](float f) -> uint16_t {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7F800000u) == 0) return static_cast<uint16_t>((u >> 16) & 0x8000u);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
    return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  };
  __m512bh r(__m512i{});
  for (int i = 0; i < 16; ++i) r.h[i] = convert(b.f[i]), r.h[16 + i] = convert(a.f[i]);
  return r;
}

inline __m512 _mm512_dpbf16_ps(__m512 src, __m512bh a, __m512bh b) {
  using emulated_bf16::flush;
  using emulated_bf16::widen;
  for (int i = 0; i < 16; ++i) {
    float t = std::fma(widen(a.h[2 * i + 1]), widen(b.h[2 * i + 1]), src.f[i]);
    src.f[i] = flush(std::fma(widen(a.h[2 * i]), widen(b.h[2 * i]), flush(t)));
  }
  return src;
}
