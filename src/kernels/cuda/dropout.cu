// CUDA: scaled dropout over bf16 activations, the same mask as the CPU twin (kernels/dropout_mask.h).
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/dropout_mask.h"

namespace soltrain {

using cuda::bf16;

namespace {
__global__ void dropout_scale_kernel(bf16* y, const bf16* x, float kept, float p, uint64_t seed, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = p > 0 && !dropout_keep(seed, uint64_t(i), p) ? cuda::to_bf(0.0f) : cuda::to_bf(cuda::to_f(x[i]) * kept);
}
}  // namespace

void CudaOps::dropout_scale(Tensor y, const Tensor& x, float factor, float p, uint64_t seed) {
  const auto prof = profile("dropout_scale");
  SOLTRAIN_CHECK(y.numel() == x.numel() && x.dtype == DType::BF16 && y.dtype == DType::BF16 && p >= 0 && p < 1,
                 "dropout_scale");
  const float kept = p > 0 ? factor / (1.0f - p) : factor;
  dropout_scale_kernel<<<cuda::blocks_for(x.numel(), 256), 256, 0, stream_>>>(y.as<bf16>(), x.as<bf16>(), kept, p, seed,
                                                                              x.numel());
  CUDA_CHECK_LAUNCH();
}

}  // namespace soltrain
