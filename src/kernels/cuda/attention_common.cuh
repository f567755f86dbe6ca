// Building blocks of our flash attention kernels (sm_80+): bf16 tensor-core MMA (m16n8k16), fragments
// loaded with ldmatrix (.trans gives the B operand straight from row-major V/Q/dO/K tiles, so no
// transposed copies exist), and tile loads by cp.async (16-byte, zero-filling rows past the end).
// Fragment layouts (g = lane / 4, t = lane % 4):
//   A 16x16 row-major: a0 = A[g][2t..], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
//   B 16(k)x8(n): b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]
//   C 16x8: c0,c1 = C[g][2t, 2t+1], c2,c3 = C[g+8][2t, 2t+1]
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "core/error.h"
#include "kernels/cuda/common.cuh"

namespace soltrain::cuda::attn {

constexpr int kTile = 64;  // keys per tile (and queries per tile in the backward kernels)
constexpr int kPad = 8;    // bf16 row padding: a 272-byte row stride keeps ldmatrix conflict-free
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mma(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// A fragment of the 16x16 row-major tile at `base`.
__device__ __forceinline__ void load_a(uint32_t a[4], const bf16* base, int ld) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4(a, base + ((lane % 8) + (lane / 8 % 2) * 8) * ld + (lane / 16) * 8);
}
// B fragments of two n-tiles (n 0-7, 8-15; k 0-15) from Bᵀ stored row-major as [n][k] at `base`.
__device__ __forceinline__ void load_b2(uint32_t b0[2], uint32_t b1[2], const bf16* base, int ld) {
  const int lane = threadIdx.x % 32;
  uint32_t r[4];
  ldmatrix_x4(r, base + ((lane % 8) + (lane / 16) * 8) * ld + (lane / 8 % 2) * 8);
  b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
}
// B fragments of two n-tiles from B stored row-major as [k][n] at `base` (k 0-15, n 0-15).
__device__ __forceinline__ void load_b2_trans(uint32_t b0[2], uint32_t b1[2], const bf16* base, int ld) {
  const int lane = threadIdx.x % 32;
  uint32_t r[4];
  ldmatrix_x4_trans(r, base + ((lane % 8) + (lane / 8 % 2) * 8) * ld + (lane / 16) * 8);
  b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
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

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// Rows [0, kRows) x [0, D) of one head's slice into shared memory (ld = D + kPad): row r is token
// `first + r` of src [tokens, heads, hd]; rows at or past `valid` and columns at or past hd are zero.
// kAsync (needs hd == D): 16-byte cp.async, complete after cp_async_wait_all(); else plain loads/stores.
template <int D, int kRows, bool kAsync>
__device__ __forceinline__ void load_rows(bf16* dst, const bf16* src, int64_t first, int valid, int heads, int head,
                                          int hd) {
  constexpr int ld = D + kPad;
  if constexpr (kAsync) {
    for (int i = threadIdx.x; i < kRows * (D / 8); i += blockDim.x) {
      const int r = i / (D / 8), c = i % (D / 8) * 8;
      const bool ok = r < valid;
      cp_async16(dst + r * ld + c, src + ((first + (ok ? r : 0)) * heads + head) * int64_t(D) + c, ok);
    }
  } else {
    for (int i = threadIdx.x; i < kRows * D; i += blockDim.x) {
      const int r = i / D, c = i % D;
      dst[r * ld + c] = (r < valid && c < hd) ? src[((first + r) * heads + head) * int64_t(hd) + c] : to_bf(0.f);
    }
  }
}

// Calls f(std::integral_constant<int, D>{}) with the narrowest compiled tile width D ≥ hd (32, 64, 128);
// wider heads are a UserError (models are refused earlier, at load: CudaOps::max_attention_head_dim).
// One place decides which head dims the attention kernels serve.
constexpr int kMaxHeadDim = 128;
template <typename F>
void with_head_dim(int64_t hd, F&& f) {
  if (hd <= 32)
    f(std::integral_constant<int, 32>{});
  else if (hd <= 64)
    f(std::integral_constant<int, 64>{});
  else if (hd <= kMaxHeadDim)
    f(std::integral_constant<int, kMaxHeadDim>{});
  else
    user_error("head_dim ", hd, " is not supported on CUDA yet (at most ", kMaxHeadDim, ")");
}

}  // namespace soltrain::cuda::attn
