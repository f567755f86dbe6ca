// CPU: linear layers (x · wᵀ + b) and their gradients through BLAS sgemm.
#include <cblas.h>

#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/quantize.h"

namespace soltrain {

namespace {
// A quantised (frozen) weight is dequantised to fp32 per call, then runs the dense path: the CPU twin of the
// CUDA backend's dequantise-then-GEMM, with the same arithmetic (kernels/quant.h). The scratch lives as long
// as the thread and grows to the widest weight once.
Tensor dense(CpuOps& ops, const Weight& w) {
  if (w.format == WeightFormat::Dense) return w.data;
  thread_local std::vector<float> scratch;
  scratch.resize(size_t(w.out() * w.in()));
  const Tensor out{scratch.data(), DType::F32, {w.out(), w.in()}, Device::CPU};
  ops.dequantize(out, w);
  return out;
}
}  // namespace

void CpuOps::dequantize(Tensor out, const Weight& w) {
  SOLTRAIN_CHECK(w.format != WeightFormat::Dense && out.dtype == DType::F32 && out.numel() == w.out() * w.in(),
                 "dequantize");
  const auto* q = static_cast<const uint8_t*>(w.data.data);
  if (w.format == WeightFormat::Nf4)
    nf4_dequantize(q, static_cast<const uint8_t*>(w.scale.data), w.out() * w.in(), out.f32());
  else if (w.format == WeightFormat::Int8Row)
    int8_row_dequantize(q, w.scale.f32(), w.out(), w.in(), out.f32());
  else if (w.format == WeightFormat::Nvfp4)
    nvfp4_dequantize(q, static_cast<const uint8_t*>(w.scale.data), w.out(), w.in(), out.f32());
  else
    fp8_block_dequantize(q, w.scale.f32(), w.out(), w.in(), out.f32());
}

void CpuOps::linear_forward(Tensor y, const Tensor& x, const Weight& weight, const Tensor* bias, float alpha,
                            bool accumulate) {
  const Tensor w = dense(*this, weight);
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
  SOLTRAIN_CHECK(!dw || weight.format == WeightFormat::Dense, "a quantised weight is frozen: no dW");
  const Tensor w = dense(*this, weight);
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
