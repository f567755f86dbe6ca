// CUDA: flash attention forward (FA2 scheme on mma.sync tensor cores, sm_80+): causal, packed documents
// by cu_seqlens, GQA by head mapping, online softmax in fp32 registers, log-sum-exp saved for backward.
// Block = 4 warps x 16 query rows; K/V tiles of 64 keys stream through shared memory.
#include <cfloat>

#include "core/error.h"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_ops.h"

namespace soltrain {

using namespace cuda::attn;
using cuda::bf16;

namespace {

template <int D>
constexpr size_t forward_smem() {
  return size_t(2 * kTile * (D + kPad) + D * (kTile + kPad)) * sizeof(bf16);
}

template <int D>
__global__ void __launch_bounds__(kWarps * 32)
    flash_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const int32_t* cu, int64_t N,
                  int H, int Hkv, int hd, float scale_log2) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* Ks = Qs + kTile * (D + kPad);
  bf16* Vt = Ks + kTile * (D + kPad);
  constexpr int ld = D + kPad, ldt = kTile + kPad;

  const int h = blockIdx.y, kh = h / (H / Hkv), doc = blockIdx.z;
  const int64_t start = cu[doc];
  const int len = cu[doc + 1] - cu[doc];
  const int q0 = blockIdx.x * kTile;
  if (q0 >= len) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;

  load_tile<D, false>(Qs, q, start + q0, len - q0, H, h, hd);

  float o[D / 8][4];
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m[2] = {-FLT_MAX, -FLT_MAX}, l[2] = {0.f, 0.f};
  const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};  // within the document

  const int last_tile = min(q0 + kTile - 1, len - 1) / kTile;
  for (int kt = 0; kt <= last_tile; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // previous tile fully consumed
    load_tile<D, false>(Ks, k, start + k0, len - k0, Hkv, kh, hd);
    load_tile<D, true>(Vt, v, start + k0, len - k0, Hkv, kh, hd);
    __syncthreads();

    float s[kTile / 8][4];
    for (int nt = 0; nt < kTile / 8; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
      for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t a[4], b[2];
        load_a(a, Qs + warp * 16 * ld + ks * 16, ld);
        load_b(b, Ks + nt * 8 * ld + ks * 16, ld);
        mma(s[nt], a, b);
      }
    }
    // scale into the log2 domain, mask, and take this tile's row maxima
    float mx[2] = {-FLT_MAX, -FLT_MAX};
    for (int nt = 0; nt < kTile / 8; ++nt)
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + nt * 8 + 2 * t + (e & 1), r = e / 2;
        const bool ok = key <= row[r] && key < len;
        s[nt][e] = ok ? s[nt][e] * scale_log2 : -FLT_MAX;
        mx[r] = fmaxf(mx[r], s[nt][e]);
      }
    float alpha[2];
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m[r], mx[r]);
      alpha[r] = exp2f(m[r] - m_new);
      m[r] = m_new;
      l[r] *= alpha[r];
    }
    for (int nt = 0; nt < kTile / 8; ++nt)
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2;
        const float p = s[nt][e] == -FLT_MAX ? 0.f : exp2f(s[nt][e] - m[r]);
        s[nt][e] = p;
        l[r] += p;
      }
    for (int dt = 0; dt < D / 8; ++dt) {
      o[dt][0] *= alpha[0];
      o[dt][1] *= alpha[0];
      o[dt][2] *= alpha[1];
      o[dt][3] *= alpha[1];
    }
    for (int kk = 0; kk < kTile / 16; ++kk) {
      uint32_t a[4];
      c_to_a(a, s[2 * kk], s[2 * kk + 1]);
      for (int dt = 0; dt < D / 8; ++dt) {
        uint32_t b[2];
        load_b(b, Vt + dt * 8 * ldt + kk * 16, ldt);
        mma(o[dt], a, b);
      }
    }
  }
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= len) continue;
    const float inv = 1.f / l[r];
    bf16* dst = out + ((start + row[r]) * H + h) * hd;
    for (int dt = 0; dt < D / 8; ++dt) {
      const int c = dt * 8 + 2 * t;
      if (c < hd) dst[c] = cuda::to_bf(o[dt][2 * r] * inv);
      if (c + 1 < hd) dst[c + 1] = cuda::to_bf(o[dt][2 * r + 1] * inv);
    }
    if (t == 0) lse[int64_t(h) * N + start + row[r]] = (m[r] + log2f(l[r])) / kLog2e;
  }
}

template <int D>
void launch_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                    const SeqLayout& seq, float scale, cudaStream_t s) {
  static bool configured = false;
  if (!configured) {
    CUDA_CHECK(cudaFuncSetAttribute(flash_forward<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(forward_smem<D>())));
    configured = true;
  }
  const int H = int(q.dim(1)), Hkv = int(k.dim(1)), hd = int(q.dim(2));
  const dim3 grid(unsigned((seq.max_seqlen + kTile - 1) / kTile), unsigned(H), unsigned(seq.cu_seqlens.numel() - 1));
  flash_forward<D><<<grid, kWarps * 32, forward_smem<D>(), s>>>(out.as<bf16>(), lse.f32(), q.as<bf16>(),
                                                                k.as<bf16>(), v.as<bf16>(), seq.cu_seqlens.i32(),
                                                                q.dim(0), H, Hkv, hd, scale * kLog2e);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void CudaOps::attention_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                                const SeqLayout& seq, float scale) {
  const int64_t hd = q.dim(2);
  if (hd <= 32)
    launch_forward<32>(out, lse, q, k, v, seq, scale, stream_);
  else if (hd <= 64)
    launch_forward<64>(out, lse, q, k, v, seq, scale, stream_);
  else if (hd <= 128)
    launch_forward<128>(out, lse, q, k, v, seq, scale, stream_);
  else
    user_error("head_dim ", hd, " is not supported on CUDA yet (at most 128)");
}

}  // namespace soltrain
