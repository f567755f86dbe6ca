// CUDA: RMSNorm, one warp per row; fp32 statistics, the normalised value rounded to bf16 before the
// weight multiplies it (as transformers does). The weight gradient is a deterministic column sum.
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/launchers.h"

namespace soltrain {

using cuda::bf16;
using cuda::to_bf;
using cuda::to_f;

namespace {
constexpr int kWarps = 8;

__global__ void rmsnorm_fwd(bf16* y, float* rstd, const bf16* x, const bf16* w, int64_t R, int64_t C, float eps) {
  const int64_t r = int64_t(blockIdx.x) * kWarps + threadIdx.y;
  if (r >= R) return;
  const bf16* xr = x + r * C;
  float ss = 0.f;
  for (int64_t c = threadIdx.x; c < C; c += 32) {
    const float v = to_f(xr[c]);
    ss += v * v;
  }
  const float rs = rsqrtf(cuda::warp_sum(ss) / float(C) + eps);
  if (threadIdx.x == 0) rstd[r] = rs;
  for (int64_t c = threadIdx.x; c < C; c += 32) y[r * C + c] = to_bf(to_f(w[c]) * to_f(to_bf(to_f(xr[c]) * rs)));
}

__global__ void rmsnorm_bwd(bf16* dx, bool accumulate, const bf16* dy, const bf16* x, const bf16* w, const float* rstd,
                            int64_t R, int64_t C) {
  const int64_t r = int64_t(blockIdx.x) * kWarps + threadIdx.y;
  if (r >= R) return;
  const float rs = rstd[r];
  float dot = 0.f;
  for (int64_t c = threadIdx.x; c < C; c += 32) dot += to_f(dy[r * C + c]) * to_f(w[c]) * to_f(x[r * C + c]) * rs;
  const float mean = cuda::warp_sum(dot) / float(C);
  for (int64_t c = threadIdx.x; c < C; c += 32) {
    const float xh = to_f(x[r * C + c]) * rs;
    const float v = rs * (to_f(dy[r * C + c]) * to_f(w[c]) - xh * mean);
    dx[r * C + c] = to_bf(accumulate ? to_f(dx[r * C + c]) + v : v);
  }
}
}  // namespace

void CudaOps::rmsnorm_forward(Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps) {
  const int64_t C = x.dim(-1), R = x.numel() / C;
  rmsnorm_fwd<<<unsigned((R + kWarps - 1) / kWarps), dim3(32, kWarps), 0, stream_>>>(
      y.as<bf16>(), rstd.f32(), x.as<bf16>(), w.as<bf16>(), R, C, eps);
  CUDA_CHECK_LAUNCH();
}

void CudaOps::rmsnorm_backward(Tensor dx, bool accumulate_dx, Tensor dw, const Tensor& dy, const Tensor& x,
                               const Tensor& w, const Tensor& rstd) {
  const int64_t C = x.dim(-1), R = x.numel() / C;
  rmsnorm_bwd<<<unsigned((R + kWarps - 1) / kWarps), dim3(32, kWarps), 0, stream_>>>(
      dx.as<bf16>(), accumulate_dx, dy.as<bf16>(), x.as<bf16>(), w.as<bf16>(), rstd.f32(), R, C);
  CUDA_CHECK_LAUNCH();
  if (!dw.defined()) return;  // a frozen weight: no gradient
  float* partials = static_cast<float*>(scratch(size_t(cuda::column_sum_partial_floats(R, C, sm_count_)) * 4));
  cuda::column_sum(dw.f32(), dy.as<bf16>(), x.as<bf16>(), rstd.f32(), R, C, partials, sm_count_, stream_);
}

}  // namespace soltrain
