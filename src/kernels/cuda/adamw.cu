// CUDA: torch's AdamW update on fp32 masters, writing the bf16 compute copy in the same pass.
#include <algorithm>
#include <cmath>

#include "kernels/blockwise8.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace soltrain {

using cuda::bf16;

namespace {
__global__ void adamw_kernel(float* w, const float* g, float* m, float* v, bf16* copy, int64_t n, float decay,
                             float b1c, float beta2, float b2c, float step_size, float bc2_sqrt, float eps,
                             float grad_scale, const double* grad_sumsq, float max_grad_norm) {
  // Clipping's factor from Σg² on the device (the same double arithmetic as the host's clip_factor)
  if (grad_sumsq) grad_scale *= clip_factor(*grad_sumsq, max_grad_norm);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float wi = w[i] * decay;
    const float gi = g[i] * grad_scale;
    const float mi = m[i] + b1c * (gi - m[i]);
    const float vi = v[i] * beta2 + b2c * gi * gi;
    wi -= step_size * (mi / (sqrtf(vi) / bc2_sqrt + eps));
    w[i] = wi;
    m[i] = mi;
    v[i] = vi;
    if (copy) copy[i] = cuda::to_bf(wi);
  }
}

// bitsandbytes' 8-bit blockwise AdamW: one warp per quantisation block of 256 elements (8 per lane, lane +
// 32·k so each load is coalesced), many blocks per CTA. Each lane dequantises its elements' m and v, applies
// the update above, and the warp's max |m| and |v| (shuffles, no block barrier) give the absmax the new codes
// are quantised against (nearest map entry: binary search over the midpoints). The maps and their midpoints
// are staged in shared memory once per CTA, not once per 256 elements: one block per quantisation block spent
// most of its time there and in two barriers (69 ms for Qwen3-4B where fp32 AdamW takes 33; 58 with the
// warps, the binary searches then dominating: see quantize_bucketed).
constexpr int kWarpsPer8bitCta = 8;
__global__ void __launch_bounds__(32 * kWarpsPer8bitCta)
    adamw_8bit_kernel(float* w, const float* g, uint8_t* mc, uint8_t* vc, float* ma, float* va, const float* mmap,
                      const float* vmap, bf16* copy, int64_t n, float decay, float b1c, float beta2, float b2c,
                      float step_size, float bc2_sqrt, float eps, float grad_scale, const double* grad_sumsq,
                      float max_grad_norm) {
  __shared__ float smap[2][256], smid[2][255];
  __shared__ uint8_t below[2][2][kQuantBuckets];  // [moment][x < 0][bucket]: see quantize_bucketed
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    smap[0][i] = mmap[i];
    smap[1][i] = vmap[i];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 255; i += blockDim.x) {
    smid[0][i] = (smap[0][i] + smap[0][i + 1]) / 2;  // as torch: (code[:-1] + code[1:]) / 2
    smid[1][i] = (smap[1][i] + smap[1][i + 1]) / 2;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 2 * kQuantBuckets; i += blockDim.x)
    fill_quant_bucket(below[i / kQuantBuckets], i % kQuantBuckets, smid[i / kQuantBuckets]);
  __syncthreads();
  if (grad_sumsq) grad_scale *= clip_factor(*grad_sumsq, max_grad_norm);
  const int lane = int(threadIdx.x % 32);
  const int64_t blocks = (n + 255) / 256;
  for (int64_t blk = int64_t(blockIdx.x) * kWarpsPer8bitCta + threadIdx.x / 32; blk < blocks;
       blk += int64_t(gridDim.x) * kWarpsPer8bitCta) {
    const float mscale = ma[blk], vscale = va[blk];
    // Every load of the block first, then the arithmetic and the stores: loads interleaved with stores to
    // w (which the compiler must assume may alias them) would make eight round trips to memory in a row.
    float wv[8], gv[8], mi[8], vi[8], am = 0.f, av = 0.f;
    uint8_t mq[8], vq[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int64_t i = blk * 256 + k * 32 + lane;
      if (i < n) wv[k] = w[i], gv[k] = g[i], mq[k] = mc[i], vq[k] = vc[i];
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int64_t i = blk * 256 + k * 32 + lane;
      mi[k] = vi[k] = 0.f;
      if (i < n) {
        mi[k] = smap[0][mq[k]] * mscale;
        vi[k] = smap[1][vq[k]] * vscale;
        float wi = wv[k] * decay;
        const float gi = gv[k] * grad_scale;
        mi[k] = mi[k] + b1c * (gi - mi[k]);
        vi[k] = vi[k] * beta2 + b2c * gi * gi;
        wi -= step_size * (mi[k] / (sqrtf(vi[k]) / bc2_sqrt + eps));
        w[i] = wi;
        if (copy) copy[i] = cuda::to_bf(wi);
      }
      am = fmaxf(am, fabsf(mi[k]));
      av = fmaxf(av, fabsf(vi[k]));
    }
    for (int o = 16; o > 0; o >>= 1) {
      am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
      av = fmaxf(av, __shfl_xor_sync(0xffffffffu, av, o));
    }
    const float minv = 1.0f / fmaxf(am, 1e-38f), vinv = 1.0f / fmaxf(av, 1e-38f);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int64_t i = blk * 256 + k * 32 + lane;
      if (i < n) {
        mc[i] = quantize_bucketed(fminf(fmaxf(mi[k] * minv, -1.0f), 1.0f), smid[0], below[0]);
        vc[i] = quantize_bucketed(fminf(fmaxf(vi[k] * vinv, -1.0f), 1.0f), smid[1], below[1]);
      }
    }
    if (lane == 0) {
      ma[blk] = am;
      va[blk] = av;
    }
  }
}
}  // namespace

void CudaOps::adamw(Tensor master, const Tensor& grad, Tensor m, Tensor v, const AdamWParams& p, Tensor* compute_copy) {
  const auto prof = profile("adamw");
  const double bc1 = 1.0 - std::pow(p.beta1, p.step);
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(p.beta2, p.step));
  const int64_t n = master.numel();
  adamw_kernel<<<cuda::blocks_for(n, 256, 8 * 1024), 256, 0, stream_>>>(
      master.f32(), grad.f32(), m.f32(), v.f32(), compute_copy ? compute_copy->as<bf16>() : nullptr, n,
      float(1.0 - double(p.lr) * double(p.weight_decay)), float(1.0 - p.beta1), float(p.beta2), float(1.0 - p.beta2),
      float(double(p.lr) / bc1), float(bc2_sqrt), p.eps, p.grad_scale,
      p.grad_sumsq ? static_cast<const double*>(p.grad_sumsq->data) : nullptr, p.max_grad_norm);
  CUDA_CHECK_LAUNCH();
}

void CudaOps::adamw_8bit(Tensor master, const Tensor& grad, const Blockwise8& m, const Blockwise8& v,
                         const AdamWParams& p, Tensor* compute_copy) {
  const auto prof = profile("adamw_8bit");
  const double bc1 = 1.0 - std::pow(p.beta1, p.step);
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(p.beta2, p.step));
  const int64_t n = master.numel(), blocks = (n + kBlockwise8Block - 1) / kBlockwise8Block;
  static_assert(kBlockwise8Block == 256, "one warp per quantisation block, 8 elements per lane");
  // Enough CTAs to fill the GPU several times over; each warp then walks the blocks grid-stride.
  const int64_t ctas = std::min<int64_t>((blocks + kWarpsPer8bitCta - 1) / kWarpsPer8bitCta, 132 * 8);
  adamw_8bit_kernel<<<unsigned(ctas), 32 * kWarpsPer8bitCta, 0, stream_>>>(
      master.f32(), grad.f32(), m.code.as<uint8_t>(), v.code.as<uint8_t>(), m.absmax.f32(), v.absmax.f32(), m.map.f32(),
      v.map.f32(), compute_copy ? compute_copy->as<bf16>() : nullptr, n,
      float(1.0 - double(p.lr) * double(p.weight_decay)), float(1.0 - p.beta1), float(p.beta2), float(1.0 - p.beta2),
      float(double(p.lr) / bc1), float(bc2_sqrt), p.eps, p.grad_scale,
      p.grad_sumsq ? static_cast<const double*>(p.grad_sumsq->data) : nullptr, p.max_grad_norm);
  CUDA_CHECK_LAUNCH();
}

}  // namespace soltrain
