// Small device helpers shared by the CUDA op files: bf16 <-> fp32, warp and block reductions, grid sizes.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace soltrain::cuda {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float to_f(bf16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ bf16 to_bf(float x) {
  return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// 8 bf16 moved as one 16-byte access: elementwise kernels run near memory bandwidth only with these
// (2-byte accesses per lane left RMSNorm at a sixth of it).
struct Vec8 {
  uint4 raw;
  __device__ float operator[](int i) const { return to_f(reinterpret_cast<const bf16*>(&raw)[i]); }
  __device__ void set(int i, float v) { reinterpret_cast<bf16*>(&raw)[i] = to_bf(v); }
};
__device__ __forceinline__ Vec8 load8(const bf16* p) {
  return {*reinterpret_cast<const uint4*>(p)};
}
__device__ __forceinline__ void store8(bf16* p, const Vec8& v) {
  *reinterpret_cast<uint4*>(p) = v.raw;
}
inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Blocks for a grid-stride loop over n elements.
inline unsigned blocks_for(int64_t n, int threads, int64_t cap = 65535) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  return unsigned(b < cap ? b : cap);
}

}  // namespace soltrain::cuda
