// CUDA: rotary embedding in place on bf16 [N, heads, hd], half-rotation layout, fp32 angles and math.
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace soltrain {

using cuda::bf16;

namespace {
// One thread per (token, frequency): the angle's sincos (full precision, the expensive part) is computed
// once and applied to every head of the token; neighbouring threads touch neighbouring elements of a head.
__global__ void rope_kernel(bf16* x, const int32_t* pos, const float* inv_freq, int64_t N, int64_t heads, int64_t half,
                            float sign) {
  const int64_t total = N * half;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = t % half, n = t / half;
    float s, c;
    sincosf(float(pos[n]) * inv_freq[i], &s, &c);  // full-precision sincos, not the fast intrinsic
    s *= sign;
    for (int64_t h = 0; h < heads; ++h) {
      bf16* v = x + (n * heads + h) * 2 * half;
      const float a = cuda::to_f(v[i]), b = cuda::to_f(v[i + half]);
      v[i] = cuda::to_bf(a * c - b * s);
      v[i + half] = cuda::to_bf(b * c + a * s);
    }
  }
}
}  // namespace

void CudaOps::rope(Tensor x, const SeqLayout& seq, const Tensor& inv_freq, bool inverse) {
  const auto prof = profile("rope");
  const int64_t N = x.dim(0), heads = x.dim(1), half = x.dim(2) / 2;
  rope_kernel<<<cuda::blocks_for(N * half, 256), 256, 0, stream_>>>(x.as<bf16>(), seq.positions.i32(), inv_freq.f32(),
                                                                    N, heads, half, inverse ? -1.f : 1.f);
  CUDA_CHECK_LAUNCH();
}

}  // namespace soltrain
