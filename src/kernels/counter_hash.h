// A counter-based hash (splitmix64's finaliser) of (seed, element index): random bits that are a pure function of
// where an element is, so the CPU and CUDA backends draw the same ones, and a tensor processed in tiles or pieces
// draws what the whole draws (the index only adds to the seed: counter_seed_at moves a slice's seed to its offset).
// Dropout's masks (kernels/dropout_mask.h) and stochastic rounding (kernels/stochastic_round.h) draw from it.
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#define SOLTRAIN_HOST_DEVICE __host__ __device__
#else
#define SOLTRAIN_HOST_DEVICE
#endif

namespace soltrain {

SOLTRAIN_HOST_DEVICE inline uint64_t counter_hash(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The seed under which element i hashes as element offset + i does under `seed`.
SOLTRAIN_HOST_DEVICE inline uint64_t counter_seed_at(uint64_t seed, uint64_t offset) {
  return seed + offset * 0x9E3779B97F4A7C15ull;
}

}  // namespace soltrain
