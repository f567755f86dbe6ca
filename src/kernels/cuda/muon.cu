// CUDA: Muon's three steps (kernels/ops.h): the momentum and Nesterov input with a fixed-order Σu², Newton–Schulz
// on cuBLASLt GEMMs in the activation dtype (bf16 in and out, fp32 accumulation: torch's bf16 matmuls), and the
// decayed step on the fp32 masters with the compute copy written in the same pass.
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace soltrain {

using cuda::bf16;

namespace {
constexpr int kThreads = 256, kBlocks = 256;  // a fixed grid: Σu²'s partials are summed in one order

template <typename U>
__global__ void muon_momentum_kernel(U* u, float* m, const float* g, double* partials, int64_t n, float momentum,
                                     float scale, const double* grad_sumsq, float max_grad_norm, bool nesterov) {
  if (grad_sumsq) scale *= clip_factor(*grad_sumsq, max_grad_norm);
  double ss = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = g[i] * scale;
    const float mi = m[i] + (1.0f - momentum) * (gi - m[i]);
    m[i] = mi;
    cuda::st(u + i, nesterov ? gi + momentum * (mi - gi) : mi);
    const double stored = cuda::ld(u + i);  // Σ over what the iteration reads
    ss += stored * stored;
  }
  __shared__ double part[kThreads];
  part[threadIdx.x] = ss;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = part[0];
}

__global__ void sum_partials(double* out, const double* partials) {
  if (threadIdx.x == 0) {
    double s = 0;
    for (int i = 0; i < kBlocks; ++i) s += partials[i];
    *out = s;
  }
}

template <typename X>
__global__ void scale_by_inverse_norm(X* x, int64_t n, const double* sumsq, float norm_scale, float eps) {
  const float inv = 1.0f / (float(sqrt(*sumsq)) * norm_scale + eps);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    cuda::st(x + i, cuda::ld(x + i) * inv);
}

template <typename X>
__global__ void muon_update_kernel(float* w, const X* u, bf16* copy, int64_t n, float decay, float step) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float wi = w[i] * decay - step * cuda::ld(u + i);
    w[i] = wi;
    if (copy) copy[i] = cuda::to_bf(wi);
  }
}
// NorMuon's variance reduction on a tall or square matrix x [rows, cols], a block per row (read contiguously): the
// mean of the row's squares moves its EMA, then the row is scaled by the EMA's inverse square root.
template <typename X>
__global__ void normuon_variance_rows_kernel(X* x, float* buf, int64_t cols, float beta2) {
  const int64_t line = blockIdx.x, along = cols;
  auto index = [&](int64_t k) { return line * cols + k; };
  double ss = 0;
  for (int64_t k = threadIdx.x; k < along; k += blockDim.x) {
    const double v = cuda::ld(x + index(k));
    ss += v * v;
  }
  __shared__ double part[kThreads];
  __shared__ float scale;
  part[threadIdx.x] = ss;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const float b = beta2 * buf[line] + (1.0f - beta2) * float(part[0] / double(along));
    buf[line] = b;
    scale = rsqrtf(fmaxf(b, 1e-10f));
  }
  __syncthreads();
  for (int64_t k = threadIdx.x; k < along; k += blockDim.x) cuda::st(x + index(k), cuda::ld(x + index(k)) * scale);
}

// The same per column of a wide matrix: a block holds 32 columns and 32 lanes of rows, so each warp reads 32
// consecutive values of a row (coalesced; one block per column would stride by cols for every value).
template <typename X>
__global__ void normuon_variance_columns_kernel(X* x, float* buf, int64_t rows, int64_t cols, float beta2) {
  const int64_t c = int64_t(blockIdx.x) * 32 + threadIdx.x;
  double ss = 0;
  if (c < cols)
    for (int64_t r = threadIdx.y; r < rows; r += 32) {
      const double v = cuda::ld(x + r * cols + c);
      ss += v * v;
    }
  __shared__ double part[32][33];
  __shared__ float scale[32];
  part[threadIdx.y][threadIdx.x] = ss;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    double total = 0;
    for (int k = 0; k < 32; ++k) total += part[k][threadIdx.x];
    const float b = beta2 * buf[c] + (1.0f - beta2) * float(total / double(rows));
    buf[c] = b;
    scale[threadIdx.x] = rsqrtf(fmaxf(b, 1e-10f));
  }
  __syncthreads();
  if (c < cols)
    for (int64_t r = threadIdx.y; r < rows; r += 32)
      cuda::st(x + r * cols + c, cuda::ld(x + r * cols + c) * scale[threadIdx.x]);
}

template <typename X>
__global__ void normuon_update_kernel(float* w, const X* u, bf16* copy, int64_t n, float wd_step, float step) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float ui = cuda::ld(u + i), wi = w[i];
    const float next = wi - (ui * wi >= 0.0f ? wi * wd_step : 0.0f) - step * ui;
    w[i] = next;
    if (copy) copy[i] = cuda::to_bf(next);
  }
}
}  // namespace

void CudaOps::muon_momentum(Tensor u, Tensor m, const Tensor& grad, Tensor sumsq, const MuonParams& p) {
  const auto prof = profile("muon_momentum");
  SOLTRAIN_CHECK(u.numel() == m.numel() && grad.numel() == m.numel() && sumsq.dtype == DType::F64,
                 "muon_momentum shapes");
  auto* partials = static_cast<double*>(scratch(kBlocks * sizeof(double)));
  const double* gs = p.grad_sumsq ? static_cast<const double*>(p.grad_sumsq->data) : nullptr;
  if (u.dtype == DType::BF16)
    muon_momentum_kernel<<<kBlocks, kThreads, 0, stream_>>>(u.as<bf16>(), m.f32(), grad.f32(), partials, m.numel(),
                                                            p.momentum, p.grad_scale, gs, p.max_grad_norm, p.nesterov);
  else
    muon_momentum_kernel<<<kBlocks, kThreads, 0, stream_>>>(u.f32(), m.f32(), grad.f32(), partials, m.numel(),
                                                            p.momentum, p.grad_scale, gs, p.max_grad_norm, p.nesterov);
  CUDA_CHECK_LAUNCH();
  sum_partials<<<1, 32, 0, stream_>>>(sumsq.as<double>(), partials);
  CUDA_CHECK_LAUNCH();
}

// The iteration on W [r, c] (r <= c, the wide orientation), in column-major terms: a row-major x of a wide matrix
// is Wᵀ to cuBLASLt (ld c), a tall one's is W itself (ld r). A = W·Wᵀ; B = b·A + c·A·A (A symmetric); W ← a·W + B·W.
void CudaOps::newton_schulz(Tensor x, const Tensor& sumsq, Tensor scratch_t, const MuonParams& p) {
  const auto prof = profile("newton_schulz");
  SOLTRAIN_CHECK(x.shape.size() == 2 && scratch_t.dtype == x.dtype, "newton_schulz: a matrix and its scratch");
  const int64_t rows = x.dim(0), cols = x.dim(1);
  const bool tall = rows > cols;
  const int r = int(tall ? cols : rows), c = int(tall ? rows : cols);
  SOLTRAIN_CHECK(scratch_t.numel() >= 2 * int64_t(r) * r + int64_t(r) * c, "newton_schulz: scratch too small");
  const size_t es = dtype_size(x.dtype);
  auto view = [&](int64_t at, Shape s) {
    return Tensor{static_cast<char*>(scratch_t.data) + at * int64_t(es), x.dtype, std::move(s), x.device};
  };
  Tensor A = view(0, {r, r}), B = view(int64_t(r) * r, {r, r}), Y = view(2 * int64_t(r) * r, {rows, cols});
  const double* ss = static_cast<const double*>(sumsq.data);
  if (x.dtype == DType::BF16)
    scale_by_inverse_norm<<<cuda::blocks_for(x.numel(), 256, 4096), 256, 0, stream_>>>(x.as<bf16>(), x.numel(), ss,
                                                                                       p.norm_scale, p.eps);
  else
    scale_by_inverse_norm<<<cuda::blocks_for(x.numel(), 256, 4096), 256, 0, stream_>>>(x.f32(), x.numel(), ss,
                                                                                       p.norm_scale, p.eps);
  CUDA_CHECK_LAUNCH();
  Tensor cur = x, next = Y;
  for (int s = 0; s < p.ns_steps; ++s) {
    const float ca = p.coefficients ? p.coefficients[s][0] : p.a, cb = p.coefficients ? p.coefficients[s][1] : p.b,
                cc = p.coefficients ? p.coefficients[s][2] : p.c;
    if (tall)  // W is cur (ld r): A = W·Wᵀ
      gemm(false, true, r, r, c, cur, r, cur, r, A, r, 0.0f, nullptr);
    else  // cur is Wᵀ (ld c): A = (Wᵀ)ᵀ·Wᵀ
      gemm(true, false, r, r, c, cur, c, cur, c, A, r, 0.0f, nullptr);
    // (C read from another buffer than D: no copy of A into B, nor of W into the next W)
    gemm(false, false, r, r, r, A, r, A, r, B, r, cb, nullptr, cc, nullptr, &A);  // B = c·A·A + b·A
    if (tall)                                                                     // W ← B·W + a·W
      gemm(false, false, r, c, r, B, r, cur, r, next, r, ca, nullptr, 1.0f, nullptr, &cur);
    else  // Wᵀ ← Wᵀ·B + a·Wᵀ (B symmetric)
      gemm(false, false, c, r, r, cur, c, B, r, next, c, ca, nullptr, 1.0f, nullptr, &cur);
    std::swap(cur, next);
  }
  if (cur.data != x.data) copy(x, cur);
}

void CudaOps::muon_update(Tensor master, const Tensor& x, float decay, float step, Tensor* compute_copy) {
  const auto prof = profile("muon_update");
  SOLTRAIN_CHECK(x.numel() == master.numel(), "muon_update shapes");
  bf16* copy_out = compute_copy ? compute_copy->as<bf16>() : nullptr;
  const unsigned blocks = cuda::blocks_for(master.numel(), 256, 4096);
  if (x.dtype == DType::BF16)
    muon_update_kernel<<<blocks, 256, 0, stream_>>>(master.f32(), x.as<bf16>(), copy_out, master.numel(), decay, step);
  else
    muon_update_kernel<<<blocks, 256, 0, stream_>>>(master.f32(), x.f32(), copy_out, master.numel(), decay, step);
  CUDA_CHECK_LAUNCH();
}

void CudaOps::normuon_variance(Tensor x, Tensor buffer, float beta2) {
  const auto prof = profile("normuon_variance");
  SOLTRAIN_CHECK(x.shape.size() == 2 && buffer.dtype == DType::F32, "normuon_variance: a matrix and an F32 buffer");
  const int64_t rows = x.dim(0), cols = x.dim(1);
  const bool per_row = rows >= cols;
  SOLTRAIN_CHECK(buffer.numel() == (per_row ? rows : cols), "normuon_variance: the buffer's size");
  if (per_row) {  // a block per row, reading it contiguously
    if (x.dtype == DType::BF16)
      normuon_variance_rows_kernel<<<unsigned(rows), kThreads, 0, stream_>>>(x.as<bf16>(), buffer.f32(), cols, beta2);
    else
      normuon_variance_rows_kernel<<<unsigned(rows), kThreads, 0, stream_>>>(x.f32(), buffer.f32(), cols, beta2);
  } else {
    const dim3 block(32, 32);
    const unsigned grid = unsigned((cols + 31) / 32);
    if (x.dtype == DType::BF16)
      normuon_variance_columns_kernel<<<grid, block, 0, stream_>>>(x.as<bf16>(), buffer.f32(), rows, cols, beta2);
    else
      normuon_variance_columns_kernel<<<grid, block, 0, stream_>>>(x.f32(), buffer.f32(), rows, cols, beta2);
  }
  CUDA_CHECK_LAUNCH();
}

void CudaOps::normuon_update(Tensor master, const Tensor& x, float wd_step, float step, Tensor* compute_copy) {
  const auto prof = profile("normuon_update");
  SOLTRAIN_CHECK(x.numel() == master.numel(), "normuon_update shapes");
  bf16* copy_out = compute_copy ? compute_copy->as<bf16>() : nullptr;
  const unsigned blocks = cuda::blocks_for(master.numel(), 256, 4096);
  if (x.dtype == DType::BF16)
    normuon_update_kernel<<<blocks, 256, 0, stream_>>>(master.f32(), x.as<bf16>(), copy_out, master.numel(), wd_step,
                                                       step);
  else
    normuon_update_kernel<<<blocks, 256, 0, stream_>>>(master.f32(), x.f32(), copy_out, master.numel(), wd_step, step);
  CUDA_CHECK_LAUNCH();
}

}  // namespace soltrain
