// CPU: attention of new query tokens against a KV cache (decoding). The arithmetic follows
// attention_forward step for step (fp32 dot products, double denominator), so a cached decode
// reproduces the training forward's logits.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace soltrain {

void CpuOps::kv_append(Tensor k_cache, Tensor v_cache, const Tensor& k, const Tensor& v, const Tensor& lens) {
  const int64_t B = k_cache.dim(0), S = k_cache.dim(1), row = k_cache.dim(2) * k_cache.dim(3);
  const int64_t Tq = B > 0 ? k.dim(0) / B : 0;
  SOLTRAIN_CHECK(k.dim(0) == B * Tq && k.numel() == B * Tq * row && v.numel() == k.numel() && lens.numel() == B,
                 "kv_append shapes");
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = lens.i32()[b];
    SOLTRAIN_CHECK(len >= Tq && len <= S, "kv_append: length ", len, " with ", Tq, " new tokens, cache ", S);
    for (int64_t t = 0; t < Tq; ++t) {
      const int64_t at = (b * S + len - Tq + t) * row, from = (b * Tq + t) * row;
      std::copy(k.f32() + from, k.f32() + from + row, k_cache.f32() + at);
      std::copy(v.f32() + from, v.f32() + from + row, v_cache.f32() + at);
    }
  }
}

void CpuOps::advance_decode(Tensor ids, Tensor positions, Tensor lens, const Tensor& drawn) {
  const int64_t B = lens.numel();
  SOLTRAIN_CHECK(ids.numel() == B && positions.numel() == B && drawn.numel() == B, "advance_decode shapes");
  for (int64_t b = 0; b < B; ++b) {
    ids.i32()[b] = drawn.i32()[b];
    positions.i32()[b] = lens.i32()[b]++;
  }
}

void CpuOps::attention_decode(Tensor out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                              const Tensor& lens, float scale) {
  const int64_t B = k_cache.dim(0), S = k_cache.dim(1), Hkv = k_cache.dim(2), hd = k_cache.dim(3);
  const int64_t Tq = q.dim(0) / B, H = q.dim(1), group = H / Hkv;
  SOLTRAIN_CHECK(q.dim(0) == B * Tq && q.dim(2) == hd && lens.numel() == B, "attention_decode shapes");
  std::vector<float> p(static_cast<size_t>(S));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = lens.i32()[b];
    SOLTRAIN_CHECK(len >= Tq && len <= S, "attention_decode: length ", len, " with ", Tq, " new tokens, cache ", S);
    const float* kb = k_cache.f32() + b * S * Hkv * hd;
    const float* vb = v_cache.f32() + b * S * Hkv * hd;
    for (int64_t t = 0; t < Tq; ++t) {
      const int64_t pos = len - Tq + t, row = b * Tq + t;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t kh = h / group;
        const float* qi = q.f32() + (row * H + h) * hd;
        float mx = -INFINITY;
        for (int64_t j = 0; j <= pos; ++j) {
          const float* kj = kb + (j * Hkv + kh) * hd;
          float s = 0;
          for (int64_t c = 0; c < hd; ++c) s += qi[c] * kj[c];
          p[size_t(j)] = s * scale;
          mx = std::max(mx, p[size_t(j)]);
        }
        double z = 0;
        for (int64_t j = 0; j <= pos; ++j) z += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
        float* o = out.f32() + (row * H + h) * hd;
        for (int64_t c = 0; c < hd; ++c) o[c] = 0;
        for (int64_t j = 0; j <= pos; ++j) {
          const float w = float(p[size_t(j)] / z);
          const float* vj = vb + (j * Hkv + kh) * hd;
          for (int64_t c = 0; c < hd; ++c) o[c] += w * vj[c];
        }
      }
    }
  }
}

}  // namespace soltrain
