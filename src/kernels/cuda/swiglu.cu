// CUDA: SwiGLU, silu(gate) * up, and its backward (fp32 math on bf16 tensors).
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace soltrain {

using cuda::bf16;
using cuda::to_bf;
using cuda::to_f;

namespace {
__global__ void swiglu_fwd(bf16* out, const bf16* gate, const bf16* up, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = to_f(gate[i]);
    out[i] = to_bf(g / (1.f + expf(-g)) * to_f(up[i]));
  }
}
__global__ void swiglu_bwd(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = to_f(gate[i]), u = to_f(up[i]), d = to_f(dout[i]);
    const float sig = 1.f / (1.f + expf(-g));
    dup[i] = to_bf(d * g * sig);
    dgate[i] = to_bf(d * u * sig * (1.f + g * (1.f - sig)));
  }
}
}  // namespace

void CudaOps::swiglu_forward(Tensor out, const Tensor& gate, const Tensor& up) {
  const auto prof = profile("swiglu_forward");
  swiglu_fwd<<<cuda::blocks_for(out.numel(), 256), 256, 0, stream_>>>(out.as<bf16>(), gate.as<bf16>(),
                                                                        up.as<bf16>(), out.numel());
  CUDA_CHECK_LAUNCH();
}

void CudaOps::swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate, const Tensor& up) {
  const auto prof = profile("swiglu_backward");
  swiglu_bwd<<<cuda::blocks_for(gate.numel(), 256), 256, 0, stream_>>>(
      dgate.as<bf16>(), dup.as<bf16>(), dout.as<bf16>(), gate.as<bf16>(), up.as<bf16>(), gate.numel());
  CUDA_CHECK_LAUNCH();
}

}  // namespace soltrain
