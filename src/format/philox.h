// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// counter-based generator, so the random bits of element i depend only on (seed, offset + i),
// never on thread count or visiting order. Same constants as cuRAND / Random123.
#pragma once
#include <array>
#include <cstdint>

namespace nibble {

inline std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kM0) * ctr[0];
    uint64_t p1 = static_cast<uint64_t>(kM1) * ctr[2];
    ctr = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0], static_cast<uint32_t>(p1),
           static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1], static_cast<uint32_t>(p0)};
    key[0] += kW0;
    key[1] += kW1;
  }
  return ctr;
}

// Stochastic rounding's random bits (docs/nvfp4-spec.md section 4): 8 per element, as the hardware
// uses. Stream position p (= QuantOptions::offset + the element's flat index, mod 2^64) takes byte
// p & 15 of the 16-byte Philox4x32-10 output for counter p >> 4 (counter words {low, high, 0, 0},
// key {seed low, seed high}). The bytes of one output are its four words in order, each
// little-endian: byte b is (word[b / 4] >> (8 * (b % 4))) & 0xFF. So one Philox call serves 16
// consecutive positions, and an element's byte depends only on (seed, offset + index), never on how
// the work is split: a 16-element block starting at a position that is not a multiple of 16 simply
// reads the tail of one output and the head of the next.
inline uint8_t philox_byte(uint64_t seed, uint64_t position) {
  const uint64_t counter = position >> 4;
  const auto r = philox4x32_10({static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0u, 0u},
                               {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  const unsigned b = static_cast<unsigned>(position & 15);
  return static_cast<uint8_t>(r[b >> 2] >> (8 * (b & 3)));
}

// The rounding threshold of a random byte r: u = (r + 0.5) / 256, exact in FP32. SR rounds up iff
// u < frac (the fractional distance to the lower grid point), so P(up) = ceil(256 frac - 0.5) / 256,
// which is within 1/512 of frac: the rounding is unbiased to 1/512 of a grid step. (u = r / 256 would
// only guarantee 1/256, always upwards.)
inline float sr_threshold(uint8_t r) { return (static_cast<float>(r) + 0.5f) * 0x1.0p-8f; }

}  // namespace nibble
