// The dropout mask as a pure function of (seed, element index): a counter-based hash (splitmix64), so the
// CPU and CUDA backends drop the same elements and backward needs no saved mask.
#pragma once
#include <cstdint>

#include "kernels/counter_hash.h"

namespace soltrain {

SOLTRAIN_HOST_DEVICE inline bool dropout_keep(uint64_t seed, uint64_t i, float p) {
  // 24 random bits → a uniform float in [0, 1) that is exact in fp32 on both backends.
  return float(counter_hash(seed, i) >> 40) * (1.0f / 16777216.0f) >= p;
}

// The seed that makes element i of a slice draw what element offset + i of the whole tensor draws under
// `seed`: a tensor processed in tiles keeps the untiled mask.
SOLTRAIN_HOST_DEVICE inline uint64_t dropout_seed_at(uint64_t seed, uint64_t offset) {
  return counter_seed_at(seed, offset);
}

}  // namespace soltrain
