// CPU: the fp8-hybrid recipe's operations, the twin of kernels/cuda/fp8.cu. Codes come from kernels/quant.h's
// arithmetic, so they equal the GPU's bit for bit; the GEMM decodes both operands to fp32 and runs sgemm,
// then applies alpha · scale_inv_a · scale_inv_b, as cuBLASLt's FP8 GEMM does to its fp32 accumulator.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/quant.h"

namespace soltrain {

namespace {
bool is_e5m2(const Tensor& t) {
  SOLTRAIN_CHECK(t.dtype == DType::F8E4M3 || t.dtype == DType::F8E5M2, "FP8 operand is ", dtype_name(t.dtype));
  return t.dtype == DType::F8E5M2;
}
float fp8_max(const Tensor& t) { return is_e5m2(t) ? quant::kE5m2Max : quant::kE4m3Max; }
std::vector<float> decoded(const Tensor& t) {
  const bool e5 = is_e5m2(t);
  const auto* q = t.as<const uint8_t>();
  std::vector<float> v(size_t(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = quant::fp8_decode(q[i], e5);
  return v;
}
}  // namespace

void CpuOps::fp8_quantize(Tensor out, Tensor out_t, const Tensor& x, const Fp8Scaling& s) {
  SOLTRAIN_CHECK(x.rank() == 2 && (out.defined() || out_t.defined()), "fp8_quantize");
  const int64_t R = x.dim(0), C = x.dim(1);
  const float* xv = x.f32();
  float amax = 0;
  for (int64_t i = 0; i < R * C; ++i) amax = std::max(amax, std::fabs(xv[i]));
  float* sc = s.scale.f32();
  const Tensor& any = out.defined() ? out : out_t;
  if (s.current) {
    sc[1] = quant::fp8_scale_from_amax(amax, fp8_max(any));
    sc[0] = quant::reciprocal_rn(sc[1]);
  }
  if (s.amax.defined()) s.amax.f32()[0] = std::max(s.amax.f32()[0], amax);
  if (out.defined()) {
    SOLTRAIN_CHECK(out.numel() == R * C, "fp8_quantize out");
    const bool e5 = is_e5m2(out);
    auto* q = out.as<uint8_t>();
    for (int64_t i = 0; i < R * C; ++i) q[i] = quant::fp8_encode(xv[i], sc[1], e5);
  }
  if (out_t.defined()) {
    SOLTRAIN_CHECK(out_t.numel() == R * C, "fp8_quantize out_t");
    const bool e5 = is_e5m2(out_t);
    auto* q = out_t.as<uint8_t>();
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) q[c * R + r] = quant::fp8_encode(xv[r * C + c], sc[1], e5);
  }
}

void CpuOps::fp8_matmul(Tensor y, const Tensor& a, const Tensor& a_scale, const Tensor& b, const Tensor& b_scale,
                        const Tensor* bias, float alpha, bool accumulate, bool /*precise: fp32 here always*/) {
  SOLTRAIN_CHECK(!(is_e5m2(a) && is_e5m2(b)), "fp8_matmul: E5M2 x E5M2");
  const int M = int(a.dim(0)), K = int(a.dim(1)), N = int(b.dim(0));
  SOLTRAIN_CHECK(b.dim(1) == K && y.dim(0) == M && y.dim(1) == N, "fp8_matmul shapes");
  const std::vector<float> av = decoded(a), bv = decoded(b);
  const float factor = alpha * a_scale.f32()[0] * b_scale.f32()[0];
  std::vector<float> acc(size_t(M) * size_t(N));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, av.data(), K, bv.data(), K, 0.0f, acc.data(), N);
  float* out = y.f32();
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      const size_t i = size_t(m) * size_t(N) + size_t(n);
      float v = factor * acc[i] + (accumulate ? out[i] : 0.0f);
      if (bias) v += bias->f32()[n];
      out[i] = v;
    }
}

void CpuOps::fp8_update_scales(Tensor history, Tensor scales, float fp8_max, int margin) {
  const int64_t Q = history.dim(0), H = history.dim(1);
  SOLTRAIN_CHECK(scales.numel() == 4 * Q, "fp8_update_scales");
  const float scaled_max = std::ldexp(fp8_max, -margin);
  for (int64_t q = 0; q < Q; ++q) {
    float* h = history.f32() + q * H;
    float amax = 0;
    for (int64_t i = 0; i < H; ++i) amax = std::max(amax, h[i]);
    const float newest = h[0];
    for (int64_t i = 1; i < H; ++i) h[i - 1] = h[i];
    h[H - 1] = newest;
    h[0] = 0;
    float* s = scales.f32() + 4 * q;
    if (amax > 0 && std::isfinite(amax)) {
      s[1] = quant::fp8_scale_from_amax(amax, scaled_max);
      s[0] = quant::reciprocal_rn(s[1]);
    }
  }
}

}  // namespace soltrain
