// Building blocks of the Hopper (sm_90a) flash attention kernels: warpgroup MMA (wgmma) with operands in
// shared memory described by 64-bit matrix descriptors, tiles stored in the 128-byte-swizzled layout those
// descriptors read (which one TMA box per 64 columns writes: tensor_map.h), mbarriers, and the fences
// wgmma needs. Everything here compiles only into the sm_90a image
// (guarded by SOLTRAIN_SM90_DEVICE); the sm_80 image keeps the mma.sync kernels of attention_common.cuh.
//
// Tile layout ("sw128"): a tile of R rows x D bf16 columns (D = 64 or 128) is D/64 column blocks of R x 64;
// block j starts at j * R * 64 elements, row r of a block is 128 bytes at r * 128, and its 16-byte chunk c
// sits at chunk position c ^ (r % 8). Tiles start 1024-byte aligned, so the hardware's swizzle (byte
// address bits 4-6 XOR bits 7-9) lands exactly there. The same tile serves as a K-major operand (rows = M or
// N, columns = the contraction) and as an MN-major one (rows = the contraction, columns = N) by descriptor.
//
// Accumulator layout of m64nNk16 (per warp w of the warpgroup, g = lane / 4, t = lane % 4): d[4j + e] is
// row 16w + g + 8 * (e / 2), column 8j + 2t + (e % 2): the mma.sync C layout repeated over N / 8 column
// blocks, so c_to_a() turns two of them into an A fragment for a register-sourced wgmma.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/attention_common.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SOLTRAIN_SM90_DEVICE 1
#endif

namespace soltrain::cuda::attn::sm90 {

constexpr int kWarpgroup = 128;  // threads

#ifdef SOLTRAIN_SM90_DEVICE
// The four wrappers below differ only in N (64, 128) and the A source; inline asm must name every
// accumulator register, so each spells its operand list out (as CUTLASS does).
// D[64 x 64] (+)= A[64 x 16] (smem) * B[16 x 64] (smem); fp32 accumulators in the C layout. Operands are
// K-major unless kTrans: then both are read MN-major (transposed), from tiles whose rows are the contraction
// (the fused backward's dQ = dS K from a dSᵀ tile and the K tile).
template <int kTrans = 0>
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, %35, %35;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(accumulate), "n"(kTrans));
}
// D[64 x 64] += A[64 x 16] (registers, A-fragment layout) * B[16 x 64] (smem, MN-major: transposed).
__device__ __forceinline__ void wgmma_rs_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}
// D[64 x 128] (+)= A[64 x 16] (smem) * B[16 x 128] (smem); fp32 accumulators in the C layout. Operands K-major
// unless kTransA / kTransB (then read MN-major: the grouped GEMMs' dx and dw, grouped_gemm.cu).
template <int kTransA = 0, int kTransB = 0>
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
      "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, %67, %68;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b), "r"(accumulate), "n"(kTransA), "n"(kTransB));
}
// D[64 x 128] += A[64 x 16] (registers, A-fragment layout) * B[16 x 128] (smem, MN-major: transposed).
__device__ __forceinline__ void wgmma_rs_n128(float (&d)[64], const uint32_t (&a)[4], uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
      "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

template <int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t a, uint64_t b, int accumulate) {
  if constexpr (N == 64)
    wgmma_ss_n64(d, a, b, accumulate);
  else
    wgmma_ss_n128(d, a, b, accumulate);
}
template <int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b, int accumulate) {
  if constexpr (N == 64)
    wgmma_rs_n64(d, a, b, accumulate);
  else
    wgmma_rs_n128(d, a, b, accumulate);
}

// Orders this thread's register writes before the tensor cores read them (start of each wgmma batch).
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// After wgmma_wait: ties each accumulator to a volatile point so the compiler reads none of them earlier.
template <int R>
__device__ __forceinline__ void fence_accumulators(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// mbarriers (64-bit words in shared memory): TMA copies complete on them by transaction bytes; consumers
// release a stage by arriving. Waits name the phase parity they wait for.
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, int parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
// One TMA box (64 columns x rows tokens of one head, see tensor_map.h) into a sw128 tile block.
__device__ __forceinline__ void tma_load(bf16* dst, const void* map, int col, int head, int token, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(smem_addr(dst)),
      "l"(map), "r"(col), "r"(head), "r"(token), "r"(smem_addr(bar))
      : "memory");
}
// Warp-specialised register split: the copy warpgroup gives registers back, the MMA warpgroups take them.
template <int kRegs>
__device__ __forceinline__ void release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void claim_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
// A named barrier over `threads` threads (a multiple of 32; id 0 is __syncthreads'): the consumer
// warpgroups meet without the copy warpgroup, which has left.
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Makes this thread's plain shared-memory stores visible to the async proxy (wgmma operand reads, TMA).
__device__ __forceinline__ void fence_shared_to_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// One thread's named-barrier arrival without waiting (the producer side of a bar.sync on the same id).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// `bytes` (a multiple of 16) of fp32 in shared memory added element-wise into global memory by the bulk copy
// engine (reductions performed at L2), as one bulk async-group.
__device__ __forceinline__ void bulk_reduce_add(float* dst, const float* src, uint32_t bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
      "cp.async.bulk.commit_group;\n" ::"l"(dst),
      "r"(smem_addr(src)), "r"(bytes)
      : "memory");
}
// Waits until this thread's bulk groups have read their shared-memory source (it may be written again)...
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// ... or have completed, their global writes performed.
__device__ __forceinline__ void bulk_wait_done() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
// Orders this thread's generic-proxy global accesses with its async-proxy (bulk copy) ones.
__device__ __forceinline__ void fence_global_async() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
// A GPU-scope acquiring load (spinning on a counter another block releases).
__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// 2^x on the special-function unit (flushes denormals; -inf gives 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
#endif  // SOLTRAIN_SM90_DEVICE

// Matrix descriptor for a sw128 tile: start address, leading and stride byte offsets, 128-byte swizzle.
__device__ __forceinline__ uint64_t descriptor(uint32_t addr, uint32_t lead_bytes, uint32_t stride_bytes) {
  return uint64_t((addr & 0x3FFFF) >> 4) | uint64_t(lead_bytes >> 4) << 16 | uint64_t(stride_bytes >> 4) << 32 |
         uint64_t(1) << 62;
}
// K-major operand: rows [row0, row0 + M) of a kRows-row tile, contraction columns [16 ks, 16 ks + 16).
// 8-row groups are 1024 bytes apart (stride); the leading offset is unused with swizzling.
template <int kRows>
__device__ __forceinline__ uint64_t k_major(const bf16* tile, int row0, int ks) {
  return descriptor(smem_addr(tile) + (ks / 4) * (kRows * 128) + row0 * 128 + (ks % 4) * 32, 16, 1024);
}
// MN-major operand (the tile read transposed): contraction rows [16 kk, 16 kk + 16), every column.
// 8-row groups are 1024 bytes apart (stride); 64-column blocks kRows * 128 bytes apart (leading).
template <int kRows>
__device__ __forceinline__ uint64_t mn_major(const bf16* tile, int kk) {
  return descriptor(smem_addr(tile) + kk * 16 * 128, kRows * 128, 1024);
}

// Row r (0 or 1: g or g + 8 of the warp's 16) of a 64 x D accumulator, times `scale`, as bf16 into dst[0, D).
template <int D>
__device__ __forceinline__ void store_row(bf16* dst, const float (&acc)[D / 2], int r, float scale) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt)
    *reinterpret_cast<__nv_bfloat162*>(dst + dt * 8 + 2 * t) =
        __floats2bfloat162_rn(acc[4 * dt + 2 * r] * scale, acc[4 * dt + 2 * r + 1] * scale);
}

// The first 1024-byte boundary at or after p (dynamic shared memory is only 16-byte aligned).
__device__ __forceinline__ bf16* align1024(unsigned char* p) {
  const uint32_t a = smem_addr(p);
  return reinterpret_cast<bf16*>(p + ((1024 - (a & 1023)) & 1023));
}

}  // namespace soltrain::cuda::attn::sm90
