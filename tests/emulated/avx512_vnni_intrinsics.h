// A software model of the AVX-512F/VNNI intrinsics gemm_avx512.cpp uses (its int8 kernel for NVFP4
// and MXFP4, its FP32 kernel for FP8 and MXFP8), lane by lane, for test_gemm_avx512_emulated.
// _mm512_dpbusd_epi32 follows the Intel SDM's VPDPBUSD: per 32-bit lane, four unsigned bytes of the
// first source times the four signed bytes of the second, added to the lane with wraparound (no
// saturation; that is VPDPBUSDS). _mm512_cvtepi32_ps rounds to nearest even, as a static_cast does.
#pragma once
#include <cstdint>
#include <cstring>

#include "avx512f_fma_intrinsics.h"  // __m512 and the five FP32 intrinsics the attention kernel uses

struct __m512i {
  int32_t i[16];
};
struct __m128 {
  float f[4];
};

inline __m512i _mm512_set1_epi32(int32_t v) {
  __m512i r;
  for (int32_t& x : r.i) x = v;
  return r;
}
inline __m512i _mm512_loadu_si512(const void* p) {
  __m512i r;
  std::memcpy(r.i, p, sizeof r.i);
  return r;
}
// The aligned forms: alignment is not modelled.
inline __m512 _mm512_load_ps(const float* p) { return _mm512_loadu_ps(p); }
inline void _mm512_store_ps(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline __m512i _mm512_load_si512(const void* p) { return _mm512_loadu_si512(p); }
// VMOVNTPS faults on an address that is not 64-byte aligned: so does the model.
inline void _mm512_stream_ps(float* p, __m512 v) {
  if ((reinterpret_cast<uintptr_t>(p) & 63) != 0) __builtin_trap();
  _mm512_storeu_ps(p, v);
}
inline __m512i _mm512_dpbusd_epi32(__m512i src, __m512i a, __m512i b) {
  uint8_t ua[64], sb_bytes[64];
  std::memcpy(ua, a.i, 64);
  std::memcpy(sb_bytes, b.i, 64);
  for (int lane = 0; lane < 16; ++lane) {
    uint32_t sum = static_cast<uint32_t>(src.i[lane]);
    for (int j = 0; j < 4; ++j)
      sum += static_cast<uint32_t>(static_cast<int32_t>(ua[4 * lane + j]) * static_cast<int8_t>(sb_bytes[4 * lane + j]));
    src.i[lane] = static_cast<int32_t>(sum);
  }
  return src;
}
inline __m512 _mm512_cvtepi32_ps(__m512i x) {
  __m512 r;
  for (int i = 0; i < 16; ++i) r.f[i] = static_cast<float>(x.i[i]);
  return r;
}
inline __m512 _mm512_mul_ps(__m512 a, __m512 b) {
  for (int i = 0; i < 16; ++i) a.f[i] *= b.f[i];
  return a;
}

inline __m128 _mm_loadu_ps(const float* p) {
  __m128 r;
  std::memcpy(r.f, p, sizeof r.f);
  return r;
}
inline void _mm_store_ps(float* p, __m128 v) { std::memcpy(p, v.f, sizeof v.f); }
inline __m128 _mm_set1_ps(float x) { return {{x, x, x, x}}; }
inline __m128 _mm_mul_ps(__m128 a, __m128 b) {
  for (int i = 0; i < 4; ++i) a.f[i] *= b.f[i];
  return a;
}
