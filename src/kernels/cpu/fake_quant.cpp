// Fake quantisation for QAT on the CPU twin (kernels/fake_quant.h has the arithmetic, shared with the device).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_ops.h"

namespace soltrain {

namespace {
float abs_max(const float* v, int64_t n) {
  float m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(v[i]));
  return m;
}
}  // namespace

void CpuOps::fake_quantize(Tensor out, const Tensor& x, const FakeQuant& q, Tensor amax) {
  SOLTRAIN_CHECK(x.dtype == DType::F32 && out.dtype == DType::F32 && out.numel() == x.numel() && x.rank() == 2 &&
                     out.data != x.data && q.on(),
                 "fake_quantize");
  const int64_t C = x.dim(1), G = q.group_of(C), n = x.numel();
  SOLTRAIN_CHECK(G > 0 && C % G == 0, "fake_quantize: a row of ", C, " is not whole groups of ", G);
  const float* a = x.f32();
  float* b = out.f32();
  float tensor_scale = 0;
  if (q.kind == FakeQuantKind::Nvfp4) {
    const float m = abs_max(a, n);
    if (amax.defined()) amax.f32()[0] = m;
    tensor_scale = fq::nv_tensor_scale(m);
  }
  for (int64_t g0 = 0; g0 < n; g0 += G) {
    const float* v = a + g0;
    float* o = b + g0;
    float lo = v[0], hi = v[0];
    for (int64_t i = 1; i < G; ++i) lo = std::min(lo, v[i]), hi = std::max(hi, v[i]);
    switch (q.kind) {
      case FakeQuantKind::Int4Weight: {
        const fq::Int4Params p = fq::int4_params(lo, hi);
        for (int64_t i = 0; i < G; ++i) o[i] = fq::int4_value(v[i], p);
        break;
      }
      case FakeQuantKind::Int8Token: {
        const fq::Int8Params p = fq::int8_params(lo, hi, false);
        for (int64_t i = 0; i < G; ++i) o[i] = fq::int8_value(v[i], p);
        break;
      }
      case FakeQuantKind::Mxfp4: {
        const fq::MxParams p = fq::mx_params(abs_max(v, G));
        for (int64_t i = 0; i < G; ++i) o[i] = fq::mx_value(v[i], p);
        break;
      }
      case FakeQuantKind::Nvfp4: {
        const fq::NvParams p = fq::nv_params(abs_max(v, G), tensor_scale, false);
        for (int64_t i = 0; i < G; ++i) o[i] = fq::nv_value(v[i], p);
        break;
      }
      case FakeQuantKind::Off: break;
    }
  }
}

void CpuOps::fake_quantize_backward(Tensor dx, bool accumulate, const Tensor& g, const Tensor& x, const FakeQuant& q) {
  SOLTRAIN_CHECK(x.dtype == DType::F32 && g.dtype == DType::F32 && dx.dtype == DType::F32 && x.rank() == 2 &&
                     g.numel() == x.numel() && dx.numel() == x.numel() && (dx.data != g.data || !accumulate),
                 "fake_quantize_backward");
  const int64_t C = x.dim(1), G = q.group_of(C), n = x.numel();
  const float* xv = x.f32();
  const float* gv = g.f32();
  float* d = dx.f32();
  auto put = [&](int64_t i, float v) { d[i] = accumulate ? d[i] + v : v; };
  if (q.kind == FakeQuantKind::Mxfp4 || q.kind == FakeQuantKind::Nvfp4) {
    for (int64_t i = 0; i < n; ++i) put(i, gv[i]);
    return;
  }
  std::vector<float> own(static_cast<size_t>(G));
  for (int64_t g0 = 0; g0 < n; g0 += G) {
    const float* v = xv + g0;
    float lo = v[0], hi = v[0];
    for (int64_t i = 1; i < G; ++i) lo = std::min(lo, v[i]), hi = std::max(hi, v[i]);
    if (q.kind == FakeQuantKind::Int8Token) {
      const fq::Int8Params p = fq::int8_params(lo, hi, false);
      for (int64_t i = 0; i < G; ++i) put(g0 + i, fq::int8_passes(v[i], p) ? gv[g0 + i] : 0.0f);
      continue;
    }
    // Int4Weight: the straight-through part, then the extremes' share of the scale's and minimum's gradients
    const fq::Int4Params p = fq::int4_params(lo, hi);
    double d_scale = 0, through = 0, total = 0;
    int64_t n_lo = 0, n_hi = 0;
    for (int64_t i = 0; i < G; ++i) {
      const float gi = gv[g0 + i];
      const bool pass = fq::int4_passes(v[i], p);
      own[size_t(i)] = pass ? fq::div_rn(quant::mul_rn(gi, p.scale), p.scale) : 0.0f;
      d_scale += double(gi) * fq::int4_code(v[i], p) - (pass ? double(gi) * fq::int4_ratio(v[i], p) : 0.0);
      through += own[size_t(i)];
      total += gi;
      n_lo += v[i] == lo;
      n_hi += v[i] == hi;
    }
    const double span_grad = p.span_clamped ? 0.0 : d_scale / 15.0;
    const double d_lo = total - through - span_grad, d_hi = span_grad;
    for (int64_t i = 0; i < G; ++i) {
      double gi = own[size_t(i)];
      if (v[i] == lo) gi += d_lo / double(n_lo);
      if (v[i] == hi) gi += d_hi / double(n_hi);
      put(g0 + i, float(gi));
    }
  }
}

}  // namespace soltrain
