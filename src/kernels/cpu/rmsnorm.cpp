// CPU: RMSNorm over the last dimension, forward and backward (fp32 math, double row sums).
#include <cmath>

#include "kernels/cpu/cpu_ops.h"

namespace soltrain {

void CpuOps::rmsnorm_forward(Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps) {
  const int64_t C = x.dim(-1), R = x.numel() / C;
  const float* wp = w.f32();
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x.f32() + r * C;
    float* yr = y.f32() + r * C;
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += double(xr[c]) * xr[c];
    const float rs = float(1.0 / std::sqrt(ss / double(C) + double(eps)));
    rstd.f32()[r] = rs;
    for (int64_t c = 0; c < C; ++c) yr[c] = wp[c] * (xr[c] * rs);
  }
}

void CpuOps::rmsnorm_backward(Tensor dx, bool accumulate_dx, Tensor dw, const Tensor& dy, const Tensor& x,
                              const Tensor& w, const Tensor& rstd, Tensor dx_rounded) {
  const int64_t C = x.dim(-1), R = x.numel() / C;
  const float* wp = w.f32();
  float* dwp = dw.f32();
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x.f32() + r * C;
    const float* gr = dy.f32() + r * C;
    float* dxr = dx.f32() + r * C;
    const float rs = rstd.f32()[r];
    // y = w ⊙ x̂ with x̂ = x·rs:  dx = rs · (g⊙w − x̂ · mean(g⊙w⊙x̂))
    double dot = 0;
    for (int64_t c = 0; c < C; ++c) dot += double(gr[c]) * wp[c] * xr[c] * rs;
    const float mean = float(dot / double(C));
    for (int64_t c = 0; c < C; ++c) {
      const float xh = xr[c] * rs;
      const float v = rs * (gr[c] * wp[c] - xh * mean);
      dxr[c] = accumulate_dx ? dxr[c] + v : v;
      if (dwp) dwp[c] += gr[c] * xh;  // undefined dw: a frozen weight
    }
  }
  if (dx_rounded.defined()) copy(dx_rounded, dx);  // the CPU computes in fp32 throughout: a plain copy
}

}  // namespace soltrain
