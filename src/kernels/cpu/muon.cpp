// CPU: Muon's three steps (kernels/ops.h) in fp32, the twin of the CUDA backend's and what the optimizer tests
// compare with torch.optim.Muon and a reference written from the definition.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace soltrain {

void CpuOps::muon_momentum(Tensor u, Tensor m, const Tensor& grad, Tensor sumsq, const MuonParams& p) {
  SOLTRAIN_CHECK(u.dtype == DType::F32 && u.numel() == m.numel() && grad.numel() == m.numel(), "muon_momentum shapes");
  const float scale =
      p.grad_scale *
      (p.grad_sumsq ? clip_factor(*static_cast<const double*>(p.grad_sumsq->data), p.max_grad_norm) : 1.0f);
  float *up = u.f32(), *mp = m.f32();
  const float* g = grad.f32();
  double ss = 0;
  for (int64_t i = 0, n = m.numel(); i < n; ++i) {
    const float gi = g[i] * scale;
    mp[i] += (1.0f - p.momentum) * (gi - mp[i]);                  // m.lerp_(g, 1 - μ)
    up[i] = p.nesterov ? gi + p.momentum * (mp[i] - gi) : mp[i];  // g.lerp(m, μ), or m itself
    ss += double(up[i]) * double(up[i]);
  }
  *static_cast<double*>(sumsq.data) = ss;
}

namespace {
// c [m, n] = alpha · a [m, k] · op(b) + beta · c, op(b) = b [k, n], or bᵀ of b [n, k] with `bt`.
void gemm(int64_t m, int64_t n, int64_t k, const float* a, const float* b, bool bt, float* c, float alpha, float beta) {
  std::vector<float> row(static_cast<size_t>(n));
  for (int64_t i = 0; i < m; ++i) {
    std::fill(row.begin(), row.end(), 0.0f);
    for (int64_t l = 0; l < k; ++l) {
      const float ail = a[i * k + l];
      if (bt)
        for (int64_t j = 0; j < n; ++j) row[size_t(j)] += ail * b[j * k + l];
      else
        for (int64_t j = 0; j < n; ++j) row[size_t(j)] += ail * b[l * n + j];
    }
    for (int64_t j = 0; j < n; ++j) c[i * n + j] = alpha * row[size_t(j)] + (beta != 0 ? beta * c[i * n + j] : 0.0f);
  }
}
}  // namespace

void CpuOps::newton_schulz(Tensor x, const Tensor& sumsq, Tensor scratch, const MuonParams& p) {
  SOLTRAIN_CHECK(x.dtype == DType::F32 && x.shape.size() == 2, "newton_schulz: an F32 matrix");
  const int64_t rows = x.dim(0), cols = x.dim(1);
  const bool tall = rows > cols;
  // The wide orientation: X [r, c] with r <= c (a tall x is transposed into the scratch and back).
  const int64_t r = tall ? cols : rows, c = tall ? rows : cols;
  SOLTRAIN_CHECK(scratch.numel() >= 2 * r * r + r * c, "newton_schulz: scratch too small");
  float *A = scratch.f32(), *B = A + r * r, *Y = B + r * r, *X = x.f32();
  std::vector<float> transposed;
  if (tall) {
    transposed.resize(size_t(r * c));
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) transposed[size_t(j * rows + i)] = X[i * cols + j];
    X = transposed.data();
  }
  const float inv = 1.0f / (float(std::sqrt(*static_cast<const double*>(sumsq.data))) * p.norm_scale + p.eps);
  for (int64_t i = 0; i < r * c; ++i) X[i] *= inv;
  for (int s = 0; s < p.ns_steps; ++s) {
    const float ca = p.coefficients ? p.coefficients[s][0] : p.a, cb = p.coefficients ? p.coefficients[s][1] : p.b,
                cc = p.coefficients ? p.coefficients[s][2] : p.c;
    gemm(r, r, c, X, X, true, A, 1.0f, 0.0f);   // A = X·Xᵀ
    std::copy(A, A + r * r, B);                 // B = b·A + c·A·A
    gemm(r, r, r, A, A, false, B, cc, cb);      //
    std::copy(X, X + r * c, Y);                 // X = a·X + B·X
    gemm(r, c, r, B, Y, false, X, 1.0f, 0.0f);  //
    for (int64_t i = 0; i < r * c; ++i) X[i] += ca * Y[i];
  }
  if (tall)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) x.f32()[i * cols + j] = X[j * rows + i];
}

void CpuOps::muon_update(Tensor master, const Tensor& x, float decay, float step, Tensor* compute_copy) {
  SOLTRAIN_CHECK(!compute_copy || compute_copy->data == master.data, "the CPU computes in fp32: no copy");
  SOLTRAIN_CHECK(x.dtype == DType::F32 && x.numel() == master.numel(), "muon_update shapes");
  float* w = master.f32();
  const float* u = x.f32();
  for (int64_t i = 0, n = master.numel(); i < n; ++i) w[i] = w[i] * decay - step * u[i];
}

void CpuOps::normuon_variance(Tensor x, Tensor buffer, float beta2) {
  SOLTRAIN_CHECK(x.dtype == DType::F32 && x.shape.size() == 2 && buffer.dtype == DType::F32, "normuon_variance");
  const int64_t rows = x.dim(0), cols = x.dim(1);
  const bool per_row = rows >= cols;
  SOLTRAIN_CHECK(buffer.numel() == (per_row ? rows : cols), "normuon_variance: the buffer's size");
  float *X = x.f32(), *buf = buffer.f32();
  const int64_t lines = per_row ? rows : cols, along = per_row ? cols : rows;
  auto at = [&](int64_t line, int64_t k) -> float& { return per_row ? X[line * cols + k] : X[k * cols + line]; };
  for (int64_t l = 0; l < lines; ++l) {
    double ss = 0;
    for (int64_t k = 0; k < along; ++k) ss += double(at(l, k)) * double(at(l, k));
    buf[l] = beta2 * buf[l] + (1.0f - beta2) * float(ss / double(along));
    const float scale = 1.0f / std::sqrt(std::max(buf[l], 1e-10f));
    for (int64_t k = 0; k < along; ++k) at(l, k) *= scale;
  }
}

void CpuOps::normuon_update(Tensor master, const Tensor& x, float wd_step, float step, Tensor* compute_copy) {
  SOLTRAIN_CHECK(!compute_copy || compute_copy->data == master.data, "the CPU computes in fp32: no copy");
  SOLTRAIN_CHECK(x.dtype == DType::F32 && x.numel() == master.numel(), "normuon_update shapes");
  float* w = master.f32();
  const float* u = x.f32();
  for (int64_t i = 0, n = master.numel(); i < n; ++i)
    w[i] = w[i] - (u[i] * w[i] >= 0.0f ? w[i] * wd_step : 0.0f) - step * u[i];
}

}  // namespace soltrain
