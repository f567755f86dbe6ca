// CUDA: deterministic column sums (RMSNorm weight gradients, bias gradients): fixed row splits write
// partials, a second pass adds them in order. No float atomics, so results repeat bit for bit.
#include <algorithm>

#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launchers.h"

namespace soltrain::cuda {

namespace {
constexpr int kCols = 32, kRowsPar = 8;

int64_t splits_for(int64_t R, int64_t C, int sms) {
  const int64_t cols_per_block = C % 8 == 0 ? kCols * 8 : kCols;  // the vectorised kernel's blocks are wider
  const int64_t col_blocks = (C + cols_per_block - 1) / cols_per_block;
  return std::clamp<int64_t>((4 * sms + col_blocks - 1) / col_blocks, 1, std::max<int64_t>(1, R / 64));
}

// x (the normalised rows' input) is bf16 or fp32: the residual stream's type.
template <typename TX>
__global__ void column_partials(float* partials, const bf16* dy, const TX* x, const float* rstd, int64_t R, int64_t C,
                                int64_t rows_per_split) {
  __shared__ float acc[kRowsPar][kCols + 1];
  const int64_t c = int64_t(blockIdx.x) * kCols + threadIdx.x;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_split, r1 = min(R, r0 + rows_per_split);
  float s = 0.f;
  if (c < C)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowsPar) {
      const float g = to_f(dy[r * C + c]);
      s += x ? g * (ld(x + r * C + c) * rstd[r]) : g;
    }
  acc[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float t = 0.f;
    for (int i = 0; i < kRowsPar; ++i) t += acc[i][threadIdx.x];
    partials[int64_t(blockIdx.y) * C + c] = t;
  }
}

// The same with 8 consecutive columns per thread and 16-byte loads (C % 8 == 0, aligned rows).
template <typename TX>
__global__ void column_partials_vec8(float* partials, const bf16* dy, const TX* x, const float* rstd, int64_t R,
                                     int64_t C, int64_t rows_per_split) {
  __shared__ float acc[kRowsPar][kCols * 8 + 4];
  const int64_t c = (int64_t(blockIdx.x) * kCols + threadIdx.x) * 8;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_split, r1 = min(R, r0 + rows_per_split);
  float s[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  if (c < C)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowsPar) {
      const uint4 g4 = *reinterpret_cast<const uint4*>(dy + r * C + c);
      const bf16* g = reinterpret_cast<const bf16*>(&g4);
      if (x) {
        const F8 xv = load8f(x + r * C + c);
        const float rs = rstd[r];
        for (int i = 0; i < 8; ++i) s[i] += to_f(g[i]) * (xv.v[i] * rs);
      } else {
        for (int i = 0; i < 8; ++i) s[i] += to_f(g[i]);
      }
    }
  for (int i = 0; i < 8; ++i) acc[threadIdx.y][threadIdx.x * 8 + i] = s[i];
  __syncthreads();
  if (threadIdx.y == 0 && c < C)
    for (int i = 0; i < 8; ++i) {
      float t = 0.f;
      for (int k = 0; k < kRowsPar; ++k) t += acc[k][threadIdx.x * 8 + i];
      partials[int64_t(blockIdx.y) * C + c + i] = t;
    }
}

__global__ void column_finish(float* out, const float* partials, int64_t C, int64_t splits) {
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < C; c += int64_t(gridDim.x) * blockDim.x) {
    float t = 0.f;
    for (int64_t s = 0; s < splits; ++s) t += partials[s * C + c];
    out[c] += t;
  }
}
}  // namespace

int64_t column_sum_partial_floats(int64_t R, int64_t C, int sms) {
  return splits_for(R, C, sms) * C;
}

namespace {
template <typename TX>
void column_sum_of(float* out, const bf16* dy, const TX* x, const float* rstd, int64_t R, int64_t C, float* partials,
                   int sms, cudaStream_t s) {
  const int64_t splits = splits_for(R, C, sms);
  const int64_t rows_per_split = (R + splits - 1) / splits;
  const bool vec =
      C % 8 == 0 && reinterpret_cast<uintptr_t>(dy) % 16 == 0 && (!x || reinterpret_cast<uintptr_t>(x) % 16 == 0);
  if (vec) {
    const dim3 grid(unsigned((C / 8 + kCols - 1) / kCols), unsigned(splits));
    column_partials_vec8<<<grid, dim3(kCols, kRowsPar), 0, s>>>(partials, dy, x, rstd, R, C, rows_per_split);
  } else {
    const dim3 grid(unsigned((C + kCols - 1) / kCols), unsigned(splits));
    column_partials<<<grid, dim3(kCols, kRowsPar), 0, s>>>(partials, dy, x, rstd, R, C, rows_per_split);
  }
  CUDA_CHECK_LAUNCH();
  column_finish<<<blocks_for(C, 256), 256, 0, s>>>(out, partials, C, splits);
  CUDA_CHECK_LAUNCH();
}
}  // namespace

void column_sum(float* out, const bf16* dy, const bf16* x, const float* rstd, int64_t R, int64_t C, float* partials,
                int sms, cudaStream_t s) {
  column_sum_of(out, dy, x, rstd, R, C, partials, sms, s);
}
void column_sum(float* out, const bf16* dy, const float* x, const float* rstd, int64_t R, int64_t C, float* partials,
                int sms, cudaStream_t s) {
  column_sum_of(out, dy, x, rstd, R, C, partials, sms, s);
}

namespace {
__global__ void add_partial_rows_kernel(float* out, const float* partials, int blocks, int64_t C) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float s = 0.f;
  for (int b = 0; b < blocks; ++b) s += partials[int64_t(b) * C + c];
  out[c] += s;
}
}  // namespace

void add_partial_rows(float* out, const float* partials, int blocks, int64_t C, cudaStream_t s) {
  add_partial_rows_kernel<<<unsigned((C + 127) / 128), 128, 0, s>>>(out, partials, blocks, C);
  CUDA_CHECK_LAUNCH();
}

}  // namespace soltrain::cuda
