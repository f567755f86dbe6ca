// CUDA: flash attention backward, deterministic: one kernel owns a key tile and accumulates dK, dV over
// the query tiles (and every query head of its GQA group), another owns a query tile and accumulates dQ
// over key tiles. Both recompute the probabilities from the saved log-sum-exp; no float atomics.
#include <cfloat>

#include "core/error.h"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_ops.h"

namespace soltrain {

using namespace cuda::attn;
using cuda::bf16;

namespace {

// delta[h, n] = Σ_d dO[n,h,d] · O[n,h,d]  (one warp per token and head)
__global__ void attention_delta(float* delta, const bf16* dout, const bf16* out, int64_t N, int H, int hd) {
  const int64_t i = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;  // n * H + h
  if (i >= N * H) return;
  float s = 0.f;
  for (int d = threadIdx.x % 32; d < hd; d += 32) s += cuda::to_f(dout[i * hd + d]) * cuda::to_f(out[i * hd + d]);
  s = cuda::warp_sum(s);
  if (threadIdx.x % 32 == 0) delta[(i % H) * N + i / H] = s;
}

template <int D>
constexpr size_t dkdv_smem() {
  return size_t(4 * kTile * (D + kPad) + 2 * D * (kTile + kPad)) * sizeof(bf16) + 2 * kTile * sizeof(float);
}

template <int D>
__global__ void __launch_bounds__(kWarps * 32)
    flash_backward_dkdv(bf16* dk, bf16* dv, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                        const float* lse, const float* delta, const int32_t* cu, int64_t N, int H, int Hkv, int hd,
                        float scale) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int ld = D + kPad, ldt = kTile + kPad;
  bf16* Ks = reinterpret_cast<bf16*>(smem_raw);
  bf16* Vs = Ks + kTile * ld;
  bf16* Qs = Vs + kTile * ld;
  bf16* dOs = Qs + kTile * ld;
  bf16* Qt = dOs + kTile * ld;
  bf16* dOt = Qt + D * ldt;
  float* lse_s = reinterpret_cast<float*>(dOt + D * ldt);
  float* delta_s = lse_s + kTile;

  const int kh = blockIdx.y, group = H / Hkv, doc = blockIdx.z;
  const int64_t start = cu[doc];
  const int len = cu[doc + 1] - cu[doc];
  const int k0 = blockIdx.x * kTile;
  if (k0 >= len) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const float scale_log2 = scale * kLog2e;

  load_tile<D, false>(Ks, k, start + k0, len - k0, Hkv, kh, hd);
  load_tile<D, false>(Vs, v, start + k0, len - k0, Hkv, kh, hd);
  float dk_acc[D / 8][4], dv_acc[D / 8][4];
  for (int i = 0; i < D / 8; ++i)
    for (int e = 0; e < 4; ++e) dk_acc[i][e] = dv_acc[i][e] = 0.f;
  const int key[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};

  for (int h = kh * group; h < (kh + 1) * group; ++h) {
    for (int q0 = k0; q0 < len; q0 += kTile) {  // causal: earlier query tiles see none of these keys
      __syncthreads();
      load_tile<D, false>(Qs, q, start + q0, len - q0, H, h, hd);
      load_tile<D, false>(dOs, dout, start + q0, len - q0, H, h, hd);
      load_tile<D, true>(Qt, q, start + q0, len - q0, H, h, hd);
      load_tile<D, true>(dOt, dout, start + q0, len - q0, H, h, hd);
      for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
        const bool ok = q0 + i < len;
        lse_s[i] = ok ? lse[int64_t(h) * N + start + q0 + i] * kLog2e : 0.f;
        delta_s[i] = ok ? delta[int64_t(h) * N + start + q0 + i] : 0.f;
      }
      __syncthreads();
      for (int n0 = 0; n0 < kTile; n0 += 32) {  // 32 queries at a time keeps the register count down
        float p[4][4], ds[4][4];
        for (int nt = 0; nt < 4; ++nt) {
          for (int e = 0; e < 4; ++e) p[nt][e] = ds[nt][e] = 0.f;
          for (int kst = 0; kst < D / 16; ++kst) {
            uint32_t a[4], b[2];
            load_a(a, Ks + warp * 16 * ld + kst * 16, ld);
            load_b(b, Qs + (n0 + nt * 8) * ld + kst * 16, ld);
            mma(p[nt], a, b);  // Sᵀ: keys x queries
            load_a(a, Vs + warp * 16 * ld + kst * 16, ld);
            load_b(b, dOs + (n0 + nt * 8) * ld + kst * 16, ld);
            mma(ds[nt], a, b);  // dPᵀ
          }
          for (int e = 0; e < 4; ++e) {
            const int qc = n0 + nt * 8 + 2 * t + (e & 1), query = q0 + qc, kr = key[e / 2];
            const bool ok = kr <= query && query < len && kr < len;
            const float pe = ok ? exp2f(p[nt][e] * scale_log2 - lse_s[qc]) : 0.f;
            p[nt][e] = pe;
            ds[nt][e] = pe * (ds[nt][e] - delta_s[qc]);
          }
        }
        for (int kk = 0; kk < 2; ++kk) {
          uint32_t ap[4], ad[4];
          c_to_a(ap, p[2 * kk], p[2 * kk + 1]);
          c_to_a(ad, ds[2 * kk], ds[2 * kk + 1]);
          for (int dt = 0; dt < D / 8; ++dt) {
            uint32_t b[2];
            load_b(b, dOt + dt * 8 * ldt + n0 + kk * 16, ldt);
            mma(dv_acc[dt], ap, b);
            load_b(b, Qt + dt * 8 * ldt + n0 + kk * 16, ldt);
            mma(dk_acc[dt], ad, b);
          }
        }
      }
    }
  }
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= len) continue;
    const int64_t base = ((start + key[r]) * Hkv + kh) * hd;
    for (int dt = 0; dt < D / 8; ++dt)
      for (int j = 0; j < 2; ++j) {
        const int c = dt * 8 + 2 * t + j;
        if (c >= hd) continue;
        dk[base + c] = cuda::to_bf(dk_acc[dt][2 * r + j] * scale);
        dv[base + c] = cuda::to_bf(dv_acc[dt][2 * r + j]);
      }
  }
}

template <int D>
constexpr size_t dq_smem() {
  return size_t(4 * kTile * (D + kPad) + D * (kTile + kPad)) * sizeof(bf16);
}

template <int D>
__global__ void __launch_bounds__(kWarps * 32)
    flash_backward_dq(bf16* dq, const bf16* q, const bf16* k, const bf16* v, const bf16* dout, const float* lse,
                      const float* delta, const int32_t* cu, int64_t N, int H, int Hkv, int hd, float scale) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int ld = D + kPad, ldt = kTile + kPad;
  bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* dOs = Qs + kTile * ld;
  bf16* Ks = dOs + kTile * ld;
  bf16* Vs = Ks + kTile * ld;
  bf16* Kt = Vs + kTile * ld;

  const int h = blockIdx.y, kh = h / (H / Hkv), doc = blockIdx.z;
  const int64_t start = cu[doc];
  const int len = cu[doc + 1] - cu[doc];
  const int q0 = blockIdx.x * kTile;
  if (q0 >= len) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const float scale_log2 = scale * kLog2e;

  load_tile<D, false>(Qs, q, start + q0, len - q0, H, h, hd);
  load_tile<D, false>(dOs, dout, start + q0, len - q0, H, h, hd);
  const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  float lse2[2], dl[2];
  for (int r = 0; r < 2; ++r) {
    const bool ok = row[r] < len;
    lse2[r] = ok ? lse[int64_t(h) * N + start + row[r]] * kLog2e : 0.f;
    dl[r] = ok ? delta[int64_t(h) * N + start + row[r]] : 0.f;
  }
  float acc[D / 8][4];
  for (int i = 0; i < D / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

  const int last_tile = min(q0 + kTile - 1, len - 1) / kTile;
  for (int kt = 0; kt <= last_tile; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();
    load_tile<D, false>(Ks, k, start + k0, len - k0, Hkv, kh, hd);
    load_tile<D, false>(Vs, v, start + k0, len - k0, Hkv, kh, hd);
    load_tile<D, true>(Kt, k, start + k0, len - k0, Hkv, kh, hd);
    __syncthreads();
    float p[kTile / 8][4], ds[kTile / 8][4];
    for (int nt = 0; nt < kTile / 8; ++nt) {
      for (int e = 0; e < 4; ++e) p[nt][e] = ds[nt][e] = 0.f;
      for (int kst = 0; kst < D / 16; ++kst) {
        uint32_t a[4], b[2];
        load_a(a, Qs + warp * 16 * ld + kst * 16, ld);
        load_b(b, Ks + nt * 8 * ld + kst * 16, ld);
        mma(p[nt], a, b);  // S
        load_a(a, dOs + warp * 16 * ld + kst * 16, ld);
        load_b(b, Vs + nt * 8 * ld + kst * 16, ld);
        mma(ds[nt], a, b);  // dP
      }
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2, kc = k0 + nt * 8 + 2 * t + (e & 1);
        const bool ok = kc <= row[r] && kc < len && row[r] < len;
        const float pe = ok ? exp2f(p[nt][e] * scale_log2 - lse2[r]) : 0.f;
        ds[nt][e] = pe * (ds[nt][e] - dl[r]);
      }
    }
    for (int kk = 0; kk < kTile / 16; ++kk) {
      uint32_t a[4];
      c_to_a(a, ds[2 * kk], ds[2 * kk + 1]);
      for (int dt = 0; dt < D / 8; ++dt) {
        uint32_t b[2];
        load_b(b, Kt + dt * 8 * ldt + kk * 16, ldt);
        mma(acc[dt], a, b);
      }
    }
  }
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= len) continue;
    bf16* dst = dq + ((start + row[r]) * H + h) * hd;
    for (int dt = 0; dt < D / 8; ++dt)
      for (int j = 0; j < 2; ++j) {
        const int c = dt * 8 + 2 * t + j;
        if (c < hd) dst[c] = cuda::to_bf(acc[dt][2 * r + j] * scale);
      }
  }
}

template <int D>
void launch_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                     const Tensor& k, const Tensor& v, const Tensor& lse, const float* delta, const SeqLayout& seq,
                     float scale, cudaStream_t s) {
  static bool configured = false;
  if (!configured) {
    CUDA_CHECK(cudaFuncSetAttribute(flash_backward_dkdv<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(dkdv_smem<D>())));
    CUDA_CHECK(
        cudaFuncSetAttribute(flash_backward_dq<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(dq_smem<D>())));
    configured = true;
  }
  const int H = int(q.dim(1)), Hkv = int(k.dim(1)), hd = int(q.dim(2));
  const int64_t N = q.dim(0);
  const unsigned tiles = unsigned((seq.max_seqlen + kTile - 1) / kTile), docs = unsigned(seq.cu_seqlens.numel() - 1);
  flash_backward_dkdv<D><<<dim3(tiles, unsigned(Hkv), docs), kWarps * 32, dkdv_smem<D>(), s>>>(
      dk.as<bf16>(), dv.as<bf16>(), q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), dout.as<bf16>(), lse.f32(), delta,
      seq.cu_seqlens.i32(), N, H, Hkv, hd, scale);
  CUDA_CHECK_LAUNCH();
  flash_backward_dq<D><<<dim3(tiles, unsigned(H), docs), kWarps * 32, dq_smem<D>(), s>>>(
      dq.as<bf16>(), q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), dout.as<bf16>(), lse.f32(), delta,
      seq.cu_seqlens.i32(), N, H, Hkv, hd, scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void CudaOps::attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q,
                                 const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                                 const SeqLayout& seq, float scale) {
  const int64_t N = q.dim(0), H = q.dim(1), hd = q.dim(2);
  float* delta = static_cast<float*>(scratch(size_t(N * H) * sizeof(float)));
  attention_delta<<<unsigned((N * H + 7) / 8), 256, 0, stream_>>>(delta, dout.as<bf16>(), out.as<bf16>(), N, int(H),
                                                                   int(hd));
  CUDA_CHECK_LAUNCH();
  if (hd <= 32)
    launch_backward<32>(dq, dk, dv, dout, q, k, v, lse, delta, seq, scale, stream_);
  else if (hd <= 64)
    launch_backward<64>(dq, dk, dv, dout, q, k, v, lse, delta, seq, scale, stream_);
  else if (hd <= 128)
    launch_backward<128>(dq, dk, dv, dout, q, k, v, lse, delta, seq, scale, stream_);
  else
    user_error("head_dim ", hd, " is not supported on CUDA yet (at most 128)");
}

}  // namespace soltrain
