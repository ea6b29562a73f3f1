// A sum in a fixed order that vectorises: 16 interleaved partial sums (lane c % 16), folded in a
// fixed tree at the end. The same on any thread count and in every per-ISA copy (simd_clones.h),
// where one running sum is a chain of `width` dependent additions. kernels/cuda/layer_math.h's
// lane_sum16 is the same order on the GPU.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>

namespace nibble::cpu {

template <typename T, class Term>
inline T lane_sum(int64_t width, Term term) {
  T lanes[16] = {};
  int64_t c = 0;
  for (; c + 16 <= width; c += 16)
    for (int l = 0; l < 16; ++l) lanes[l] += term(c + l);
  for (int l = 0; c < width; ++c, ++l) lanes[l] += term(c);
  for (int half = 8; half >= 1; half /= 2)
    for (int l = 0; l < half; ++l) lanes[l] += lanes[l + half];
  return lanes[0];
}

// The largest term(c), c < width, from -infinity, in lane_sum's 16 lanes and fold. A maximum is
// exact and a NaN term never replaces a lane (std::max keeps its first argument unless it is less
// than the second), so this is the value of one running std::max over the terms, in a sixteenth of
// its dependent steps; only a zero maximum held with both signs could come out with the other sign.
template <typename T, class Term>
inline T lane_max(int64_t width, Term term) {
  T lanes[16];
  std::fill(lanes, lanes + 16, -std::numeric_limits<T>::infinity());
  int64_t c = 0;
  for (; c + 16 <= width; c += 16)
    for (int l = 0; l < 16; ++l) lanes[l] = std::max(lanes[l], term(c + l));
  for (int l = 0; c < width; ++c, ++l) lanes[l] = std::max(lanes[l], term(c));
  for (int half = 8; half >= 1; half /= 2)
    for (int l = 0; l < half; ++l) lanes[l] = std::max(lanes[l], lanes[l + half]);
  return lanes[0];
}

}  // namespace nibble::cpu
