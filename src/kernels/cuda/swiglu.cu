// CUDA: SwiGLU, silu(gate) * up, and its backward (fp32 math on bf16 tensors).
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace soltrain {

using cuda::bf16;
using cuda::to_bf;
using cuda::to_f;

namespace {
// Vectorised forms: n % 8 == 0 and 16-byte aligned tensors (every real model's intermediate size).
__global__ void swiglu_fwd8(bf16* out, const bf16* gate, const bf16* up, int64_t n8) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n8; i += int64_t(gridDim.x) * blockDim.x) {
    const cuda::Vec8 g = cuda::load8(gate + 8 * i), u = cuda::load8(up + 8 * i);
    cuda::Vec8 o;
    for (int j = 0; j < 8; ++j) o.set(j, g[j] / (1.f + expf(-g[j])) * u[j]);
    cuda::store8(out + 8 * i, o);
  }
}
__global__ void swiglu_bwd8(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up, int64_t n8) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n8; i += int64_t(gridDim.x) * blockDim.x) {
    const cuda::Vec8 g = cuda::load8(gate + 8 * i), u = cuda::load8(up + 8 * i), d = cuda::load8(dout + 8 * i);
    cuda::Vec8 dg, du;
    for (int j = 0; j < 8; ++j) {
      const float sig = 1.f / (1.f + expf(-g[j]));
      du.set(j, d[j] * g[j] * sig);
      dg.set(j, d[j] * u[j] * sig * (1.f + g[j] * (1.f - sig)));
    }
    cuda::store8(dgate + 8 * i, dg);
    cuda::store8(dup + 8 * i, du);
  }
}

// gate_up [N, 2F] (a token's gate, then its up): out [N, F]; 8 at a time where F and the pointers allow.
__global__ void swiglu_packed_fwd8(bf16* out, const bf16* gate_up, int64_t F8, int64_t n8) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n8; i += int64_t(gridDim.x) * blockDim.x) {
    const bf16* gate = gate_up + 8 * (i / F8 * 2 * F8 + i % F8);
    const cuda::Vec8 g = cuda::load8(gate), u = cuda::load8(gate + 8 * F8);
    cuda::Vec8 o;
    for (int j = 0; j < 8; ++j) o.set(j, g[j] / (1.f + expf(-g[j])) * u[j]);
    cuda::store8(out + 8 * i, o);
  }
}
__global__ void swiglu_packed_fwd(bf16* out, const bf16* gate_up, int64_t F, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const bf16* gate = gate_up + i / F * 2 * F + i % F;
    const float g = to_f(gate[0]);
    out[i] = to_bf(g / (1.f + expf(-g)) * to_f(gate[F]));
  }
}

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

void CudaOps::swiglu_packed_forward(Tensor out, const Tensor& gate_up) {
  const auto prof = profile("swiglu_packed_forward");
  const int64_t n = out.numel(), F = out.dim(1);
  SOLTRAIN_CHECK(gate_up.numel() == 2 * n, "swiglu_packed_forward shapes");
  if (n == 0) return;
  if (F % 8 == 0 && cuda::aligned16(out.data) && cuda::aligned16(gate_up.data))
    swiglu_packed_fwd8<<<cuda::blocks_for(n / 8, 256), 256, 0, stream_>>>(out.as<bf16>(), gate_up.as<bf16>(), F / 8,
                                                                          n / 8);
  else
    swiglu_packed_fwd<<<cuda::blocks_for(n, 256), 256, 0, stream_>>>(out.as<bf16>(), gate_up.as<bf16>(), F, n);
  CUDA_CHECK_LAUNCH();
}

void CudaOps::swiglu_forward(Tensor out, const Tensor& gate, const Tensor& up) {
  const auto prof = profile("swiglu_forward");
  const int64_t n = out.numel();
  if (n % 8 == 0 && cuda::aligned16(out.data) && cuda::aligned16(gate.data) && cuda::aligned16(up.data))
    swiglu_fwd8<<<cuda::blocks_for(n / 8, 256), 256, 0, stream_>>>(out.as<bf16>(), gate.as<bf16>(), up.as<bf16>(),
                                                                   n / 8);
  else
    swiglu_fwd<<<cuda::blocks_for(n, 256), 256, 0, stream_>>>(out.as<bf16>(), gate.as<bf16>(), up.as<bf16>(), n);
  CUDA_CHECK_LAUNCH();
}

void CudaOps::swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate, const Tensor& up) {
  const auto prof = profile("swiglu_backward");
  const int64_t n = gate.numel();
  if (n % 8 == 0 && cuda::aligned16(dgate.data) && cuda::aligned16(dup.data) && cuda::aligned16(dout.data) &&
      cuda::aligned16(gate.data) && cuda::aligned16(up.data))
    swiglu_bwd8<<<cuda::blocks_for(n / 8, 256), 256, 0, stream_>>>(dgate.as<bf16>(), dup.as<bf16>(), dout.as<bf16>(),
                                                                   gate.as<bf16>(), up.as<bf16>(), n / 8);
  else
    swiglu_bwd<<<cuda::blocks_for(n, 256), 256, 0, stream_>>>(dgate.as<bf16>(), dup.as<bf16>(), dout.as<bf16>(),
                                                              gate.as<bf16>(), up.as<bf16>(), n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace soltrain
