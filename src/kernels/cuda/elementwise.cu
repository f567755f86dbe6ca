// CUDA: dtype conversion, residual adds, scaling, and deterministic sums read back to the host.
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace soltrain {

using cuda::bf16;
using cuda::blocks_for;

namespace {
__global__ void f32_to_bf16_kernel(bf16* dst, const float* src, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = cuda::to_bf(src[i]);
}
__global__ void bf16_to_f32_kernel(float* dst, const bf16* src, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = cuda::to_f(src[i]);
}
__global__ void add_bf16_kernel(bf16* x, const bf16* y, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = cuda::to_bf(cuda::to_f(x[i]) + cuda::to_f(y[i]));
}
__global__ void add_bf16x8_kernel(bf16* x, const bf16* y, int64_t n8) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n8; i += int64_t(gridDim.x) * blockDim.x) {
    cuda::Vec8 a = cuda::load8(x + 8 * i);
    const cuda::Vec8 b = cuda::load8(y + 8 * i);
    for (int j = 0; j < 8; ++j) a.set(j, a[j] + b[j]);
    cuda::store8(x + 8 * i, a);
  }
}
__global__ void add_f32_kernel(float* x, const float* y, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] += y[i];
}
__global__ void scale_f32_kernel(float* x, float f, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] *= f;
}

constexpr int kReduceBlocks = 1024, kReduceThreads = 256;

// Each block sums a fixed grid-stride subset in double; one block then adds the partials in order.
template <bool kSquare>
__global__ void partial_sums(double* partials, const float* x, int64_t n) {
  __shared__ double s[kReduceThreads];
  double t = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    t += kSquare ? double(x[i]) * x[i] : double(x[i]);
  s[threadIdx.x] = t;
  __syncthreads();
  for (int w = kReduceThreads / 2; w > 0; w >>= 1) {
    if (int(threadIdx.x) < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = s[0];
}
// out (=, or += with accumulate) the partials added in order by one block.
__global__ void final_sum_to(double* out, const double* partials, int n, bool accumulate) {
  __shared__ double s[kReduceThreads];
  double t = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) t += partials[i];
  s[threadIdx.x] = t;
  __syncthreads();
  for (int w = kReduceThreads / 2; w > 0; w >>= 1) {
    if (int(threadIdx.x) < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = accumulate ? *out + s[0] : s[0];
}
// One block per document: a fixed tree over its tokens, in double.
__global__ void segment_sum_kernel(float* out, const float* x, const int32_t* cu) {
  __shared__ double s[kReduceThreads];
  const int d = blockIdx.x;
  double t = 0;
  for (int i = cu[d] + int(threadIdx.x); i < cu[d + 1]; i += blockDim.x) t += x[i];
  s[threadIdx.x] = t;
  __syncthreads();
  for (int w = kReduceThreads / 2; w > 0; w >>= 1) {
    if (int(threadIdx.x) < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[d] = float(s[0]);
}
__global__ void fill_f32_kernel(float* x, float v, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = v;
}
}  // namespace

void CudaOps::convert(Tensor dst, const Tensor& src) {
  const auto prof = profile("convert");
  SOLTRAIN_CHECK(dst.numel() == src.numel(), "convert sizes");
  const int64_t n = src.numel();
  if (dst.dtype == src.dtype) return copy(dst, src);
  if (dst.dtype == DType::BF16 && src.dtype == DType::F32)
    f32_to_bf16_kernel<<<blocks_for(n, 256), 256, 0, stream_>>>(dst.as<bf16>(), src.f32(), n);
  else if (dst.dtype == DType::F32 && src.dtype == DType::BF16)
    bf16_to_f32_kernel<<<blocks_for(n, 256), 256, 0, stream_>>>(dst.f32(), src.as<bf16>(), n);
  else
    SOLTRAIN_CHECK(false, "convert ", dtype_name(src.dtype), " -> ", dtype_name(dst.dtype));
  CUDA_CHECK_LAUNCH();
}

void CudaOps::add_inplace(Tensor x, const Tensor& y) {
  const auto prof = profile("add_inplace");
  SOLTRAIN_CHECK(x.numel() == y.numel() && x.dtype == y.dtype && (x.dtype == DType::BF16 || x.dtype == DType::F32),
                 "add_inplace");
  const int64_t n = x.numel();
  if (x.dtype == DType::F32) {  // ZeRO-3 adds each micro-batch's reduced gradients into the rank's slice
    add_f32_kernel<<<blocks_for(n, 256), 256, 0, stream_>>>(x.f32(), y.f32(), n);
  } else if (n % 8 == 0 && cuda::aligned16(x.data) && cuda::aligned16(y.data))
    add_bf16x8_kernel<<<blocks_for(n / 8, 256), 256, 0, stream_>>>(x.as<bf16>(), y.as<bf16>(), n / 8);
  else
    add_bf16_kernel<<<blocks_for(n, 256), 256, 0, stream_>>>(x.as<bf16>(), y.as<bf16>(), n);
  CUDA_CHECK_LAUNCH();
}

void CudaOps::scale(Tensor x, float factor) {
  const auto prof = profile("scale");
  scale_f32_kernel<<<blocks_for(x.numel(), 256), 256, 0, stream_>>>(x.f32(), factor, x.numel());
  CUDA_CHECK_LAUNCH();
}

namespace {
double reduce(CudaOps& ops, const Tensor& x, bool square, double* partials, double* out, double* host) {
  const cudaStream_t s = ops.stream();
  if (square)
    partial_sums<true><<<kReduceBlocks, kReduceThreads, 0, s>>>(partials, x.f32(), x.numel());
  else
    partial_sums<false><<<kReduceBlocks, kReduceThreads, 0, s>>>(partials, x.f32(), x.numel());
  CUDA_CHECK_LAUNCH();
  final_sum_to<<<1, kReduceThreads, 0, s>>>(out, partials, kReduceBlocks, false);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaMemcpyAsync(host, out, sizeof(double), cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  return *host;
}
}  // namespace

double CudaOps::sum(const Tensor& x) {
  const auto prof = profile("sum (host sync)");
  auto* partials = static_cast<double*>(scratch(kReduceBlocks * sizeof(double)));
  return reduce(*this, x, false, partials, static_cast<double*>(reduce_out_.data()), host_result_);
}

double CudaOps::sum_squares(const Tensor& x) {
  const auto prof = profile("sum_squares (host sync)");
  auto* partials = static_cast<double*>(scratch(kReduceBlocks * sizeof(double)));
  return reduce(*this, x, true, partials, static_cast<double*>(reduce_out_.data()), host_result_);
}

}  // namespace soltrain

namespace soltrain {

void CudaOps::reduce_sum(Tensor out, const Tensor& x, bool squares, bool accumulate) {
  const auto prof = profile("reduce_sum");
  SOLTRAIN_CHECK(out.dtype == DType::F64 && out.numel() == 1, "reduce_sum into ", dtype_name(out.dtype));
  auto* partials = static_cast<double*>(scratch(kReduceBlocks * sizeof(double)));
  if (squares)
    partial_sums<true><<<kReduceBlocks, kReduceThreads, 0, stream_>>>(partials, x.f32(), x.numel());
  else
    partial_sums<false><<<kReduceBlocks, kReduceThreads, 0, stream_>>>(partials, x.f32(), x.numel());
  CUDA_CHECK_LAUNCH();
  final_sum_to<<<1, kReduceThreads, 0, stream_>>>(out.as<double>(), partials, kReduceBlocks, accumulate);
  CUDA_CHECK_LAUNCH();
}

void CudaOps::segment_sum(Tensor out, const Tensor& x, const Tensor& cu_seqlens) {
  const auto prof = profile("segment_sum");
  SOLTRAIN_CHECK(out.numel() == cu_seqlens.numel() - 1, "segment_sum: ", out.numel(), " outputs for ",
                 cu_seqlens.numel() - 1, " documents");
  if (out.numel() == 0) return;
  segment_sum_kernel<<<unsigned(out.numel()), kReduceThreads, 0, stream_>>>(out.f32(), x.f32(), cu_seqlens.i32());
  CUDA_CHECK_LAUNCH();
}

void CudaOps::fill(Tensor x, float value) {
  const auto prof = profile("fill");
  fill_f32_kernel<<<blocks_for(x.numel(), 256), 256, 0, stream_>>>(x.f32(), value, x.numel());
  CUDA_CHECK_LAUNCH();
}

}  // namespace soltrain
