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
// The residual stream is kept in bf16 or fp32 (see Transformer::residual_dtype): kernels that read or write it
// are templated on its type and move 8 values per lane through these (one 16-byte access for bf16, two for
// fp32), computing in fp32 either way; storing to bf16 rounds to nearest even.
struct F8 {
  float v[8];
};
__device__ __forceinline__ F8 load8f(const bf16* p) {
  const Vec8 b = load8(p);
  F8 r;
  for (int i = 0; i < 8; ++i) r.v[i] = b[i];
  return r;
}
__device__ __forceinline__ F8 load8f(const float* p) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  return {{a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w}};
}
__device__ __forceinline__ void store8f(bf16* p, const F8& v) {
  Vec8 b;
  for (int i = 0; i < 8; ++i) b.set(i, v.v[i]);
  store8(p, b);
}
__device__ __forceinline__ void store8f(float* p, const F8& v) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v.v[0], v.v[1], v.v[2], v.v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v.v[4], v.v[5], v.v[6], v.v[7]);
}
__device__ __forceinline__ float ld(const bf16* p) {
  return to_f(*p);
}
__device__ __forceinline__ float ld(const float* p) {
  return *p;
}
__device__ __forceinline__ void st(bf16* p, float v) {
  *p = to_bf(v);
}
__device__ __forceinline__ void st(float* p, float v) {
  *p = v;
}
// A value as a T would hold it (rounded for bf16, unchanged for fp32).
template <typename T>
__device__ __forceinline__ float as_stored(float v) {
  if constexpr (sizeof(T) == 2)
    return to_f(to_bf(v));
  else
    return v;
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
