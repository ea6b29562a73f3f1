// Plain integer hashing shared by every layer.
#pragma once
#include <cstdint>

namespace nibble {

// Callable on the GPU too (the quantize kernels combine a device-resident SR step hash with a salt).
#if defined(__CUDACC__) || defined(NIBBLE_CUDA_MODEL)
#define NIBBLE_HASH_HD __host__ __device__
#else
#define NIBBLE_HASH_HD
#endif

// splitmix64's finaliser after one step of its Weyl sequence: consecutive inputs give unrelated
// outputs. Seeds of stochastic rounding (recipe/) and of the data order (data/) are made with it.
inline NIBBLE_HASH_HD uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A stochastic-rounding seed from its per-micro-step part and its per-quantization salt
// (recipe.h: sr_seed = sr_seed_of(sr_step_hash(run_seed, step), sr_salt(layer, linear, role, operand))).
inline NIBBLE_HASH_HD uint64_t sr_seed_of(uint64_t step_hash, uint64_t salt) { return mix64(step_hash ^ salt); }

}  // namespace nibble
