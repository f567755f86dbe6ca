// CPU: attention of new query tokens against a paged KV cache (decoding). The arithmetic follows
// attention_forward step for step (fp32 dot products, double denominator), so a cached decode
// reproduces the training forward's logits.
#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace soltrain {

namespace {
// The paged cache's addressing (kernels/ops.h): the pool row holding sequence b's position p.
struct PagedRows {
  const int32_t* table;
  int64_t blocks, bs, pool_rows;  // table entries per sequence, block size, rows in the pool
  PagedRows(const Tensor& t, const Tensor& pool)
      : table(t.i32()), blocks(t.dim(1)), bs(pool.dim(1)), pool_rows(pool.dim(0) * pool.dim(1)) {}
  int64_t positions() const { return blocks * bs; }
  int64_t operator()(int64_t b, int64_t p) const {
    const int64_t block = table[b * blocks + p / bs], at = block * bs + p % bs;
    SOLTRAIN_CHECK(block >= 0 && at < pool_rows, "paged KV cache: sequence ", b, " position ", p, " in block ", block);
    return at;
  }
};
}  // namespace

void CpuOps::kv_append(Tensor k_pool, Tensor v_pool, const Tensor& k, const Tensor& v, const Tensor& lens,
                       const Tensor& table) {
  const int64_t B = table.dim(0), row = k_pool.dim(2) * k_pool.dim(3);
  const int64_t Tq = B > 0 ? k.dim(0) / B : 0;
  SOLTRAIN_CHECK(k.dim(0) == B * Tq && k.numel() == B * Tq * row && v.numel() == k.numel() && lens.numel() == B,
                 "kv_append shapes");
  const PagedRows at(table, k_pool);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = lens.i32()[b];
    SOLTRAIN_CHECK(len >= Tq && len <= at.positions(), "kv_append: length ", len, " with ", Tq,
                   " new tokens, room for ", at.positions());
    for (int64_t t = 0; t < Tq; ++t) {
      const int64_t to = at(b, len - Tq + t) * row, from = (b * Tq + t) * row;
      std::copy(k.f32() + from, k.f32() + from + row, k_pool.f32() + to);
      std::copy(v.f32() + from, v.f32() + from + row, v_pool.f32() + to);
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

// Token by token through the separate ops (the definition the CUDA kernel is checked against): the q part normed
// and rotated into q, the k part into a scratch row and then its cache row, the v part copied.
void CpuOps::decode_qkv(Tensor q, Tensor k_pool, Tensor v_pool, Tensor qkv, const Tensor& q_norm, const Tensor& k_norm,
                        const Tensor& positions, const Tensor& inv_freq, float eps, const Tensor& lens,
                        const Tensor& table) {
  const int64_t B = table.dim(0), N = q.dim(0), H = q.dim(1), hd = q.dim(2), Hkv = k_pool.dim(2);
  const int64_t Tq = B > 0 ? N / B : 0, W = (H + 2 * Hkv) * hd, row = Hkv * hd;
  SOLTRAIN_CHECK(N == B * Tq && k_pool.dim(3) == hd && qkv.numel() == N * W && positions.numel() == N &&
                     lens.numel() == B && hd % 4 == 0,
                 "decode_qkv shapes");
  const PagedRows at(table, k_pool);
  std::vector<float> rstd(static_cast<size_t>(std::max(H, Hkv))), k(static_cast<size_t>(row));
  auto host = [](float* p, Shape s) { return Tensor{p, DType::F32, std::move(s), Device::CPU}; };
  for (int64_t n = 0; n < N; ++n) {
    float* x = qkv.f32() + n * W;
    const SeqLayout seq{Tensor{}, positions.rows(n, n + 1), 0};
    const Tensor qn = host(q.f32() + n * H * hd, {1, H, hd}), kn = host(k.data(), {1, Hkv, hd});
    const Tensor q_in = host(x, {1, H, hd}), k_in = host(x + H * hd, {1, Hkv, hd});
    for (auto [y, in, w] : {std::tuple{qn, q_in, q_norm}, std::tuple{kn, k_in, k_norm}}) {
      if (w.defined()) {
        qk_norm_rope_forward(y, host(rstd.data(), {in.dim(1)}), in, w, seq, inv_freq, eps);
      } else {
        copy(y, in);
        rope(y, seq, inv_freq, false);
      }
    }
    const int64_t b = n / Tq, len = lens.i32()[b];
    SOLTRAIN_CHECK(len >= Tq && len <= at.positions(), "decode_qkv: length ", len, " with ", Tq,
                   " new tokens, room for ", at.positions());
    const int64_t to = at(b, len - Tq + n % Tq) * row;
    std::copy(k.begin(), k.end(), k_pool.f32() + to);
    std::copy(x + (H + Hkv) * hd, x + W, v_pool.f32() + to);
  }
}

void CpuOps::attention_decode(Tensor out, const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                              const Tensor& lens, const Tensor& table, float scale) {
  const int64_t B = table.dim(0), Hkv = k_pool.dim(2), hd = k_pool.dim(3);
  const int64_t Tq = B > 0 ? q.dim(0) / B : 0, H = q.dim(1), group = H / Hkv;
  SOLTRAIN_CHECK(q.dim(0) == B * Tq && q.dim(2) == hd && lens.numel() == B, "attention_decode shapes");
  const PagedRows at(table, k_pool);
  const int64_t S = at.positions();
  std::vector<float> p(static_cast<size_t>(S));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = lens.i32()[b];
    SOLTRAIN_CHECK(len >= Tq && len <= S, "attention_decode: length ", len, " with ", Tq, " new tokens, room for ", S);
    for (int64_t t = 0; t < Tq; ++t) {
      const int64_t pos = len - Tq + t, row = b * Tq + t;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t kh = h / group;
        const float* qi = q.f32() + (row * H + h) * hd;
        float mx = -INFINITY;
        for (int64_t j = 0; j <= pos; ++j) {
          const float* kj = k_pool.f32() + (at(b, j) * Hkv + kh) * hd;
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
          const float* vj = v_pool.f32() + (at(b, j) * Hkv + kh) * hd;
          for (int64_t c = 0; c < hd; ++c) o[c] += w * vj[c];
        }
      }
    }
  }
}

}  // namespace soltrain
