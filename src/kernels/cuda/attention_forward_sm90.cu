// CUDA sm_90a: flash attention forward on warpgroup MMA. Same algorithm and outputs as the portable kernel
// in attention_forward.cu (causal, packed documents, GQA, fp32 online softmax, log-sum-exp saved), but each
// of the block's two warpgroups owns 64 query rows and multiplies whole 64 x 128 tiles per instruction
// batch: S = Q Kᵀ with both operands in shared memory, O += P V with P straight from the registers that
// held S. K/V tiles of 128 keys are double-buffered by cp.async; one barrier per tile.
#include <cfloat>

#include "kernels/cuda/attention_sm90.cuh"
#include "kernels/cuda/attention_sm90.h"
#include "kernels/cuda/check.h"

namespace soltrain::cuda {

using namespace attn;
using namespace attn::sm90;

namespace {

constexpr int kM = 128, kN = 128, kThreads = 2 * kWarpgroup;  // queries per block, keys per tile

template <int D>
constexpr size_t forward_smem() {
  return size_t(kM + 4 * kN) * D * sizeof(bf16) + 1024;  // Q, K and V twice; slack for 1024-byte alignment
}

template <int D>
__global__ void __launch_bounds__(kThreads, 1)
    flash_forward_kernel(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const int32_t* cu,
                         int64_t N, int H, int Hkv, float scale_log2) {
#ifdef SOLTRAIN_SM90_DEVICE
  extern __shared__ unsigned char smem_raw[];
  bf16* const Qs = align1024(smem_raw);
  bf16* const Kb = Qs + kM * D;  // stage s at Kb + s * kN * D (offsets, not a pointer array: see attention_forward)
  bf16* const Vb = Kb + 2 * kN * D;

  const int h = blockIdx.y, kh = h / (H / Hkv), doc = blockIdx.z;
  const int64_t start = cu[doc];
  const int len = cu[doc + 1] - cu[doc];
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kM;  // longest-running blocks (most keys) first
  if (q0 >= len) return;
  const int tid = threadIdx.x, wg = tid / kWarpgroup, warp = tid % kWarpgroup / 32, g = tid % 32 / 4, t = tid % 4;
  const int wq0 = q0 + wg * 64;  // this warpgroup's first query
  const int row[2] = {wq0 + warp * 16 + g, wq0 + warp * 16 + g + 8};

  load_tile<D, kM>(Qs, q, start + q0, len - q0, H, h, tid, kThreads);
  load_tile<D, kN>(Kb, k, start, len, Hkv, kh, tid, kThreads);
  load_tile<D, kN>(Vb, v, start, len, Hkv, kh, tid, kThreads);
  cp_async_commit();

  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  float m[2] = {-FLT_MAX, -FLT_MAX}, l[2] = {0.f, 0.f};

  const int last_tile = min(q0 + kM - 1, len - 1) / kN;
  const int wg_last = wq0 < len ? min(wq0 + 63, len - 1) / kN : -1;  // later tiles are all in this group's future
  for (int kt = 0; kt <= last_tile; ++kt) {
    const int k0 = kt * kN, stage = kt % 2;
    cp_async_wait_all();
    fence_proxy_async();
    __syncthreads();  // tile kt has landed for every thread, and every thread is done with tile kt - 1
    if (kt < last_tile) {  // prefetch into the stage tile kt - 1 used
      load_tile<D, kN>(Kb + (stage ^ 1) * kN * D, k, start + k0 + kN, len - k0 - kN, Hkv, kh, tid, kThreads);
      load_tile<D, kN>(Vb + (stage ^ 1) * kN * D, v, start + k0 + kN, len - k0 - kN, Hkv, kh, tid, kThreads);
      cp_async_commit();
    }
    if (kt > wg_last) continue;
    const bf16* Ks = Kb + stage * kN * D;
    const bf16* Vs = Vb + stage * kN * D;

    float s[kN / 2];
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) wgmma_ss<kN>(s, k_major<kM>(Qs, wg * 64, ks), k_major<kN>(Ks, 0, ks), ks > 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(s);

    // scale into the log2 domain; mask only where the tile crosses the diagonal or the document end
    const bool masked = k0 + kN - 1 > wq0 || k0 + kN > len;
    float mx[2] = {-FLT_MAX, -FLT_MAX};
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) {
      const int key = k0 + i / 4 * 8 + 2 * t + (i & 1), r = i / 2 % 2;
      const bool ok = !masked || (key <= row[r] && key < len);
      s[i] = ok ? s[i] * scale_log2 : -FLT_MAX;
      mx[r] = fmaxf(mx[r], s[i]);
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m[r], mx[r]);
      alpha[r] = exp2f(m[r] - m_new);
      m[r] = m_new;
      l[r] *= alpha[r];
    }
    uint32_t p[kN / 16][4];
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) {
      const int r = i / 2 % 2;
      s[i] = s[i] == -FLT_MAX ? 0.f : exp2f(s[i] - m[r]);
      l[r] += s[i];
    }
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) c_to_a(p[kk], &s[8 * kk], &s[8 * kk + 4]);
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] *= alpha[i / 2 % 2];

    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) wgmma_rs<D>(o, p[kk], mn_major<kN>(Vs, kk), 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(o);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= len) continue;
    const float inv = 1.f / l[r];
    bf16* dst = out + ((start + row[r]) * H + h) * int64_t(D);
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      *reinterpret_cast<__nv_bfloat162*>(dst + dt * 8 + 2 * t) =
          __floats2bfloat162_rn(o[4 * dt + 2 * r] * inv, o[4 * dt + 2 * r + 1] * inv);
    if (t == 0) lse[int64_t(h) * N + start + row[r]] = (m[r] + log2f(l[r])) / kLog2e;
  }
#endif
}

template <int D>
void launch(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
            const SeqLayout& seq, float scale, cudaStream_t s) {
  static bool configured = false;
  if (!configured) {
    CUDA_CHECK(cudaFuncSetAttribute(flash_forward_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(forward_smem<D>())));
    configured = true;
  }
  const int H = int(q.dim(1)), Hkv = int(k.dim(1));
  const dim3 grid(unsigned((seq.max_seqlen + kM - 1) / kM), unsigned(H), unsigned(seq.cu_seqlens.numel() - 1));
  flash_forward_kernel<D><<<grid, kThreads, forward_smem<D>(), s>>>(out.as<bf16>(), lse.f32(), q.as<bf16>(),
                                                                   k.as<bf16>(), v.as<bf16>(), seq.cu_seqlens.i32(),
                                                                   q.dim(0), H, Hkv, scale * kLog2e);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void flash_forward_sm90(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                        const SeqLayout& seq, float scale, cudaStream_t s) {
  if (q.dim(2) == 64)
    launch<64>(out, lse, q, k, v, seq, scale, s);
  else
    launch<128>(out, lse, q, k, v, seq, scale, s);
}

}  // namespace soltrain::cuda
