// CPU: linear layers (x · wᵀ + b) and their gradients through BLAS sgemm.
#include <cblas.h>

#include "kernels/cpu/cpu_ops.h"

namespace soltrain {

namespace {
// The CPU runs dense fp32 weights only; quantised formats are dequantised by the caller for a reference.
const Tensor& dense(const Weight& w) {
  SOLTRAIN_CHECK(w.format == WeightFormat::Dense, "the CPU backend has no ", weight_format_name(w.format), " matmul");
  return w.data;
}
}  // namespace

void CpuOps::linear_forward(Tensor y, const Tensor& x, const Weight& weight, const Tensor* bias, float alpha,
                            bool accumulate) {
  const Tensor& w = dense(weight);
  const int N = int(x.dim(0)), in = int(x.dim(1)), out = int(w.dim(0));
  SOLTRAIN_CHECK(w.dim(1) == in && y.dim(0) == N && y.dim(1) == out, "linear shapes");
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, out, in, alpha, x.f32(), in, w.f32(), in,
              accumulate ? 1.0f : 0.0f, y.f32(), out);
  if (bias) {
    const float* b = bias->f32();
    for (int n = 0; n < N; ++n)
      for (int o = 0; o < out; ++o) y.f32()[int64_t(n) * out + o] += b[o];
  }
}

void CpuOps::linear_backward(Tensor* dx, bool accumulate_dx, Tensor* dw, Tensor* dbias, const Tensor& dy,
                             const Tensor& x, const Weight& weight, float dx_alpha) {
  const Tensor& w = dense(weight);
  const int N = int(dy.dim(0)), out = int(w.dim(0)), in = int(w.dim(1));
  if (dx)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, in, out, dx_alpha, dy.f32(), out, w.f32(), in,
                accumulate_dx ? 1.0f : 0.0f, dx->f32(), in);
  if (dw)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, N, 1.0f, dy.f32(), out, x.f32(), in, 1.0f, dw->f32(),
                in);
  if (dbias) {
    float* db = dbias->f32();
    for (int n = 0; n < N; ++n)
      for (int o = 0; o < out; ++o) db[o] += dy.f32()[int64_t(n) * out + o];
  }
}

}  // namespace soltrain
