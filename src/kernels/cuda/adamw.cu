// CUDA: torch's AdamW update on fp32 masters, writing the bf16 compute copy in the same pass.
#include <cmath>

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
}  // namespace

void CudaOps::adamw(Tensor master, const Tensor& grad, Tensor m, Tensor v, const AdamWParams& p, Tensor* compute_copy) {
  const auto prof = profile("adamw");
  const double bc1 = 1.0 - std::pow(double(p.beta1), p.step);
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(double(p.beta2), p.step));
  const int64_t n = master.numel();
  adamw_kernel<<<cuda::blocks_for(n, 256, 8 * 1024), 256, 0, stream_>>>(
      master.f32(), grad.f32(), m.f32(), v.f32(), compute_copy ? compute_copy->as<bf16>() : nullptr, n,
      float(1.0 - double(p.lr) * double(p.weight_decay)), float(1.0 - double(p.beta1)), p.beta2,
      float(1.0 - double(p.beta2)), float(double(p.lr) / bc1), float(bc2_sqrt), p.eps, p.grad_scale,
      p.grad_sumsq ? static_cast<const double*>(p.grad_sumsq->data) : nullptr, p.max_grad_norm);
  CUDA_CHECK_LAUNCH();
}

}  // namespace soltrain
