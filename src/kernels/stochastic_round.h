// Stochastic rounding of fp32 to bf16 (`bf16_stochastic_round`, torchao's name: its AdamW's bf16 weights are
// rounded so, `_fp32_to_bf16_sr`): 16 random bits added below the bf16 mantissa, then truncated, so x rounds
// up with probability equal to its distance from the lower neighbour over the gap, and E[round(x)] = x. An
// update much smaller than a bf16 ulp still moves the weight on average, which round-to-nearest would drop: what
// lets bf16 weights train without fp32 masters. The bits are a counter-based hash of (seed, element index)
// (kernels/counter_hash.h, as the dropout mask's), so the CPU and CUDA backends round the same elements the same way
// and a range updated in pieces draws what the whole range draws.
#pragma once
#include <cstdint>
#include <cstring>

#include "kernels/counter_hash.h"

namespace soltrain {

SOLTRAIN_HOST_DEVICE inline uint32_t stochastic_bits(uint64_t seed, uint64_t i) {
  return uint32_t(counter_hash(seed, i) >> 48);  // 16 bits
}

// x's bf16 bits, rounded up with probability (x - lower) / ulp by the random 16 bits r. NaN and infinities round
// to nearest (they have no neighbours to choose between).
SOLTRAIN_HOST_DEVICE inline uint16_t bf16_round_stochastic(float x, uint32_t r) {
  uint32_t u;
#ifdef __CUDA_ARCH__
  u = __float_as_uint(x);
#else
  std::memcpy(&u, &x, 4);
#endif
  if ((u & 0x7f800000u) == 0x7f800000u) {  // inf or NaN
    if (u & 0x007fffffu) return uint16_t((u >> 16) | 0x40);
    return uint16_t(u >> 16);
  }
  return uint16_t((u + (r & 0xffffu)) >> 16);
}

// The seed under which element i draws what element offset + i draws under `seed` (a slice keeps the whole's bits).
SOLTRAIN_HOST_DEVICE inline uint64_t stochastic_seed_at(uint64_t seed, uint64_t offset) {
  return counter_seed_at(seed, offset);
}

// The seed of one update's rounding: every element of the store draws from (step, its flat offset), whatever
// pieces the update is cut into (AdamWParams::sr_seed is this plus the piece's first offset).
SOLTRAIN_HOST_DEVICE inline uint64_t stochastic_step_seed(int step) {
  uint64_t z = uint64_t(step) * 0xD1B54A32D192ED03ull + 0x8CB92BA72F3D8DD7ull;
  z = (z ^ (z >> 29)) * 0xBF58476D1CE4E5B9ull;
  return z ^ (z >> 32);
}

}  // namespace soltrain
