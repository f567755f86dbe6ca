// The dropout mask as a pure function of (seed, element index): a counter-based hash (splitmix64), so the
// CPU and CUDA backends drop the same elements and backward needs no saved mask.
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#define SOLTRAIN_HOST_DEVICE __host__ __device__
#else
#define SOLTRAIN_HOST_DEVICE
#endif

namespace soltrain {

SOLTRAIN_HOST_DEVICE inline bool dropout_keep(uint64_t seed, uint64_t i, float p) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  // 24 random bits → a uniform float in [0, 1) that is exact in fp32 on both backends.
  return float(z >> 40) * (1.0f / 16777216.0f) >= p;
}

// The seed that makes element i of a slice draw what element offset + i of the whole tensor draws under
// `seed` (the hash reads seed + (i + 1)·step): a tensor processed in tiles keeps the untiled mask.
SOLTRAIN_HOST_DEVICE inline uint64_t dropout_seed_at(uint64_t seed, uint64_t offset) {
  return seed + offset * 0x9E3779B97F4A7C15ull;
}

}  // namespace soltrain
