// CPU: Mixture-of-Experts routing, token permutation, the experts' grouped GEMMs (BLAS per expert) and the
// load-balancing loss, in fp32: the reference the CUDA kernels will be checked against.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace soltrain {

void CpuOps::moe_route(Tensor probs, Tensor expert, Tensor weight, Tensor prob_sum, const Tensor& logits,
                       bool norm_topk) {
  const int64_t N = logits.dim(0), E = logits.dim(1), k = expert.dim(1);
  SOLTRAIN_CHECK(
      probs.numel() == N * E && expert.dim(0) == N && weight.numel() == N * k && k <= E && prob_sum.numel() == E,
      "moe_route shapes");
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits.f32() + n * E;
    float* p = probs.f32() + n * E;
    const float mx = *std::max_element(x, x + E);
    float s = 0;
    for (int64_t e = 0; e < E; ++e) s += p[e] = std::exp(x[e] - mx);
    for (int64_t e = 0; e < E; ++e) p[e] /= s;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    int32_t* ex = expert.i32() + n * k;
    float* w = weight.f32() + n * k;
    float top = 0;
    for (int64_t j = 0; j < k; ++j) top += w[j] = p[ex[j] = order[size_t(j)]];
    if (norm_topk)
      for (int64_t j = 0; j < k; ++j) w[j] /= top;
    for (int64_t e = 0; e < E; ++e) prob_sum.f32()[e] += p[e];
  }
}

void CpuOps::moe_permute(Tensor rows, Tensor slot, Tensor offsets, Tensor counts, const Tensor& expert) {
  const int64_t N = expert.dim(0), k = expert.dim(1), E = offsets.numel() - 1, M = N * k;
  SOLTRAIN_CHECK(rows.numel() == M && slot.numel() == M && counts.numel() == E, "moe_permute shapes");
  const int32_t* ex = expert.i32();
  int32_t* off = offsets.i32();
  std::fill(off, off + E + 1, 0);
  for (int64_t i = 0; i < M; ++i) {
    SOLTRAIN_CHECK(ex[i] >= 0 && ex[i] < E, "moe_permute: expert ", ex[i], " outside [0, ", E, ")");
    ++off[ex[i] + 1];
  }
  for (int64_t e = 0; e < E; ++e) {
    counts.f32()[e] += float(off[e + 1]);
    off[e + 1] += off[e];
  }
  std::vector<int32_t> next(off, off + E);
  for (int64_t i = 0; i < M; ++i) {  // pair order: token, then choice (stable within each expert)
    const int32_t s = next[size_t(ex[i])]++;
    slot.i32()[i] = s;
    rows.i32()[s] = int32_t(i / k);
  }
}

void CpuOps::gather_rows(Tensor out, const Tensor& x, const Tensor& rows) {
  const int64_t M = rows.numel(), D = x.dim(1);
  SOLTRAIN_CHECK(out.dim(0) == M && out.dim(1) == D, "gather_rows shapes");
  for (int64_t i = 0; i < M; ++i) std::copy_n(x.f32() + int64_t(rows.i32()[i]) * D, D, out.f32() + i * D);
}

void CpuOps::moe_combine(Tensor out, const Tensor& y, const Tensor& slot, const Tensor& weight) {
  const int64_t N = out.dim(0), D = out.dim(1), k = weight.dim(1);
  SOLTRAIN_CHECK(weight.dim(0) == N && slot.numel() == N * k && y.dim(1) == D, "moe_combine shapes");
  for (int64_t n = 0; n < N; ++n) {
    float* o = out.f32() + n * D;
    std::fill(o, o + D, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const float w = weight.f32()[n * k + j];
      const float* r = y.f32() + int64_t(slot.i32()[n * k + j]) * D;
      for (int64_t d = 0; d < D; ++d) o[d] += w * r[d];
    }
  }
}

void CpuOps::moe_combine_backward(Tensor dy, Tensor dweight, const Tensor& dout, const Tensor& y, const Tensor& slot,
                                  const Tensor& weight) {
  const int64_t N = dout.dim(0), D = dout.dim(1), k = weight.dim(1);
  SOLTRAIN_CHECK(dy.numel() == N * k * D && dweight.numel() == N * k, "moe_combine_backward shapes");
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t s = slot.i32()[n * k + j];
      const float w = weight.f32()[n * k + j];
      const float* g = dout.f32() + n * D;
      const float* r = y.f32() + s * D;
      float* d = dy.f32() + s * D;
      double dot = 0;
      for (int64_t c = 0; c < D; ++c) {
        d[c] = w * g[c];
        dot += double(g[c]) * double(r[c]);
      }
      dweight.f32()[n * k + j] = float(dot);
    }
}

void CpuOps::moe_unpermute_sum(Tensor dx, bool accumulate, const Tensor& dxs, const Tensor& slot) {
  const int64_t N = dx.dim(0), D = dx.dim(1), k = slot.numel() / N;
  SOLTRAIN_CHECK(slot.numel() == N * k && dxs.numel() == N * k * D, "moe_unpermute_sum shapes");
  for (int64_t n = 0; n < N; ++n) {
    float* o = dx.f32() + n * D;
    if (!accumulate) std::fill(o, o + D, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const float* r = dxs.f32() + int64_t(slot.i32()[n * k + j]) * D;
      for (int64_t d = 0; d < D; ++d) o[d] += r[d];
    }
  }
}

void CpuOps::grouped_linear_forward(Tensor y, const Tensor& x, const Tensor& w, const Tensor& offsets, float alpha,
                                    bool accumulate) {
  const int64_t E = w.dim(0), out = w.dim(1), in = w.dim(2);
  SOLTRAIN_CHECK(offsets.numel() == E + 1 && x.dim(1) == in && y.dim(1) == out && y.dim(0) == x.dim(0) &&
                     offsets.i32()[E] == x.dim(0),
                 "grouped_linear_forward shapes");
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = offsets.i32()[e], n = offsets.i32()[e + 1] - r0;
    if (n == 0) continue;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(out), int(in), alpha, x.f32() + r0 * in, int(in),
                w.f32() + e * out * in, int(in), accumulate ? 1.0f : 0.0f, y.f32() + r0 * out, int(out));
  }
}

void CpuOps::grouped_linear_backward(Tensor* dx, bool accumulate_dx, Tensor* dw, const Tensor& dy, const Tensor& x,
                                     const Tensor& w, const Tensor& offsets, float alpha) {
  const int64_t E = w.dim(0), out = w.dim(1), in = w.dim(2);
  SOLTRAIN_CHECK(offsets.numel() == E + 1 && dy.dim(1) == out && x.dim(1) == in && (!dw || dw->numel() == E * out * in),
                 "grouped_linear_backward shapes");
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = offsets.i32()[e], n = offsets.i32()[e + 1] - r0;
    if (n == 0) continue;
    if (dx)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(n), int(in), int(out), alpha, dy.f32() + r0 * out,
                  int(out), w.f32() + e * out * in, int(in), accumulate_dx ? 1.0f : 0.0f, dx->f32() + r0 * in, int(in));
    if (dw)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(out), int(in), int(n), alpha, dy.f32() + r0 * out,
                  int(out), x.f32() + r0 * in, int(in), 1.0f, dw->f32() + e * out * in, int(in));
  }
}

void CpuOps::moe_router_backward(Tensor dlogits, const Tensor& dweight, const Tensor& probs, const Tensor& expert,
                                 const Tensor& weight, bool norm_topk, const Tensor& aux_grad) {
  const int64_t N = probs.dim(0), E = probs.dim(1), k = expert.dim(1);
  SOLTRAIN_CHECK(dlogits.numel() == N * E && dweight.numel() == N * k && (!aux_grad.data || aux_grad.numel() == E),
                 "moe_router_backward shapes");
  std::vector<float> dp(static_cast<size_t>(E));
  for (int64_t n = 0; n < N; ++n) {
    const float* p = probs.f32() + n * E;
    const int32_t* ex = expert.i32() + n * k;
    const float* dw = dweight.f32() + n * k;
    const float* w = weight.f32() + n * k;
    for (int64_t e = 0; e < E; ++e) dp[size_t(e)] = aux_grad.data ? aux_grad.f32()[e] : 0.0f;
    if (norm_topk) {  // w_j = p_j / S, S = Σ_i p_i over the chosen: d p_j = (dw_j − Σ_i dw_i · w_i) / S
      float s = 0, dot = 0;
      for (int64_t j = 0; j < k; ++j) {
        s += p[ex[j]];
        dot += dw[j] * w[j];
      }
      for (int64_t j = 0; j < k; ++j) dp[size_t(ex[j])] += (dw[j] - dot) / s;
    } else {
      for (int64_t j = 0; j < k; ++j) dp[size_t(ex[j])] += dw[j];
    }
    float dot = 0;  // softmax: d x_e = p_e · (d p_e − Σ p · d p)
    for (int64_t e = 0; e < E; ++e) dot += p[e] * dp[size_t(e)];
    for (int64_t e = 0; e < E; ++e) dlogits.f32()[n * E + e] = p[e] * (dp[size_t(e)] - dot);
  }
}

void CpuOps::sigmoid_gate_add(Tensor out, const Tensor& x, const Tensor& gate) {
  const int64_t N = out.dim(0), D = out.dim(1);
  SOLTRAIN_CHECK(x.numel() == N * D && gate.numel() == N, "sigmoid_gate_add shapes");
  for (int64_t n = 0; n < N; ++n) {
    const float s = 1.0f / (1.0f + std::exp(-gate.f32()[n]));
    for (int64_t d = 0; d < D; ++d) out.f32()[n * D + d] += s * x.f32()[n * D + d];
  }
}

void CpuOps::sigmoid_gate_backward(Tensor dx, Tensor dgate, const Tensor& dout, const Tensor& x, const Tensor& gate) {
  const int64_t N = dout.dim(0), D = dout.dim(1);
  SOLTRAIN_CHECK(dx.numel() == N * D && x.numel() == N * D && gate.numel() == N && dgate.numel() == N,
                 "sigmoid_gate_backward shapes");
  for (int64_t n = 0; n < N; ++n) {
    const float s = 1.0f / (1.0f + std::exp(-gate.f32()[n]));
    double dot = 0;
    for (int64_t d = 0; d < D; ++d) {
      dx.f32()[n * D + d] = s * dout.f32()[n * D + d];
      dot += double(dout.f32()[n * D + d]) * double(x.f32()[n * D + d]);
    }
    dgate.f32()[n] = float(dot) * s * (1.0f - s);
  }
}

void CpuOps::moe_aux_loss(Tensor aux_grad, Tensor loss, const Tensor& counts, const Tensor& prob_sum, float coef,
                          double rows) {
  const int64_t E = counts.numel();
  SOLTRAIN_CHECK(aux_grad.numel() == E && prob_sum.numel() == E && loss.dtype == DType::F64, "moe_aux_loss shapes");
  const double c = double(coef) * double(E) / (rows * rows);
  double s = 0;
  for (int64_t e = 0; e < E; ++e) {
    s += double(counts.f32()[e]) * double(prob_sum.f32()[e]);
    aux_grad.f32()[e] = float(c * counts.f32()[e]);
  }
  *loss.as<double>() += c * s;
}

}  // namespace soltrain
