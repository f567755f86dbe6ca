// CUDA: attention of new query tokens against a bf16 KV cache (decoding and prefill). One block per
// (query, head); its warps take every kWarps-th key with an online fp32 softmax, then merge.
#include <cmath>

#include "core/error.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace soltrain {

using cuda::bf16;

namespace {
constexpr int kWarps = 8;
constexpr int kMaxPerLane = 8;  // head_dim ≤ 32·8 = 256

// Lane `lane` owns elements c = lane + 32·i of the head. Keys are walked one per warp iteration: a decode
// query has at most a few thousand keys per block and this keeps every warp's loads coalesced.
__global__ void attention_decode_kernel(bf16* out, const bf16* q, const bf16* kc, const bf16* vc, const int32_t* lens,
                                        int Tq, int H, int Hkv, int S, int hd, float scale) {
  const int row = blockIdx.x, h = blockIdx.y, b = row / Tq, t = row % Tq;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, kh = h / (H / Hkv);
  const int pos = lens[b] - Tq + t;  // attends to keys 0..pos
  float qv[kMaxPerLane], acc[kMaxPerLane];
  const bf16* qi = q + (int64_t(row) * H + h) * hd;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int c = lane + 32 * i;
    qv[i] = c < hd ? cuda::to_f(qi[c]) : 0.f;
    acc[i] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  const int64_t stride = int64_t(Hkv) * hd;
  const bf16* kb = kc + (int64_t(b) * S * Hkv + kh) * hd;
  const bf16* vb = vc + (int64_t(b) * S * Hkv + kh) * hd;
  for (int j = warp; j <= pos; j += kWarps) {
    const bf16* kj = kb + j * stride;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int c = lane + 32 * i;
      if (c < hd) s += qv[i] * cuda::to_f(kj[c]);
    }
    s = cuda::warp_sum(s) * scale;
    const float m_new = fmaxf(m, s), corr = __expf(m - m_new), p = __expf(s - m_new);
    l = l * corr + p;
    const bf16* vj = vb + j * stride;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int c = lane + 32 * i;
      if (c < hd) acc[i] = acc[i] * corr + p * cuda::to_f(vj[c]);
    }
    m = m_new;
  }
  // Merge the warps' partial softmaxes: out = Σ_w acc_w·e^(m_w−M) / Σ_w l_w·e^(m_w−M).
  __shared__ float sm[kWarps], sl[kWarps], sacc[kWarps][32 * kMaxPerLane];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) sacc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm[w]);
  float L = 0.f;
  for (int w = 0; w < kWarps; ++w) L += sm[w] == -INFINITY ? 0.f : sl[w] * __expf(sm[w] - M);
  bf16* o = out + (int64_t(row) * H + h) * hd;
  for (int c = threadIdx.x; c < hd; c += blockDim.x) {
    float v = 0.f;
    for (int w = 0; w < kWarps; ++w)
      if (sm[w] != -INFINITY) v += sacc[w][c] * __expf(sm[w] - M);
    o[c] = cuda::to_bf(v / L);
  }
}
// One block per new token: its key and value rows into the cache at lens[b] − Tq + t (16-byte pieces where
// the row allows, else 2-byte elements).
__global__ void kv_append_kernel(bf16* kc, bf16* vc, const bf16* k, const bf16* v, const int32_t* lens, int Tq, int S,
                                 int row) {
  const int token = blockIdx.x, b = token / Tq, t = token % Tq;
  const int64_t at = (int64_t(b) * S + lens[b] - Tq + t) * row, from = int64_t(token) * row;
  if (row % 8 == 0) {
    const int4* ks = reinterpret_cast<const int4*>(k + from);
    const int4* vs = reinterpret_cast<const int4*>(v + from);
    int4* kd = reinterpret_cast<int4*>(kc + at);
    int4* vd = reinterpret_cast<int4*>(vc + at);
    for (int i = threadIdx.x; i < row / 8; i += blockDim.x) kd[i] = ks[i], vd[i] = vs[i];
  } else {
    for (int i = threadIdx.x; i < row; i += blockDim.x) kc[at + i] = k[from + i], vc[at + i] = v[from + i];
  }
}
}  // namespace

void CudaOps::kv_append(Tensor k_cache, Tensor v_cache, const Tensor& k, const Tensor& v, const Tensor& lens) {
  const auto prof = profile("kv_append");
  const int64_t B = k_cache.dim(0), S = k_cache.dim(1), row = k_cache.dim(2) * k_cache.dim(3);
  const int64_t tokens = k.dim(0);
  SOLTRAIN_CHECK(B > 0 && tokens % B == 0 && k.numel() == tokens * row && v.numel() == k.numel() && lens.numel() == B,
                 "kv_append shapes");
  if (tokens == 0) return;
  kv_append_kernel<<<unsigned(tokens), 128, 0, stream_>>>(k_cache.as<bf16>(), v_cache.as<bf16>(), k.as<bf16>(),
                                                          v.as<bf16>(), lens.i32(), int(tokens / B), int(S), int(row));
  CUDA_CHECK_LAUNCH();
}

void CudaOps::attention_decode(Tensor out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                               const Tensor& lens, float scale) {
  const auto prof = profile("attention_decode");
  const int64_t B = k_cache.dim(0), S = k_cache.dim(1), Hkv = k_cache.dim(2), hd = k_cache.dim(3);
  const int64_t rows = q.dim(0), H = q.dim(1);
  SOLTRAIN_CHECK(rows % B == 0 && q.dim(2) == hd && lens.numel() == B && H % Hkv == 0, "attention_decode shapes");
  if (hd > 32 * kMaxPerLane) user_error("head_dim ", hd, " is above the decoder's limit of ", 32 * kMaxPerLane);
  if (rows == 0) return;
  const dim3 grid{unsigned(rows), unsigned(H)};
  attention_decode_kernel<<<grid, 32 * kWarps, 0, stream_>>>(out.as<bf16>(), q.as<bf16>(), k_cache.as<bf16>(),
                                                             v_cache.as<bf16>(), lens.i32(), int(rows / B), int(H),
                                                             int(Hkv), int(S), int(hd), scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace soltrain
