// CUDA: torch's AdamW update on fp32 masters, writing the bf16 compute copy in the same pass.
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

// bitsandbytes' 8-bit blockwise AdamW: one thread block per quantisation block of 256 elements. Each thread
// dequantises its element's m and v, applies the update above, and the block's new max |m| and |v| give the
// absmax the codes are quantised against (nearest map entry: binary search over the midpoints).
__global__ void adamw_8bit_kernel(float* w, const float* g, uint8_t* mc, uint8_t* vc, float* ma, float* va,
                                  const float* mmap, const float* vmap, bf16* copy, int64_t n, float decay, float b1c,
                                  float beta2, float b2c, float step_size, float bc2_sqrt, float eps, float grad_scale,
                                  const double* grad_sumsq, float max_grad_norm) {
  __shared__ float smap[2][256], smid[2][255], wmax[2][8];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    smap[0][i] = mmap[i];
    smap[1][i] = vmap[i];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 255; i += blockDim.x) {
    smid[0][i] = (smap[0][i] + smap[0][i + 1]) / 2;  // as torch: (code[:-1] + code[1:]) / 2
    smid[1][i] = (smap[1][i] + smap[1][i + 1]) / 2;
  }
  if (grad_sumsq) grad_scale *= clip_factor(*grad_sumsq, max_grad_norm);
  const int64_t blk = blockIdx.x, i = blk * 256 + threadIdx.x;
  float mi = 0.f, vi = 0.f;
  if (i < n) {
    mi = smap[0][mc[i]] * ma[blk];
    vi = smap[1][vc[i]] * va[blk];
    float wi = w[i] * decay;
    const float gi = g[i] * grad_scale;
    mi = mi + b1c * (gi - mi);
    vi = vi * beta2 + b2c * gi * gi;
    wi -= step_size * (mi / (sqrtf(vi) / bc2_sqrt + eps));
    w[i] = wi;
    if (copy) copy[i] = cuda::to_bf(wi);
  }
  float am = fabsf(mi), av = fabsf(vi);
  for (int o = 16; o > 0; o >>= 1) {
    am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
    av = fmaxf(av, __shfl_xor_sync(0xffffffffu, av, o));
  }
  if (threadIdx.x % 32 == 0) {
    wmax[0][threadIdx.x / 32] = am;
    wmax[1][threadIdx.x / 32] = av;
  }
  __syncthreads();  // also orders the midpoints written above
  am = wmax[0][0];
  av = wmax[1][0];
  for (int k = 1; k < 8; ++k) {
    am = fmaxf(am, wmax[0][k]);
    av = fmaxf(av, wmax[1][k]);
  }
  if (i < n) {
    const float minv = 1.0f / fmaxf(am, 1e-38f), vinv = 1.0f / fmaxf(av, 1e-38f);
    mc[i] = quantize_to_map(fminf(fmaxf(mi * minv, -1.0f), 1.0f), smid[0]);
    vc[i] = quantize_to_map(fminf(fmaxf(vi * vinv, -1.0f), 1.0f), smid[1]);
  }
  if (threadIdx.x == 0) {
    ma[blk] = am;
    va[blk] = av;
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
  adamw_8bit_kernel<<<unsigned(blocks), unsigned(kBlockwise8Block), 0, stream_>>>(
      master.f32(), grad.f32(), m.code.as<uint8_t>(), v.code.as<uint8_t>(), m.absmax.f32(), v.absmax.f32(), m.map.f32(),
      v.map.f32(), compute_copy ? compute_copy->as<bf16>() : nullptr, n,
      float(1.0 - double(p.lr) * double(p.weight_decay)), float(1.0 - p.beta1), float(p.beta2), float(1.0 - p.beta2),
      float(double(p.lr) / bc1), float(bc2_sqrt), p.eps, p.grad_scale,
      p.grad_sumsq ? static_cast<const double*>(p.grad_sumsq->data) : nullptr, p.max_grad_norm);
  CUDA_CHECK_LAUNCH();
}

}  // namespace soltrain
