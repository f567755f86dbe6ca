// Building blocks of our flash attention kernels: bf16 tensor-core MMA (m16n8k16, sm_80+), fragment
// loads from shared memory, and tile loads from [tokens, heads, hd] global tensors.
// Fragment layouts (g = lane / 4, t = lane % 4):
//   A 16x16 row-major: a0 = A[g][2t..], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
//   B 16x8 given as Bᵀ rows (n, k contiguous): b0 = Bᵀ[g][2t..], b1 = Bᵀ[g][2t+8..]
//   C 16x8: c0,c1 = C[g][2t, 2t+1], c2,c3 = C[g+8][2t, 2t+1]
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace soltrain::cuda::attn {

constexpr int kTile = 64;    // queries and keys per block tile
constexpr int kWarps = 4;    // 16 rows each
constexpr int kPad = 8;      // bf16 elements of row padding against bank conflicts
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ void mma(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t ld32(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// A fragment of the 16x16 tile at `base` (row-major, leading dimension ld elements).
__device__ __forceinline__ void load_a(uint32_t a[4], const bf16* base, int ld) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  a[0] = ld32(base + g * ld + 2 * t);
  a[1] = ld32(base + (g + 8) * ld + 2 * t);
  a[2] = ld32(base + g * ld + 2 * t + 8);
  a[3] = ld32(base + (g + 8) * ld + 2 * t + 8);
}

// B fragment of a 16(k) x 8(n) tile stored transposed at `base`: 8 rows of n, k contiguous.
__device__ __forceinline__ void load_b(uint32_t b[2], const bf16* base, int ld) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  b[0] = ld32(base + g * ld + 2 * t);
  b[1] = ld32(base + g * ld + 2 * t + 8);
}

__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// An A fragment (16 rows x 16 k) from two C accumulators covering k columns [0,8) and [8,16).
__device__ __forceinline__ void c_to_a(uint32_t a[4], const float lo[4], const float hi[4]) {
  a[0] = pack(lo[0], lo[1]);
  a[1] = pack(lo[2], lo[3]);
  a[2] = pack(hi[0], hi[1]);
  a[3] = pack(hi[2], hi[3]);
}

// Copies rows [0, kTile) x [0, D) of a head's slice into shared memory: row r is token `first + r` of
// src [tokens, heads, hd] at head `head`; rows at or past `valid` and columns at or past hd are zero.
// With `transpose`, writes dst[d][r] (ld = kTile + kPad) instead of dst[r][d] (ld = D + kPad).
template <int D, bool kTranspose>
__device__ __forceinline__ void load_tile(bf16* dst, const bf16* src, int64_t first, int valid, int heads, int head,
                                          int hd) {
  constexpr int ld = kTranspose ? kTile + kPad : D + kPad;
  const bf16 zero = to_bf(0.f);
  if (hd == D && hd % 8 == 0) {  // 16-byte vectors
    for (int i = threadIdx.x; i < kTile * D / 8; i += blockDim.x) {
      const int r = i / (D / 8), c = i % (D / 8) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < valid) v = *reinterpret_cast<const uint4*>(src + ((first + r) * heads + head) * hd + c);
      if (!kTranspose) {
        *reinterpret_cast<uint4*>(dst + r * ld + c) = v;
      } else {
        const bf16* e = reinterpret_cast<const bf16*>(&v);
        for (int j = 0; j < 8; ++j) dst[(c + j) * ld + r] = e[j];
      }
    }
  } else {
    for (int i = threadIdx.x; i < kTile * D; i += blockDim.x) {
      const int r = i / D, c = i % D;
      const bf16 v = (r < valid && c < hd) ? src[((first + r) * heads + head) * hd + c] : zero;
      dst[kTranspose ? c * ld + r : r * ld + c] = v;
    }
  }
}

}  // namespace soltrain::cuda::attn
