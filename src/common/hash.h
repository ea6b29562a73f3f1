// Plain integer hashing shared by every layer.
#pragma once
#include <cstdint>

namespace nibble {

// splitmix64's finaliser after one step of its Weyl sequence: consecutive inputs give unrelated
// outputs. Seeds of stochastic rounding (recipe/) and of the data order (data/) are made with it.
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace nibble
