// CUDA: RMSNorm, one warp per row; fp32 statistics. The normalised value is held as the input's type holds
// it before the weight multiplies it, as transformers does (`x̂.to(input_dtype)`): rounded to bf16 for a bf16
// residual stream, exact for an fp32 one (transformers under autocast); y is rounded once, to bf16. The weight gradient
// is a deterministic column sum. Rows whose width is a multiple of 8 move 16-byte vectors (8 bf16 per lane per access):
// with 2-byte accesses these kernels ran at a sixth of the memory bandwidth (32 ms of a 270 ms Qwen3-0.6B step).
#include <algorithm>
#include <type_traits>

#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/launchers.h"

namespace soltrain {

using cuda::bf16;
using cuda::load8;
using cuda::store8;
using cuda::to_bf;
using cuda::to_f;
using cuda::Vec8;

namespace {
constexpr int kWarps = 8;

// kAdd: x is a, and the row is sum = a + b, stored in the residual type TR and written out before it is
// normalised, in the same order and from the same stored values as the plain kernel reading that sum (so a
// recompute through rmsnorm_forward gives bitwise the same y and rstd). TR is bf16 or float (the residual
// stream, see Transformer::residual_dtype); b, w and y are bf16.
template <typename TR, bool kVec, bool kAdd>
__global__ void rmsnorm_fwd(bf16* y, float* rstd, const TR* x, const bf16* w, int64_t R, int64_t C, float eps, TR* sum,
                            const bf16* b) {
  const int64_t r = int64_t(blockIdx.x) * kWarps + threadIdx.y;
  if (r >= R) return;
  const TR* xr = (kAdd ? sum : x) + r * C;  // the row normalised (its second read)
  float ss = 0.f;
  if constexpr (kVec) {
    for (int64_t c = threadIdx.x * 8; c < C; c += 256) {
      cuda::F8 v = cuda::load8f(x + r * C + c);
      if constexpr (kAdd) {
        const Vec8 u = load8(b + r * C + c);
        for (int i = 0; i < 8; ++i) v.v[i] = cuda::as_stored<TR>(v.v[i] + u[i]);
        cuda::store8f(sum + r * C + c, v);
      }
      for (int i = 0; i < 8; ++i) ss += v.v[i] * v.v[i];
    }
  } else {
    for (int64_t c = threadIdx.x; c < C; c += 32) {
      float v = cuda::ld(x + r * C + c);
      if constexpr (kAdd) {
        v = cuda::as_stored<TR>(v + to_f(b[r * C + c]));
        cuda::st(sum + r * C + c, v);
      }
      ss += v * v;
    }
  }
  const float rs = rsqrtf(cuda::warp_sum(ss) / float(C) + eps);
  if (threadIdx.x == 0) rstd[r] = rs;
  if constexpr (kVec) {
    for (int64_t c = threadIdx.x * 8; c < C; c += 256) {
      const cuda::F8 v = cuda::load8f(xr + c);
      const Vec8 wv = load8(w + c);
      Vec8 out;
      for (int i = 0; i < 8; ++i) out.set(i, wv[i] * cuda::as_stored<TR>(v.v[i] * rs));
      store8(y + r * C + c, out);
    }
  } else {
    for (int64_t c = threadIdx.x; c < C; c += 32)
      y[r * C + c] = to_bf(to_f(w[c]) * cuda::as_stored<TR>(cuda::ld(xr + c) * rs));
  }
}

// Few rows (a decode step's tokens): a block per row, so that every SM takes part (a warp per row put 64 rows on 8
// SMs, each warp walking its 4096 columns alone: ~30 us a call at Qwen3-8B, 72 calls a decode step). Each thread
// moves 16-byte vectors; the arithmetic is the kernel's above but for the order in which the sum of squares is
// reduced. rmsnorm_forward and add_rmsnorm_forward pick the form by the same row count, so a recompute through the
// plain kernel still gives its forward's values bitwise.
constexpr int64_t kRowsPerBlockBelow = 512;
template <typename TR, bool kAdd>
__global__ void rmsnorm_fwd_rows(bf16* y, float* rstd, const TR* x, const bf16* w, int64_t C, float eps, TR* sum,
                                 const bf16* b) {
  const int64_t r = blockIdx.x;
  const TR* xr = (kAdd ? sum : x) + r * C;
  float ss = 0.f;
  for (int64_t c = threadIdx.x * 8; c < C; c += int64_t(blockDim.x) * 8) {
    cuda::F8 v = cuda::load8f(x + r * C + c);
    if constexpr (kAdd) {
      const Vec8 u = load8(b + r * C + c);
      for (int i = 0; i < 8; ++i) v.v[i] = cuda::as_stored<TR>(v.v[i] + u[i]);
      cuda::store8f(sum + r * C + c, v);  // (read back below by this same thread)
    }
    for (int i = 0; i < 8; ++i) ss += v.v[i] * v.v[i];
  }
  __shared__ float part[32];
  ss = cuda::warp_sum(ss);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.f;
  for (int i = 0; i < int(blockDim.x / 32); ++i) total += part[i];
  const float rs = rsqrtf(total / float(C) + eps);
  if (threadIdx.x == 0) rstd[r] = rs;
  for (int64_t c = threadIdx.x * 8; c < C; c += int64_t(blockDim.x) * 8) {
    const cuda::F8 v = cuda::load8f(xr + c);
    const Vec8 wv = load8(w + c);
    Vec8 out;
    for (int i = 0; i < 8; ++i) out.set(i, wv[i] * cuda::as_stored<TR>(v.v[i] * rs));
    store8(y + r * C + c, out);
  }
}
// Threads for a block per row: a 16-byte vector each where the row allows, 32 to 512.
unsigned row_threads(int64_t C) {
  return unsigned(std::min<int64_t>(512, std::max<int64_t>(32, (C / 8 + 31) / 32 * 32)));
}

// dx (= or +=) in the residual type TR; with dx_rounded, the result also rounded to bf16 there (the GEMMs'
// input when the residual gradient is kept in fp32).
template <typename TR, bool kVec>
__global__ void rmsnorm_bwd(TR* dx, bool accumulate, const bf16* dy, const TR* x, const bf16* w, const float* rstd,
                            int64_t R, int64_t C, bf16* dx_rounded) {
  const int64_t r = int64_t(blockIdx.x) * kWarps + threadIdx.y;
  if (r >= R) return;
  const float rs = rstd[r];
  const TR* xr = x + r * C;
  const bf16* gr = dy + r * C;
  TR* dr = dx + r * C;
  float dot = 0.f;
  if constexpr (kVec) {
    for (int64_t c = threadIdx.x * 8; c < C; c += 256) {
      const Vec8 g = load8(gr + c), wv = load8(w + c);
      const cuda::F8 xv = cuda::load8f(xr + c);
      for (int i = 0; i < 8; ++i) dot += g[i] * wv[i] * xv.v[i] * rs;
    }
  } else {
    for (int64_t c = threadIdx.x; c < C; c += 32) dot += to_f(gr[c]) * to_f(w[c]) * cuda::ld(xr + c) * rs;
  }
  const float mean = cuda::warp_sum(dot) / float(C);
  if constexpr (kVec) {
    for (int64_t c = threadIdx.x * 8; c < C; c += 256) {
      const Vec8 g = load8(gr + c), wv = load8(w + c);
      const cuda::F8 xv = cuda::load8f(xr + c);
      cuda::F8 out;
      if (accumulate) out = cuda::load8f(dr + c);
      for (int i = 0; i < 8; ++i) {
        const float v = rs * (g[i] * wv[i] - xv.v[i] * rs * mean);
        out.v[i] = accumulate ? out.v[i] + v : v;
      }
      cuda::store8f(dr + c, out);
      if (dx_rounded) cuda::store8f(dx_rounded + r * C + c, out);
    }
  } else {
    for (int64_t c = threadIdx.x; c < C; c += 32) {
      const float xh = cuda::ld(xr + c) * rs;
      const float v = rs * (to_f(gr[c]) * to_f(w[c]) - xh * mean);
      const float out = accumulate ? cuda::ld(dr + c) + v : v;
      cuda::st(dr + c, out);
      if (dx_rounded) dx_rounded[r * C + c] = to_bf(out);
    }
  }
}

bool vectorizable(const Tensor& t, int64_t C) {
  return C % 8 == 0 && cuda::aligned16(t.data);
}
}  // namespace

void CudaOps::rmsnorm_forward(Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps) {
  const auto prof = profile("rmsnorm_forward");
  const int64_t C = x.dim(-1), R = x.numel() / C;
  const dim3 grid(unsigned((R + kWarps - 1) / kWarps)), block(32, kWarps);
  const bool vec = vectorizable(x, C) && vectorizable(y, C) && vectorizable(w, C);
  auto run = [&](auto* xp) {
    using TR = std::remove_pointer_t<decltype(xp)>;
    if (vec && R > 0 && R < kRowsPerBlockBelow)
      rmsnorm_fwd_rows<TR, false><<<unsigned(R), row_threads(C), 0, stream_>>>(y.as<bf16>(), rstd.f32(), xp,
                                                                             w.as<bf16>(), C, eps, nullptr, nullptr);
    else if (vec)
      rmsnorm_fwd<TR, true, false>
          <<<grid, block, 0, stream_>>>(y.as<bf16>(), rstd.f32(), xp, w.as<bf16>(), R, C, eps, nullptr, nullptr);
    else
      rmsnorm_fwd<TR, false, false>
          <<<grid, block, 0, stream_>>>(y.as<bf16>(), rstd.f32(), xp, w.as<bf16>(), R, C, eps, nullptr, nullptr);
  };
  if (x.dtype == DType::F32)
    run(x.f32());
  else
    run(x.as<bf16>());
  CUDA_CHECK_LAUNCH();
}

void CudaOps::add_rmsnorm_forward(Tensor sum, Tensor y, Tensor rstd, const Tensor& a, const Tensor& b, const Tensor& w,
                                  float eps) {
  const auto prof = profile("add_rmsnorm_forward");
  const int64_t C = a.dim(-1), R = a.numel() / C;
  SOLTRAIN_CHECK(sum.dtype == a.dtype, "add_rmsnorm_forward: the sum and its residual input differ in dtype");
  const dim3 grid(unsigned((R + kWarps - 1) / kWarps)), block(32, kWarps);
  const bool vec =
      vectorizable(a, C) && vectorizable(b, C) && vectorizable(sum, C) && vectorizable(y, C) && vectorizable(w, C);
  auto run = [&](auto* ap, auto* sp) {
    using TR = std::remove_pointer_t<decltype(sp)>;
    if (vec && R > 0 && R < kRowsPerBlockBelow)
      rmsnorm_fwd_rows<TR, true><<<unsigned(R), row_threads(C), 0, stream_>>>(y.as<bf16>(), rstd.f32(), ap,
                                                                            w.as<bf16>(), C, eps, sp, b.as<bf16>());
    else if (vec)
      rmsnorm_fwd<TR, true, true>
          <<<grid, block, 0, stream_>>>(y.as<bf16>(), rstd.f32(), ap, w.as<bf16>(), R, C, eps, sp, b.as<bf16>());
    else
      rmsnorm_fwd<TR, false, true>
          <<<grid, block, 0, stream_>>>(y.as<bf16>(), rstd.f32(), ap, w.as<bf16>(), R, C, eps, sp, b.as<bf16>());
  };
  if (a.dtype == DType::F32)
    run(static_cast<const float*>(a.f32()), sum.f32());
  else
    run(static_cast<const bf16*>(a.as<bf16>()), sum.as<bf16>());
  CUDA_CHECK_LAUNCH();
}

void CudaOps::rmsnorm_backward(Tensor dx, bool accumulate_dx, Tensor dw, const Tensor& dy, const Tensor& x,
                               const Tensor& w, const Tensor& rstd, Tensor dx_rounded) {
  const auto prof = profile("rmsnorm_backward");
  const int64_t C = x.dim(-1), R = x.numel() / C;
  SOLTRAIN_CHECK(dx.dtype == x.dtype, "rmsnorm_backward: dx and x differ in dtype");
  const dim3 grid(unsigned((R + kWarps - 1) / kWarps)), block(32, kWarps);
  const bool vec = vectorizable(x, C) && vectorizable(dy, C) && vectorizable(dx, C) && vectorizable(w, C) &&
                   (!dx_rounded.defined() || vectorizable(dx_rounded, C));
  bf16* rounded = dx_rounded.defined() ? dx_rounded.as<bf16>() : nullptr;
  auto run = [&](auto* dxp, auto* xp) {
    using TR = std::remove_pointer_t<decltype(dxp)>;
    if (vec)
      rmsnorm_bwd<TR, true>
          <<<grid, block, 0, stream_>>>(dxp, accumulate_dx, dy.as<bf16>(), xp, w.as<bf16>(), rstd.f32(), R, C, rounded);
    else
      rmsnorm_bwd<TR, false>
          <<<grid, block, 0, stream_>>>(dxp, accumulate_dx, dy.as<bf16>(), xp, w.as<bf16>(), rstd.f32(), R, C, rounded);
  };
  if (x.dtype == DType::F32)
    run(dx.f32(), static_cast<const float*>(x.f32()));
  else
    run(dx.as<bf16>(), static_cast<const bf16*>(x.as<bf16>()));
  CUDA_CHECK_LAUNCH();
  if (!dw.defined()) return;  // a frozen weight: no gradient
  float* partials = static_cast<float*>(scratch(size_t(cuda::column_sum_partial_floats(R, C, sm_count_)) * 4));
  if (x.dtype == DType::F32)
    cuda::column_sum(dw.f32(), dy.as<bf16>(), x.f32(), rstd.f32(), R, C, partials, sm_count_, stream_);
  else
    cuda::column_sum(dw.f32(), dy.as<bf16>(), x.as<bf16>(), rstd.f32(), R, C, partials, sm_count_, stream_);
}

}  // namespace soltrain
