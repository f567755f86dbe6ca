// CPU: copies, fills, residual adds, reductions and scaling over flat tensors.
#include <cstring>

#include "kernels/cpu/cpu_ops.h"

namespace soltrain {

std::unique_ptr<Ops> make_cpu_ops() {
  return std::make_unique<CpuOps>();
}

void CpuOps::copy(Tensor dst, const Tensor& src) {
  SOLTRAIN_CHECK(dst.bytes() == src.bytes() && dst.dtype == src.dtype, "copy ", shape_str(src.shape), " -> ",
                 shape_str(dst.shape));
  std::memcpy(dst.data, src.data, src.bytes());
}

void CpuOps::zero(Tensor t) {
  std::memset(t.data, 0, t.bytes());
}

void CpuOps::add_inplace(Tensor x, const Tensor& y) {
  SOLTRAIN_CHECK(x.numel() == y.numel());
  float* a = x.f32();
  const float* b = y.f32();
  for (int64_t i = 0, n = x.numel(); i < n; ++i) a[i] += b[i];
}

double CpuOps::sum(const Tensor& x) {
  const float* a = x.f32();
  double s = 0;
  for (int64_t i = 0, n = x.numel(); i < n; ++i) s += a[i];
  return s;
}

double CpuOps::sum_squares(const Tensor& x) {
  const float* a = x.f32();
  double s = 0;
  for (int64_t i = 0, n = x.numel(); i < n; ++i) s += double(a[i]) * a[i];
  return s;
}

void CpuOps::scale(Tensor x, float factor) {
  float* a = x.f32();
  for (int64_t i = 0, n = x.numel(); i < n; ++i) a[i] *= factor;
}

}  // namespace soltrain
