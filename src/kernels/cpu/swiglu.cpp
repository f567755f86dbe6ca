// CPU: SwiGLU (silu(gate) * up) and its backward.
#include <cmath>

#include "kernels/cpu/cpu_ops.h"

namespace soltrain {

void CpuOps::swiglu_forward(Tensor out, const Tensor& gate, const Tensor& up) {
  const float *g = gate.f32(), *u = up.f32();
  float* o = out.f32();
  for (int64_t i = 0, n = out.numel(); i < n; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

void CpuOps::swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate, const Tensor& up) {
  const float *g = gate.f32(), *u = up.f32(), *d = dout.f32();
  for (int64_t i = 0, n = gate.numel(); i < n; ++i) {
    const float sig = 1.0f / (1.0f + std::exp(-g[i]));
    const float silu = g[i] * sig;
    dup.f32()[i] = d[i] * silu;
    dgate.f32()[i] = d[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
  }
}

}  // namespace soltrain
