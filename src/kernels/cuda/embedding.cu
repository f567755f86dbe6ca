// CUDA: embedding lookup, and a deterministic backward: each block owns a range of vocabulary rows and
// walks the tokens in order, so every row's sum has one fixed order and no atomics race.
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace soltrain {

using cuda::bf16;

namespace {
__global__ void embedding_fwd(bf16* out, const int32_t* ids, const bf16* table, int64_t D) {
  const int64_t n = blockIdx.x;
  const bf16* row = table + int64_t(ids[n]) * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) out[n * D + d] = row[d];
}

constexpr int kIdChunk = 1024;

__global__ void embedding_bwd(float* dtable, const int32_t* ids, const bf16* dout, int64_t N, int64_t D,
                              int64_t rows_per_block) {
  __shared__ int32_t chunk[kIdChunk];
  const int64_t lo = int64_t(blockIdx.x) * rows_per_block, hi = lo + rows_per_block;
  for (int64_t base = 0; base < N; base += kIdChunk) {
    const int64_t m = min(int64_t(kIdChunk), N - base);
    __syncthreads();
    for (int64_t i = threadIdx.x; i < m; i += blockDim.x) chunk[i] = ids[base + i];
    __syncthreads();
    for (int64_t i = 0; i < m; ++i) {
      const int64_t id = chunk[i];
      if (id < lo || id >= hi) continue;
      const bf16* g = dout + (base + i) * D;
      float* row = dtable + id * D;
      for (int64_t d = threadIdx.x; d < D; d += blockDim.x) row[d] += cuda::to_f(g[d]);
    }
  }
}
}  // namespace

void CudaOps::embedding_forward(Tensor out, const Tensor& ids, const Tensor& table) {
  const auto prof = profile("embedding_forward");
  const int64_t N = ids.numel(), D = table.dim(1);
  embedding_fwd<<<unsigned(N), 256, 0, stream_>>>(out.as<bf16>(), ids.i32(), table.as<bf16>(), D);
  CUDA_CHECK_LAUNCH();
}

void CudaOps::embedding_backward(Tensor dtable, const Tensor& ids, const Tensor& dout) {
  const auto prof = profile("embedding_backward");
  const int64_t N = ids.numel(), V = dtable.dim(0), D = dtable.dim(1);
  const int64_t blocks = std::min<int64_t>(V, 4 * int64_t(sm_count_));
  const int64_t rows = (V + blocks - 1) / blocks;
  embedding_bwd<<<unsigned((V + rows - 1) / rows), 256, 0, stream_>>>(dtable.f32(), ids.i32(), dout.as<bf16>(), N, D,
                                                                      rows);
  CUDA_CHECK_LAUNCH();
}

}  // namespace soltrain
