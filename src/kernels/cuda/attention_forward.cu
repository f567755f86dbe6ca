// CUDA: flash attention forward (FA2 scheme on mma.sync tensor cores, sm_80+): causal, packed documents
// by cu_seqlens, GQA by head mapping, online softmax in fp32 registers, log-sum-exp saved for backward.
// Block = 8 warps x 16 query rows (128 queries); K/V tiles of 64 keys are double-buffered through shared
// memory by cp.async, so the next tile loads while this one is multiplied.
#include <cfloat>

#include "core/error.h"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_sm90.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_ops.h"

namespace soltrain {

using namespace cuda::attn;
using cuda::bf16;

namespace {

constexpr int kWarps = 8, kRows = 16 * kWarps;

template <int D>
constexpr size_t forward_smem() {
  return size_t(kRows + 4 * kTile) * (D + kPad) * sizeof(bf16);  // Q, then K and V twice
}

template <int D, bool kAsync>
__global__ void __launch_bounds__(kWarps * 32)
    flash_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const int32_t* cu, int64_t N,
                  int H, int Hkv, int hd, float scale_log2) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int ld = D + kPad;
  bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
  // double buffers by offset arithmetic (an array of pointers indexed at run time would live in local memory)
  bf16* const Kb = Qs + kRows * ld;
  bf16* const Vb = Kb + 2 * kTile * ld;

  const int h = blockIdx.y, kh = h / (H / Hkv), doc = blockIdx.z;
  const int64_t start = cu[doc];
  const int len = cu[doc + 1] - cu[doc];
  // Longest-running blocks (most keys) first: reverse the tile order.
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kRows;
  if (q0 >= len) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int wq0 = q0 + warp * 16;  // this warp's first query

  load_rows<D, kRows, kAsync>(Qs, q, start + q0, len - q0, H, h, hd);
  load_rows<D, kTile, kAsync>((Kb + (0) * kTile * ld), k, start, len, Hkv, kh, hd);
  load_rows<D, kTile, kAsync>((Vb + (0) * kTile * ld), v, start, len, Hkv, kh, hd);
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();

  uint32_t qf[D / 16][4];
  for (int ks = 0; ks < D / 16; ++ks) load_a(qf[ks], Qs + warp * 16 * ld + ks * 16, ld);

  float o[D / 8][4];
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m[2] = {-FLT_MAX, -FLT_MAX}, l[2] = {0.f, 0.f};
  const int row[2] = {wq0 + g, wq0 + g + 8};

  const int last_tile = min(q0 + kRows - 1, len - 1) / kTile;
  for (int kt = 0; kt <= last_tile; ++kt) {
    const int k0 = kt * kTile, buf = kt % 2;
    if (kt < last_tile) {  // prefetch the next tile into the other buffer (freed by the last barrier)
      load_rows<D, kTile, kAsync>((Kb + (buf ^ 1) * kTile * ld), k, start + k0 + kTile, len - k0 - kTile, Hkv, kh, hd);
      load_rows<D, kTile, kAsync>((Vb + (buf ^ 1) * kTile * ld), v, start + k0 + kTile, len - k0 - kTile, Hkv, kh, hd);
      cp_async_commit();
    }
    if (k0 <= wq0 + 15) {  // warps whose queries all precede this tile skip it
      float s[kTile / 8][4];
      for (int i = 0; i < kTile / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
      for (int ks = 0; ks < D / 16; ++ks)
        for (int np = 0; np < kTile / 16; ++np) {
          uint32_t b0[2], b1[2];
          load_b2(b0, b1, (Kb + (buf)*kTile * ld) + np * 16 * ld + ks * 16, ld);
          mma(s[2 * np], qf[ks], b0);
          mma(s[2 * np + 1], qf[ks], b1);
        }
      // scale into the log2 domain; mask only where the tile crosses the diagonal or the document end
      const bool masked = k0 + kTile - 1 > wq0 || k0 + kTile > len;
      float mx[2] = {-FLT_MAX, -FLT_MAX};
      for (int nt = 0; nt < kTile / 8; ++nt)
        for (int e = 0; e < 4; ++e) {
          const int key = k0 + nt * 8 + 2 * t + (e & 1), r = e / 2;
          const bool ok = !masked || (key <= row[r] && key < len);
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
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t b0[2], b1[2];
          load_b2_trans(b0, b1, (Vb + (buf)*kTile * ld) + kk * 16 * ld + dp * 16, ld);
          mma(o[2 * dp], a, b0);
          mma(o[2 * dp + 1], a, b1);
        }
      }
    }
    cp_async_wait_all();
    __syncthreads();  // the next tile has landed; this one may be overwritten
  }
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= len) continue;
    const float inv = 1.f / l[r];
    bf16* dst = out + ((start + row[r]) * H + h) * int64_t(hd);
    for (int dt = 0; dt < D / 8; ++dt) {
      const int c = dt * 8 + 2 * t;
      if (c + 1 < hd) {  // hd is even (config check), so pairs never straddle the end
        *reinterpret_cast<__nv_bfloat162*>(dst + c) = __floats2bfloat162_rn(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
      } else if (c < hd) {
        dst[c] = cuda::to_bf(o[dt][2 * r] * inv);
      }
    }
    if (t == 0) lse[int64_t(h) * N + start + row[r]] = (m[r] + log2f(l[r])) / kLog2e;
  }
}

template <int D, bool kAsync>
void launch(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
            const SeqLayout& seq, float scale, cudaStream_t s) {
  static bool configured = false;
  if (!configured) {
    CUDA_CHECK(cudaFuncSetAttribute(flash_forward<D, kAsync>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(forward_smem<D>())));
    configured = true;
  }
  const int H = int(q.dim(1)), Hkv = int(k.dim(1)), hd = int(q.dim(2));
  const dim3 grid(unsigned((seq.max_seqlen + kRows - 1) / kRows), unsigned(H), unsigned(seq.cu_seqlens.numel() - 1));
  flash_forward<D, kAsync>
      <<<grid, kWarps * 32, forward_smem<D>(), s>>>(out.as<bf16>(), lse.f32(), q.as<bf16>(), k.as<bf16>(), v.as<bf16>(),
                                                    seq.cu_seqlens.i32(), q.dim(0), H, Hkv, hd, scale * kLog2e);
  CUDA_CHECK_LAUNCH();
}

template <int D>
void launch_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                    const SeqLayout& seq, float scale, cudaStream_t s) {
  if (q.dim(2) == D)
    launch<D, true>(out, lse, q, k, v, seq, scale, s);
  else
    launch<D, false>(out, lse, q, k, v, seq, scale, s);  // head_dim padded up to D: plain loads
}

}  // namespace

int64_t CudaOps::max_attention_head_dim() const {
  return kMaxHeadDim;
}

bool CudaOps::hopper_attention(int64_t head_dim) const {
  return hopper_attention_ && cuda::sm90_attention_head_dim(head_dim);
}

void CudaOps::attention_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                                const SeqLayout& seq, float scale) {
  const auto prof = profile("attention_forward");
  const int64_t hd = q.dim(2);
  if (hopper_attention(hd)) return cuda::flash_forward_sm90(out, lse, q, k, v, seq, scale, stream_);
  with_head_dim(hd, [&](auto D) { launch_forward<D.value>(out, lse, q, k, v, seq, scale, stream_); });
}

}  // namespace soltrain
