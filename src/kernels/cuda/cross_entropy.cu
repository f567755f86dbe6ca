// CUDA: cross-entropy per row of fp32 logits (one block per row, online max/sum), writing the loss and,
// when asked, the gradient weighted per row in bf16 for the LM head's backward GEMMs.
#include <cfloat>

#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace soltrain {

using cuda::bf16;

namespace {
constexpr int kThreads = 512;

__global__ void cross_entropy_kernel(const float* logits, bf16* dlogits, float* row_loss, const int32_t* targets,
                                     int64_t V, const float* row_weight) {
  __shared__ float sm[kThreads / 32], ss[kThreads / 32];
  const int64_t r = blockIdx.x;
  const float* l = logits + r * V;
  bf16* g = dlogits + r * V;
  const int t = targets[r];
  if (t == -100) {
    if (row_weight)
      for (int64_t j = threadIdx.x; j < V; j += kThreads) g[j] = cuda::to_bf(0.f);
    if (threadIdx.x == 0) row_loss[r] = 0.f;
    return;
  }
  float m = -FLT_MAX, s = 0.f;  // this thread's running max and Σexp(x - m)
  for (int64_t j = threadIdx.x; j < V; j += kThreads) {
    const float x = l[j];
    if (x > m) {
      s = s * expf(m - x) + 1.f;
      m = x;
    } else {
      s += expf(x - m);
    }
  }
  // combine across the warp, then across warps
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    const float mx = fmaxf(m, m2);
    s = s * expf(m - mx) + s2 * expf(m2 - mx);
    m = mx;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) sm[warp] = m, ss[warp] = s;
  __syncthreads();
  float M = -FLT_MAX, S = 0.f;
  for (int w = 0; w < kThreads / 32; ++w) M = fmaxf(M, sm[w]);
  for (int w = 0; w < kThreads / 32; ++w) S += ss[w] * expf(sm[w] - M);
  const float lse = M + logf(S);
  if (threadIdx.x == 0) row_loss[r] = lse - l[t];
  if (!row_weight) return;
  const float scale = row_weight[r];
  for (int64_t j = threadIdx.x; j < V; j += kThreads)
    g[j] = cuda::to_bf((expf(l[j] - lse) - (j == t ? 1.f : 0.f)) * scale);
}
}  // namespace

void CudaOps::cross_entropy(const Tensor& logits, Tensor dlogits, Tensor row_loss, const Tensor& targets,
                            const Tensor& row_weight) {
  const auto prof = profile("cross_entropy");
  const int64_t n = logits.dim(0), V = logits.dim(1);
  if (n == 0) return;
  cross_entropy_kernel<<<unsigned(n), kThreads, 0, stream_>>>(logits.f32(), dlogits.as<bf16>(), row_loss.f32(),
                                                              targets.i32(), V,
                                                              row_weight.defined() ? row_weight.f32() : nullptr);
  CUDA_CHECK_LAUNCH();
}

}  // namespace soltrain
