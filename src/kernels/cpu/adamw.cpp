// CPU: torch.optim.AdamW's single-tensor update, operation for operation (so fp32 results match).
#include <cmath>

#include "kernels/cpu/cpu_ops.h"

namespace soltrain {

void CpuOps::adamw(Tensor param, const Tensor& grad, Tensor m, Tensor v, const AdamWParams& p, Tensor* compute_copy) {
  SOLTRAIN_CHECK(!compute_copy || compute_copy->data == param.data, "the CPU computes in fp32: no copy");
  float *w = param.f32(), *mp = m.f32(), *vp = v.f32();
  const float* g = grad.f32();
  const double bc1 = 1.0 - std::pow(double(p.beta1), p.step);
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(double(p.beta2), p.step));
  const float step_size = float(double(p.lr) / bc1);
  const float decay = float(1.0 - double(p.lr) * double(p.weight_decay));
  const float b1c = float(1.0 - double(p.beta1)), b2c = float(1.0 - double(p.beta2));
  const float grad_scale = p.grad_scale * host_clip_factor(p);
  for (int64_t i = 0, n = param.numel(); i < n; ++i) {
    w[i] *= decay;
    const float gi = g[i] * grad_scale;  // the one fp32 multiply torch's clip_grad_norm_ does in place
    mp[i] += b1c * (gi - mp[i]);         // lerp, as torch writes it
    vp[i] = vp[i] * p.beta2 + b2c * gi * gi;
    const float denom = std::sqrt(vp[i]) / float(bc2_sqrt) + p.eps;
    w[i] -= step_size * (mp[i] / denom);
  }
}

}  // namespace soltrain
