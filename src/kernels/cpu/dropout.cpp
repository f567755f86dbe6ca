// CPU: scaled dropout (LoRA's input dropout, and plain scaling when p = 0).
#include "kernels/cpu/cpu_ops.h"
#include "kernels/dropout_mask.h"

namespace soltrain {

void CpuOps::dropout_scale(Tensor y, const Tensor& x, float factor, float p, uint64_t seed) {
  SOLTRAIN_CHECK(y.numel() == x.numel() && p >= 0 && p < 1, "dropout_scale");
  const float* a = x.f32();
  float* b = y.f32();
  const float kept = p > 0 ? factor / (1.0f - p) : factor;
  for (int64_t i = 0, n = x.numel(); i < n; ++i)
    b[i] = p > 0 && !dropout_keep(seed, uint64_t(i), p) ? 0.0f : a[i] * kept;
}

}  // namespace soltrain
