// CUDA sm_90a: flash attention backward on warpgroup MMA, deterministic like the portable kernels in
// attention_backward.cu (same split, no float atomics): one kernel owns 128 keys (64 per warpgroup) and
// accumulates dK, dV over the query tiles of every query head in its GQA group; another owns 128 queries
// and accumulates dQ over key tiles. Both recompute P from the saved log-sum-exp. Score-shaped products
// (Sᵀ = K Qᵀ, dPᵀ = V dOᵀ, S = Q Kᵀ, dP = dO Vᵀ) read both operands from shared memory; the products that
// accumulate gradients (dV += Pᵀ dO, dK += dSᵀ Q, dQ += dS K) take P or dS from registers and the other
// operand transposed from the same shared-memory tile. The streamed tiles are double-buffered by cp.async.
#include <cfloat>

#include "kernels/cuda/attention_sm90.cuh"
#include "kernels/cuda/attention_sm90.h"
#include "kernels/cuda/check.h"

namespace soltrain::cuda {

using namespace attn;
using namespace attn::sm90;

namespace {

constexpr int kThreads = 2 * kWarpgroup;
constexpr int kKeys = 128, kQueryTile = 64;  // dK/dV kernel: keys per block, queries per streamed tile
constexpr int kQueries = 128, kKeyTile = 64;  // dQ kernel: queries per block, keys per streamed tile

template <int D>
constexpr size_t dkdv_smem() {
  return size_t(2 * kKeys + 4 * kQueryTile) * D * sizeof(bf16) + 4 * kQueryTile * sizeof(float) + 1024;
}

template <int D>
__global__ void __launch_bounds__(kThreads, 1)
    dkdv_kernel(bf16* dk, bf16* dv, const bf16* q, const bf16* k, const bf16* v, const bf16* dout, const float* lse,
                const float* delta, const int32_t* cu, int64_t N, int H, int Hkv, float scale) {
#ifdef SOLTRAIN_SM90_DEVICE
  extern __shared__ unsigned char smem_raw[];
  bf16* const Ks = align1024(smem_raw);
  bf16* const Vs = Ks + kKeys * D;
  bf16* const Qb = Vs + kKeys * D;  // stage b at Qb + b * kQueryTile * D
  bf16* const dOb = Qb + 2 * kQueryTile * D;
  float* const lse_b = reinterpret_cast<float*>(dOb + 2 * kQueryTile * D);
  float* const delta_b = lse_b + 2 * kQueryTile;

  const int kh = blockIdx.y, group = H / Hkv, doc = blockIdx.z;
  const int64_t start = cu[doc];
  const int len = cu[doc + 1] - cu[doc];
  const int k0 = (gridDim.x - 1 - blockIdx.x) * kKeys;  // early keys see the most queries: start them first
  if (k0 >= len) return;
  const int tid = threadIdx.x, wg = tid / kWarpgroup, warp = tid % kWarpgroup / 32, g = tid % 32 / 4, t = tid % 4;
  const float scale_log2 = scale * kLog2e;
  const int wk0 = k0 + wg * 64;  // this warpgroup's first key
  const int key[2] = {wk0 + warp * 16 + g, wk0 + warp * 16 + g + 8};
  const int q_tiles = (len - k0 + kQueryTile - 1) / kQueryTile;  // causal: query tiles from this key block on
  const int items = group * q_tiles;

  // item i = (query head kh * group + i / q_tiles, query tile starting at k0 + (i % q_tiles) * kQueryTile)
  auto load_item = [&](int i, int b) {
    const int h = kh * group + i / q_tiles, q0 = k0 + (i % q_tiles) * kQueryTile;
    load_tile<D, kQueryTile>(Qb + b * kQueryTile * D, q, start + q0, len - q0, H, h, tid, kThreads);
    load_tile<D, kQueryTile>(dOb + b * kQueryTile * D, dout, start + q0, len - q0, H, h, tid, kThreads);
    cp_async_commit();
    if (tid < kQueryTile) {
      const bool ok = q0 + tid < len;
      lse_b[b * kQueryTile + tid] = ok ? lse[int64_t(h) * N + start + q0 + tid] * kLog2e : 0.f;
      delta_b[b * kQueryTile + tid] = ok ? delta[int64_t(h) * N + start + q0 + tid] : 0.f;
    }
  };
  load_tile<D, kKeys>(Ks, k, start + k0, len - k0, Hkv, kh, tid, kThreads);
  load_tile<D, kKeys>(Vs, v, start + k0, len - k0, Hkv, kh, tid, kThreads);
  load_item(0, 0);

  float dk_acc[D / 2], dv_acc[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk_acc[i] = dv_acc[i] = 0.f;

  for (int it = 0; it < items; ++it) {
    const int b = it % 2, q0 = k0 + (it % q_tiles) * kQueryTile;
    cp_async_wait_all();
    fence_proxy_async();
    __syncthreads();  // item it has landed for every thread, and every thread is done with item it - 1
    if (it + 1 < items) load_item(it + 1, b ^ 1);
    if (q0 + kQueryTile - 1 < wk0 || wk0 >= len) continue;  // every query precedes this group's keys
    const bf16* Qs = Qb + b * kQueryTile * D;
    const bf16* dOs = dOb + b * kQueryTile * D;

    float p[kQueryTile / 2], ds[kQueryTile / 2];  // Sᵀ then Pᵀ; dPᵀ then dSᵀ (keys x queries)
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
      wgmma_ss<kQueryTile>(p, k_major<kKeys>(Ks, wg * 64, ks), k_major<kQueryTile>(Qs, 0, ks), ks > 0);
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
      wgmma_ss<kQueryTile>(ds, k_major<kKeys>(Vs, wg * 64, ks), k_major<kQueryTile>(dOs, 0, ks), ks > 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(p);
    fence_accumulators(ds);

    const bool masked = q0 < wk0 + 63 || q0 + kQueryTile > len || wk0 + 64 > len;
#pragma unroll
    for (int i = 0; i < kQueryTile / 2; ++i) {
      const int qc = i / 4 * 8 + 2 * t + (i & 1), query = q0 + qc, kr = key[i / 2 % 2];
      const bool ok = !masked || (kr <= query && query < len && kr < len);
      const float pe = ok ? exp2f(p[i] * scale_log2 - lse_b[b * kQueryTile + qc]) : 0.f;
      p[i] = pe;
      ds[i] = pe * (ds[i] - delta_b[b * kQueryTile + qc]);
    }
    uint32_t ap[kQueryTile / 16][4], ad[kQueryTile / 16][4];
#pragma unroll
    for (int kk = 0; kk < kQueryTile / 16; ++kk) {
      c_to_a(ap[kk], &p[8 * kk], &p[8 * kk + 4]);
      c_to_a(ad[kk], &ds[8 * kk], &ds[8 * kk + 4]);
    }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kQueryTile / 16; ++kk) wgmma_rs<D>(dv_acc, ap[kk], mn_major<kQueryTile>(dOs, kk), 1);
#pragma unroll
    for (int kk = 0; kk < kQueryTile / 16; ++kk) wgmma_rs<D>(dk_acc, ad[kk], mn_major<kQueryTile>(Qs, kk), 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(dv_acc);
    fence_accumulators(dk_acc);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= len) continue;
    const int64_t base = ((start + key[r]) * Hkv + kh) * int64_t(D);
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      const int c = dt * 8 + 2 * t;
      *reinterpret_cast<__nv_bfloat162*>(dk + base + c) =
          __floats2bfloat162_rn(dk_acc[4 * dt + 2 * r] * scale, dk_acc[4 * dt + 2 * r + 1] * scale);
      *reinterpret_cast<__nv_bfloat162*>(dv + base + c) =
          __floats2bfloat162_rn(dv_acc[4 * dt + 2 * r], dv_acc[4 * dt + 2 * r + 1]);
    }
  }
#endif
}

template <int D>
constexpr size_t dq_smem() {
  return size_t(2 * kQueries + 4 * kKeyTile) * D * sizeof(bf16) + 1024;
}

template <int D>
__global__ void __launch_bounds__(kThreads, 1)
    dq_kernel(bf16* dq, const bf16* q, const bf16* k, const bf16* v, const bf16* dout, const float* lse,
              const float* delta, const int32_t* cu, int64_t N, int H, int Hkv, float scale) {
#ifdef SOLTRAIN_SM90_DEVICE
  extern __shared__ unsigned char smem_raw[];
  bf16* const Qs = align1024(smem_raw);
  bf16* const dOs = Qs + kQueries * D;
  bf16* const Kb = dOs + kQueries * D;  // stage b at Kb + b * kKeyTile * D
  bf16* const Vb = Kb + 2 * kKeyTile * D;

  const int h = blockIdx.y, kh = h / (H / Hkv), doc = blockIdx.z;
  const int64_t start = cu[doc];
  const int len = cu[doc + 1] - cu[doc];
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kQueries;  // late queries see the most keys: start them first
  if (q0 >= len) return;
  const int tid = threadIdx.x, wg = tid / kWarpgroup, warp = tid % kWarpgroup / 32, g = tid % 32 / 4, t = tid % 4;
  const float scale_log2 = scale * kLog2e;
  const int wq0 = q0 + wg * 64;
  const int row[2] = {wq0 + warp * 16 + g, wq0 + warp * 16 + g + 8};

  load_tile<D, kQueries>(Qs, q, start + q0, len - q0, H, h, tid, kThreads);
  load_tile<D, kQueries>(dOs, dout, start + q0, len - q0, H, h, tid, kThreads);
  load_tile<D, kKeyTile>(Kb, k, start, len, Hkv, kh, tid, kThreads);
  load_tile<D, kKeyTile>(Vb, v, start, len, Hkv, kh, tid, kThreads);
  cp_async_commit();
  float lse2[2], dl[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool ok = row[r] < len;
    lse2[r] = ok ? lse[int64_t(h) * N + start + row[r]] * kLog2e : 0.f;
    dl[r] = ok ? delta[int64_t(h) * N + start + row[r]] : 0.f;
  }
  float acc[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) acc[i] = 0.f;

  const int last_tile = min(q0 + kQueries - 1, len - 1) / kKeyTile;
  const int wg_last = wq0 < len ? min(wq0 + 63, len - 1) / kKeyTile : -1;
  for (int kt = 0; kt <= last_tile; ++kt) {
    const int k0 = kt * kKeyTile, b = kt % 2;
    cp_async_wait_all();
    fence_proxy_async();
    __syncthreads();  // tile kt has landed for every thread, and every thread is done with tile kt - 1
    if (kt < last_tile) {
      load_tile<D, kKeyTile>(Kb + (b ^ 1) * kKeyTile * D, k, start + k0 + kKeyTile, len - k0 - kKeyTile, Hkv, kh, tid,
                             kThreads);
      load_tile<D, kKeyTile>(Vb + (b ^ 1) * kKeyTile * D, v, start + k0 + kKeyTile, len - k0 - kKeyTile, Hkv, kh, tid,
                             kThreads);
      cp_async_commit();
    }
    if (kt > wg_last) continue;
    const bf16* Ks = Kb + b * kKeyTile * D;
    const bf16* Vs = Vb + b * kKeyTile * D;

    float p[kKeyTile / 2], ds[kKeyTile / 2];  // S then P; dP then dS (queries x keys)
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
      wgmma_ss<kKeyTile>(p, k_major<kQueries>(Qs, wg * 64, ks), k_major<kKeyTile>(Ks, 0, ks), ks > 0);
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
      wgmma_ss<kKeyTile>(ds, k_major<kQueries>(dOs, wg * 64, ks), k_major<kKeyTile>(Vs, 0, ks), ks > 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(p);
    fence_accumulators(ds);

    const bool masked = k0 + kKeyTile - 1 > wq0 || k0 + kKeyTile > len || wq0 + 64 > len;
#pragma unroll
    for (int i = 0; i < kKeyTile / 2; ++i) {
      const int r = i / 2 % 2, kc = k0 + i / 4 * 8 + 2 * t + (i & 1);
      const bool ok = !masked || (kc <= row[r] && kc < len && row[r] < len);
      const float pe = ok ? exp2f(p[i] * scale_log2 - lse2[r]) : 0.f;
      ds[i] = pe * (ds[i] - dl[r]);
    }
    uint32_t a[kKeyTile / 16][4];
#pragma unroll
    for (int kk = 0; kk < kKeyTile / 16; ++kk) c_to_a(a[kk], &ds[8 * kk], &ds[8 * kk + 4]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKeyTile / 16; ++kk) wgmma_rs<D>(acc, a[kk], mn_major<kKeyTile>(Ks, kk), 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(acc);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= len) continue;
    bf16* dst = dq + ((start + row[r]) * H + h) * int64_t(D);
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      *reinterpret_cast<__nv_bfloat162*>(dst + dt * 8 + 2 * t) =
          __floats2bfloat162_rn(acc[4 * dt + 2 * r] * scale, acc[4 * dt + 2 * r + 1] * scale);
  }
#endif
}

template <int D>
void launch(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
            const Tensor& v, const Tensor& lse, const float* delta, const SeqLayout& seq, float scale, cudaStream_t s) {
  static bool configured = false;
  if (!configured) {
    CUDA_CHECK(
        cudaFuncSetAttribute(dkdv_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(dkdv_smem<D>())));
    CUDA_CHECK(cudaFuncSetAttribute(dq_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(dq_smem<D>())));
    configured = true;
  }
  const int H = int(q.dim(1)), Hkv = int(k.dim(1));
  const int64_t N = q.dim(0);
  const unsigned docs = unsigned(seq.cu_seqlens.numel() - 1);
  dkdv_kernel<D><<<dim3(unsigned((seq.max_seqlen + kKeys - 1) / kKeys), unsigned(Hkv), docs), kThreads,
                   dkdv_smem<D>(), s>>>(dk.as<bf16>(), dv.as<bf16>(), q.as<bf16>(), k.as<bf16>(), v.as<bf16>(),
                                        dout.as<bf16>(), lse.f32(), delta, seq.cu_seqlens.i32(), N, H, Hkv, scale);
  CUDA_CHECK_LAUNCH();
  dq_kernel<D><<<dim3(unsigned((seq.max_seqlen + kQueries - 1) / kQueries), unsigned(H), docs), kThreads,
                 dq_smem<D>(), s>>>(dq.as<bf16>(), q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), dout.as<bf16>(),
                                    lse.f32(), delta, seq.cu_seqlens.i32(), N, H, Hkv, scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void flash_backward_sm90(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                         const Tensor& k, const Tensor& v, const Tensor& lse, const float* delta,
                         const SeqLayout& seq, float scale, cudaStream_t s) {
  if (q.dim(2) == 64)
    launch<64>(dq, dk, dv, dout, q, k, v, lse, delta, seq, scale, s);
  else
    launch<128>(dq, dk, dv, dout, q, k, v, lse, delta, seq, scale, s);
}

}  // namespace soltrain::cuda
