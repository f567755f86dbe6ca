// CUDA: Qwen3's per-head q/k RMSNorm fused with RoPE, forward and backward. Backward: a fixed grid of blocks
// strides over the tokens (one warp per head row); a token's sin/cos (full-precision sincosf, the costly part)
// are computed once into shared memory for all its heads (forward: see qk_norm_rope_fwd). Each lane owns pairs (i, i +
// hd/2), so the rotation needs no shuffles. The backward also sums the norm weight's gradient: each lane keeps its
// columns' sums in registers across the block's tokens, the block writes one partial row, and a second pass adds the
// partials in block order (deterministic). Before, a separate column sum reread dy and x: the fused
// backward took 9.5 ms of a Qwen3-0.6B step, about twice its memory time.
// Head dims whose half is odd or above 128 take the separate ops (Ops' defaults).
// Rounding follows transformers under bf16 autocast: the normalised value is rounded to bf16 (q and k are
// bf16, and Qwen3's norm casts x̂ back to its input's dtype), the weight's product and the rotation stay in
// fp32, and y is rounded once. (The separate ops, which head dims this kernel does not serve take, round
// after the weight and after the rotation too: within a bf16 ulp of this.)
#include <algorithm>
#include <type_traits>

#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/launchers.h"

namespace soltrain {

using cuda::bf16;
using cuda::to_bf;
using cuda::to_f;

namespace {
constexpr int kWarps = 8;

// Blocks per SM for the token-striding grids: enough to hide latency, few enough that the backward's
// per-block partial rows of the weight gradient stay small.
constexpr int kBlocksPerSm = 4;

// cs[i] = cos, cs[half + i] = sin of token n's angle i (sin negated for the inverse rotation). The leading
// barrier keeps the previous token's angles until every warp is done with them.
__device__ __forceinline__ void token_angles(float* cs, const int32_t* pos, const float* inv_freq, int64_t n, int half,
                                             float sign) {
  __syncthreads();
  for (int i = threadIdx.y * 32 + threadIdx.x; i < half; i += kWarps * 32) {
    float s, c;
    sincosf(float(pos[n]) * inv_freq[i], &s, &c);
    cs[i] = c;
    cs[half + i] = sign * s;
  }
  __syncthreads();
}

// Forward: one warp per token, no shared memory and no barriers. Lane j owns the column pairs (i, i+1) and
// (i + half, i + half + 1) for i = 2j + 64m, m < kIters (4-byte accesses; half must be even), so it needs the
// angles i and i+1 alone: it computes their sin/cos itself, once per token, for all the token's heads, and
// keeps its norm weights in registers. kRows heads are loaded before any is reduced, so a warp has that many
// rows in flight. (A block per token with the angles in shared memory, two barriers per token and one row per
// warp at a time kept too few loads in flight: 1.4 TB/s, 3.9 ms of a Qwen3-0.6B step.)
constexpr int kFwdRows = 4;
template <int kIters>
__global__ void qk_norm_rope_fwd(bf16* y, float* rstd, const bf16* x, const bf16* w, const int32_t* pos,
                                 const float* inv_freq, int64_t N, int heads, int half, float eps, int slices) {
  const int C = 2 * half;
  float wlo[kIters][2], whi[kIters][2], freq[kIters][2];
#pragma unroll
  for (int m = 0; m < kIters; ++m) {
    const int i = 2 * threadIdx.x + 64 * m;
    wlo[m][0] = wlo[m][1] = whi[m][0] = whi[m][1] = freq[m][0] = freq[m][1] = 0.f;
    if (i >= half) continue;
    wlo[m][0] = to_f(w[i]), wlo[m][1] = to_f(w[i + 1]), whi[m][0] = to_f(w[i + half]),
    whi[m][1] = to_f(w[i + half + 1]);
    freq[m][0] = inv_freq[i], freq[m][1] = inv_freq[i + 1];
  }
  // A warp per (token, slice of its heads): `slices` > 1 when there are too few tokens to fill the GPU (decoding).
  const int per = (heads + slices - 1) / slices;
  for (int64_t item = int64_t(blockIdx.x) * kWarps + threadIdx.y; item < N * slices;
       item += int64_t(gridDim.x) * kWarps) {
    const int64_t n = item / slices;
    const int h_begin = int(item % slices) * per, h_end = min(heads, h_begin + per);
    float cs[kIters][2], sn[kIters][2];
    const float p = float(pos[n]);
#pragma unroll
    for (int m = 0; m < kIters; ++m) {
      sincosf(p * freq[m][0], &sn[m][0], &cs[m][0]);
      sincosf(p * freq[m][1], &sn[m][1], &cs[m][1]);
    }
    for (int h0 = h_begin; h0 < h_end; h0 += kFwdRows) {
      float2 lo[kFwdRows][kIters], hi[kFwdRows][kIters];  // x at (i, i+1) and (i + half, i + half + 1)
#pragma unroll
      for (int r = 0; r < kFwdRows; ++r)
#pragma unroll
        for (int m = 0; m < kIters; ++m) {
          const int i = 2 * threadIdx.x + 64 * m;
          const int64_t row = n * heads + h0 + r;
          lo[r][m] = hi[r][m] = make_float2(0.f, 0.f);
          if (i < half && h0 + r < h_end) {
            lo[r][m] = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(x + row * C + i));
            hi[r][m] = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(x + row * C + i + half));
          }
        }
#pragma unroll
      for (int r = 0; r < kFwdRows; ++r) {
        if (h0 + r >= h_end) break;
        const int64_t row = n * heads + h0 + r;
        float ss = 0.f;
#pragma unroll
        for (int m = 0; m < kIters; ++m)
          ss += lo[r][m].x * lo[r][m].x + lo[r][m].y * lo[r][m].y + hi[r][m].x * hi[r][m].x + hi[r][m].y * hi[r][m].y;
        const float rs = rsqrtf(cuda::warp_sum(ss) / float(C) + eps);
        if (threadIdx.x == 0) rstd[row] = rs;
        auto norm = [&](float v, float wv) { return wv * to_f(to_bf(v * rs)); };
#pragma unroll
        for (int m = 0; m < kIters; ++m) {
          const int i = 2 * threadIdx.x + 64 * m;
          if (i >= half) continue;
          const float a0 = norm(lo[r][m].x, wlo[m][0]), a1 = norm(lo[r][m].y, wlo[m][1]);
          const float b0 = norm(hi[r][m].x, whi[m][0]), b1 = norm(hi[r][m].y, whi[m][1]);
          const float c0 = cs[m][0], s0 = sn[m][0], c1 = cs[m][1], s1 = sn[m][1];
          *reinterpret_cast<__nv_bfloat162*>(y + row * C + i) =
              __floats2bfloat162_rn(a0 * c0 - b0 * s0, a1 * c1 - b1 * s1);
          *reinterpret_cast<__nv_bfloat162*>(y + row * C + i + half) =
              __floats2bfloat162_rn(b0 * c0 + a0 * s0, b1 * c1 + a1 * s1);
        }
      }
    }
  }
}

// dy is rotated back in place, then dx as rmsnorm_bwd computes it; with `partials`, each block's sum of
// dy_rotated · x · rstd per column (the weight gradient's share of its tokens) into partials[block][C].
template <int kIters>
__global__ void qk_norm_rope_bwd(bf16* dx, bf16* dy, const bf16* x, const bf16* w, const float* rstd,
                                 const int32_t* pos, const float* inv_freq, int64_t N, int heads, int half,
                                 float* partials) {
  extern __shared__ float smem[];
  float* cs = smem;  // then [kWarps][C] for the block's reduction of the weight gradient
  const int C = 2 * half;
  float2 dwlo[kIters], dwhi[kIters];
#pragma unroll
  for (int m = 0; m < kIters; ++m) dwlo[m] = dwhi[m] = make_float2(0.f, 0.f);
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    token_angles(cs, pos, inv_freq, n, half, -1.f);
    for (int h = threadIdx.y; h < heads; h += kWarps) {
      const int64_t row = n * heads + h;
      const float rs = rstd[row];
      float2 glo[kIters], ghi[kIters], xlo[kIters], xhi[kIters], wlo[kIters], whi[kIters];
      float dot = 0.f;
#pragma unroll
      for (int m = 0; m < kIters; ++m) {
        const int i = 2 * threadIdx.x + 64 * m;
        glo[m] = ghi[m] = xlo[m] = xhi[m] = wlo[m] = whi[m] = make_float2(0.f, 0.f);
        if (i >= half) continue;
        auto load = [&](const bf16* p) { return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p)); };
        const float2 a = load(dy + row * C + i), b = load(dy + row * C + i + half);
        const float c0 = cs[i], s0 = cs[half + i], c1 = cs[i + 1], s1 = cs[half + i + 1];
        const __nv_bfloat162 ga = __floats2bfloat162_rn(a.x * c0 - b.x * s0, a.y * c1 - b.y * s1);
        const __nv_bfloat162 gb = __floats2bfloat162_rn(b.x * c0 + a.x * s0, b.y * c1 + a.y * s1);
        *reinterpret_cast<__nv_bfloat162*>(dy + row * C + i) = ga;
        *reinterpret_cast<__nv_bfloat162*>(dy + row * C + i + half) = gb;
        glo[m] = __bfloat1622float2(ga);
        ghi[m] = __bfloat1622float2(gb);
        xlo[m] = load(x + row * C + i);
        xhi[m] = load(x + row * C + i + half);
        wlo[m] = load(w + i);
        whi[m] = load(w + i + half);
        dot += glo[m].x * wlo[m].x * xlo[m].x * rs + glo[m].y * wlo[m].y * xlo[m].y * rs;
        dot += ghi[m].x * whi[m].x * xhi[m].x * rs + ghi[m].y * whi[m].y * xhi[m].y * rs;
      }
      const float mean = cuda::warp_sum(dot) / float(C);
      auto grad = [&](float g, float wv, float xv) { return rs * (g * wv - xv * rs * mean); };
#pragma unroll
      for (int m = 0; m < kIters; ++m) {
        const int i = 2 * threadIdx.x + 64 * m;
        if (i >= half) continue;
        *reinterpret_cast<__nv_bfloat162*>(dx + row * C + i) =
            __floats2bfloat162_rn(grad(glo[m].x, wlo[m].x, xlo[m].x), grad(glo[m].y, wlo[m].y, xlo[m].y));
        *reinterpret_cast<__nv_bfloat162*>(dx + row * C + i + half) =
            __floats2bfloat162_rn(grad(ghi[m].x, whi[m].x, xhi[m].x), grad(ghi[m].y, whi[m].y, xhi[m].y));
        dwlo[m].x += glo[m].x * xlo[m].x * rs;
        dwlo[m].y += glo[m].y * xlo[m].y * rs;
        dwhi[m].x += ghi[m].x * xhi[m].x * rs;
        dwhi[m].y += ghi[m].y * xhi[m].y * rs;
      }
    }
  }
  if (!partials) return;
  // The warps' column sums, then their sum in warp order: one partial row per block.
  __syncthreads();  // the angles are no longer read; their space and the rest hold the warps' sums
  float* red = smem + threadIdx.y * C;
#pragma unroll
  for (int m = 0; m < kIters; ++m) {
    const int i = 2 * threadIdx.x + 64 * m;
    if (i >= half) continue;
    red[i] = dwlo[m].x;
    red[i + 1] = dwlo[m].y;
    red[i + half] = dwhi[m].x;
    red[i + half + 1] = dwhi[m].y;
  }
  __syncthreads();
  for (int c = threadIdx.y * 32 + threadIdx.x; c < C; c += kWarps * 32) {
    float s = 0.f;
    for (int wi = 0; wi < kWarps; ++wi) s += smem[wi * C + c];
    partials[int64_t(blockIdx.x) * C + c] = s;
  }
}

// Calls f(std::integral_constant<int, kIters>{}) for a head dim the kernels serve; false when they don't
// (an odd half, or hd > 256), and the caller falls back to the separate ops.
template <typename F>
bool with_iters(int64_t half, F&& f) {
  if (half % 2 != 0 || half > 128) return false;
  if (half <= 64)
    f(std::integral_constant<int, 1>{});
  else
    f(std::integral_constant<int, 2>{});
  return true;
}
}  // namespace

void CudaOps::qk_norm_rope_forward(Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, const SeqLayout& seq,
                                   const Tensor& inv_freq, float eps) {
  const int64_t N = x.dim(0), heads = x.dim(1), half = x.dim(2) / 2;
  // A warp per token, grid-stride: 8 blocks of 8 warps per SM (full occupancy) at most. With fewer tokens than
  // two warps per SM (decoding), each token's heads split over warps, kFwdRows heads or more each.
  const int64_t slices =
      std::clamp<int64_t>(int64_t(sm_count_) * 16 / std::max<int64_t>(N, 1), 1, std::max<int64_t>(heads / kFwdRows, 1));
  const unsigned blocks = unsigned(std::min<int64_t>((N * slices + kWarps - 1) / kWarps, int64_t(sm_count_) * 8));
  const bool fused = with_iters(half, [&](auto iters) {
    const auto prof = profile("qk_norm_rope_forward");
    qk_norm_rope_fwd<iters.value><<<blocks, dim3(32, kWarps), 0, stream_>>>(
        y.as<bf16>(), rstd.f32(), x.as<bf16>(), w.as<bf16>(), seq.positions.i32(), inv_freq.f32(), N, int(heads),
        int(half), eps, int(slices));
    CUDA_CHECK_LAUNCH();
  });
  if (!fused) Ops::qk_norm_rope_forward(y, rstd, x, w, seq, inv_freq, eps);
}

void CudaOps::qk_norm_rope_backward(Tensor dx, Tensor dw, Tensor dy, const Tensor& x, const Tensor& w,
                                    const Tensor& rstd, const SeqLayout& seq, const Tensor& inv_freq) {
  const int64_t N = x.dim(0), heads = x.dim(1), half = x.dim(2) / 2, C = 2 * half;
  const unsigned blocks = unsigned(std::min<int64_t>(N, int64_t(sm_count_) * kBlocksPerSm));
  const bool fused = with_iters(half, [&](auto iters) {
    const auto prof = profile("qk_norm_rope_backward");
    // A frozen weight (dw undefined) needs no gradient: no partials.
    float* partials = dw.defined() ? static_cast<float*>(scratch(size_t(blocks) * size_t(C) * 4)) : nullptr;
    const size_t smem = size_t(std::max<int64_t>(2 * half, int64_t(kWarps) * C)) * sizeof(float);
    qk_norm_rope_bwd<iters.value><<<blocks, dim3(32, kWarps), smem, stream_>>>(
        dx.as<bf16>(), dy.as<bf16>(), x.as<bf16>(), w.as<bf16>(), rstd.f32(), seq.positions.i32(), inv_freq.f32(), N,
        int(heads), int(half), partials);
    CUDA_CHECK_LAUNCH();
    if (!partials) return;
    cuda::add_partial_rows(dw.f32(), partials, int(blocks), C, stream_);
  });
  if (!fused) Ops::qk_norm_rope_backward(dx, dw, dy, x, w, rstd, seq, inv_freq);
}

}  // namespace soltrain
