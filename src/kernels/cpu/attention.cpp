// CPU: exact causal attention within packed documents, GQA by head mapping, fp32 softmax with saved
// log-sum-exp; backward recomputes probabilities from lse (as flash attention does).
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace soltrain {

namespace {
float dot(const float* a, const float* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}
}  // namespace

void CpuOps::attention_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                               const SeqLayout& seq, float scale) {
  const int64_t N = q.dim(0), H = q.dim(1), hd = q.dim(2), Hkv = k.dim(1), group = H / Hkv;
  const int32_t* cu = seq.cu_seqlens.i32();
  std::vector<float> p(size_t(seq.max_seqlen));
  for (int64_t d = 0; d + 1 < seq.cu_seqlens.numel(); ++d) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kh = h / group;
      for (int64_t i = cu[d]; i < cu[d + 1]; ++i) {
        const float* qi = q.f32() + (i * H + h) * hd;
        float mx = -INFINITY;
        for (int64_t j = cu[d]; j <= i; ++j) {
          p[j - cu[d]] = dot(qi, k.f32() + (j * Hkv + kh) * hd, hd) * scale;
          mx = std::max(mx, p[j - cu[d]]);
        }
        double z = 0;
        for (int64_t j = cu[d]; j <= i; ++j) z += (p[j - cu[d]] = std::exp(p[j - cu[d]] - mx));
        float* o = out.f32() + (i * H + h) * hd;
        for (int64_t c = 0; c < hd; ++c) o[c] = 0;
        for (int64_t j = cu[d]; j <= i; ++j) {
          const float w = float(p[j - cu[d]] / z);
          const float* vj = v.f32() + (j * Hkv + kh) * hd;
          for (int64_t c = 0; c < hd; ++c) o[c] += w * vj[c];
        }
        lse.f32()[h * N + i] = mx + float(std::log(z));
      }
    }
  }
}

void CpuOps::attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                                const Tensor& v, const Tensor& out, const Tensor& lse, const SeqLayout& seq,
                                float scale) {
  const int64_t N = q.dim(0), H = q.dim(1), hd = q.dim(2), Hkv = k.dim(1), group = H / Hkv;
  const int32_t* cu = seq.cu_seqlens.i32();
  zero(dq);
  zero(dk);
  zero(dv);
  for (int64_t d = 0; d + 1 < seq.cu_seqlens.numel(); ++d) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kh = h / group;
      for (int64_t i = cu[d]; i < cu[d + 1]; ++i) {
        const float* qi = q.f32() + (i * H + h) * hd;
        const float* doi = dout.f32() + (i * H + h) * hd;
        float* dqi = dq.f32() + (i * H + h) * hd;
        const float Di = dot(doi, out.f32() + (i * H + h) * hd, hd);  // Σⱼ pᵢⱼ dpᵢⱼ
        const float l = lse.f32()[h * N + i];
        for (int64_t j = cu[d]; j <= i; ++j) {
          const float* kj = k.f32() + (j * Hkv + kh) * hd;
          const float* vj = v.f32() + (j * Hkv + kh) * hd;
          const float pij = std::exp(dot(qi, kj, hd) * scale - l);
          const float ds = pij * (dot(doi, vj, hd) - Di) * scale;
          float* dkj = dk.f32() + (j * Hkv + kh) * hd;
          float* dvj = dv.f32() + (j * Hkv + kh) * hd;
          for (int64_t c = 0; c < hd; ++c) {
            dqi[c] += ds * kj[c];
            dkj[c] += ds * qi[c];
            dvj[c] += pij * doi[c];
          }
        }
      }
    }
  }
}

}  // namespace soltrain
