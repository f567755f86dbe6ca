// CUDA: fake quantisation for QAT, the CPU twin's arithmetic (kernels/fake_quant.h) per group of values. Groups of
// up to 64 (Int4Weight's 32, Mxfp4's 32, Nvfp4's 16) take one thread each; longer ones (Int8Token's rows,
// Int4Weight's group 256) a block of 256 threads each.
#include "core/error.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/fake_quant.h"

namespace soltrain {

using cuda::bf16;

namespace {

constexpr int kThreads = 256, kThreadGroupMax = 64;

struct Stats {
  float lo, hi, amax;
};
struct Params {
  fq::Int4Params i4;
  fq::Int8Params i8;
  fq::MxParams mx;
  fq::NvParams nv;
};

template <typename T>
constexpr bool kIsBf16 = sizeof(T) == 2;

__device__ Params params_for(const FakeQuant& q, const Stats& s, float tensor_scale, bool bf16) {
  Params p{};
  switch (q.kind) {
    case FakeQuantKind::Int4Weight: p.i4 = fq::int4_params(s.lo, s.hi); break;
    case FakeQuantKind::Int8Token: p.i8 = fq::int8_params(s.lo, s.hi, bf16); break;
    case FakeQuantKind::Mxfp4: p.mx = fq::mx_params(s.amax); break;
    case FakeQuantKind::Nvfp4: p.nv = fq::nv_params(s.amax, tensor_scale, bf16); break;
    case FakeQuantKind::Off: break;
  }
  return p;
}

__device__ float value_for(const FakeQuant& q, const Params& p, float x) {
  switch (q.kind) {
    case FakeQuantKind::Int4Weight: return fq::int4_value(x, p.i4);
    case FakeQuantKind::Int8Token: return fq::int8_value(x, p.i8);
    case FakeQuantKind::Mxfp4: return fq::mx_value(x, p.mx);
    case FakeQuantKind::Nvfp4: return fq::nv_value(x, p.nv);
    case FakeQuantKind::Off: break;
  }
  return x;
}

__device__ void merge(Stats& a, const Stats& b) {
  a.lo = fminf(a.lo, b.lo);
  a.hi = fmaxf(a.hi, b.hi);
  a.amax = fmaxf(a.amax, b.amax);
}

// The block's stats of one group (every thread gets them).
template <typename T>
__device__ Stats block_stats(const T* v, int64_t G) {
  __shared__ Stats part[kThreads / 32];
  Stats s{INFINITY, -INFINITY, 0.0f};
  for (int64_t i = threadIdx.x; i < G; i += blockDim.x) {
    const float x = cuda::ld(v + i);
    merge(s, Stats{x, x, fabsf(x)});
  }
  for (int o = 16; o > 0; o >>= 1)
    merge(s, Stats{__shfl_xor_sync(0xffffffffu, s.lo, o), __shfl_xor_sync(0xffffffffu, s.hi, o),
                   __shfl_xor_sync(0xffffffffu, s.amax, o)});
  __syncthreads();
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = s;
  __syncthreads();
  Stats all = part[0];
  for (int w = 1; w < int(blockDim.x / 32); ++w) merge(all, part[w]);
  return all;
}

template <typename T>
__device__ Stats thread_stats(const T* v, int64_t G) {
  Stats s{INFINITY, -INFINITY, 0.0f};
  for (int64_t i = 0; i < G; ++i) {
    const float x = cuda::ld(v + i);
    merge(s, Stats{x, x, fabsf(x)});
  }
  return s;
}

__device__ float tensor_scale_of(const FakeQuant& q, const float* amax) {
  return q.kind == FakeQuantKind::Nvfp4 ? fq::nv_tensor_scale(*amax) : 0.0f;
}

template <typename T>
__global__ void forward_thread_kernel(T* out, const T* x, int64_t groups, int64_t G, FakeQuant q, const float* amax) {
  const float ts = tensor_scale_of(q, amax);
  for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += int64_t(gridDim.x) * blockDim.x) {
    const T* v = x + g * G;
    const Params p = params_for(q, thread_stats(v, G), ts, kIsBf16<T>);
    for (int64_t i = 0; i < G; ++i) cuda::st(out + g * G + i, value_for(q, p, cuda::ld(v + i)));
  }
}

template <typename T>
__global__ void forward_block_kernel(T* out, const T* x, int64_t groups, int64_t G, FakeQuant q, const float* amax) {
  const float ts = tensor_scale_of(q, amax);
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    const T* v = x + g * G;
    const Params p = params_for(q, block_stats(v, G), ts, kIsBf16<T>);
    for (int64_t i = threadIdx.x; i < G; i += blockDim.x) cuda::st(out + g * G + i, value_for(q, p, cuda::ld(v + i)));
  }
}

template <typename T>
__global__ void amax_kernel(float* amax, const T* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    m = fmaxf(m, fabsf(cuda::ld(x + i)));
  m = cuda::warp_max(m);
  if (threadIdx.x % 32 == 0) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(m));  // m ≥ 0: int order
}

// ---- backward ----
template <typename D>
__device__ void put(D* dx, int64_t i, float v, bool accumulate) {
  cuda::st(dx + i, accumulate ? cuda::ld(dx + i) + v : v);
}

template <typename D, typename G>
__global__ void straight_kernel(D* dx, const G* g, int64_t n, bool accumulate) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    put(dx, i, cuda::ld(g + i), accumulate);
}

// Int4Weight's per-group sums for its extremes' terms (kernels/cpu/fake_quant.cpp derives them).
struct Int4Sums {
  float d_scale, through, total, n_lo, n_hi;
};
__device__ void add(Int4Sums& a, const Int4Sums& b) {
  a.d_scale += b.d_scale, a.through += b.through, a.total += b.total, a.n_lo += b.n_lo, a.n_hi += b.n_hi;
}
template <typename X, typename G>
__device__ Int4Sums int4_term(const X* v, const G* g, int64_t i, const fq::Int4Params& p, const Stats& s) {
  const float x = cuda::ld(v + i), gi = cuda::ld(g + i);
  const bool pass = fq::int4_passes(x, p);
  const float own = pass ? fq::div_rn(quant::mul_rn(gi, p.scale), p.scale) : 0.0f;
  return {gi * fq::int4_code(x, p) - (pass ? gi * fq::int4_ratio(x, p) : 0.0f), own, gi, float(x == s.lo),
          float(x == s.hi)};
}
template <typename X, typename G>
__device__ float int4_grad(const X* v, const G* g, int64_t i, const fq::Int4Params& p, const Stats& s,
                           const Int4Sums& t) {
  const float x = cuda::ld(v + i), gi = cuda::ld(g + i);
  float d = fq::int4_passes(x, p) ? fq::div_rn(quant::mul_rn(gi, p.scale), p.scale) : 0.0f;
  const float span = p.span_clamped ? 0.0f : t.d_scale / 15.0f;
  if (x == s.lo) d += (t.total - t.through - span) / t.n_lo;
  if (x == s.hi) d += span / t.n_hi;
  return d;
}
template <typename X, typename G>
__device__ float int8_grad(const X* v, const G* g, int64_t i, const fq::Int8Params& p) {
  return fq::int8_passes(cuda::ld(v + i), p) ? cuda::ld(g + i) : 0.0f;
}

template <typename D, typename G, typename X>
__global__ void backward_thread_kernel(D* dx, const G* g, const X* x, int64_t groups, int64_t n, FakeQuant q,
                                       bool accumulate) {
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < groups; k += int64_t(gridDim.x) * blockDim.x) {
    const X* v = x + k * n;
    const G* gv = g + k * n;
    const Stats s = thread_stats(v, n);
    if (q.kind == FakeQuantKind::Int8Token) {
      const fq::Int8Params p = fq::int8_params(s.lo, s.hi, kIsBf16<X>);
      for (int64_t i = 0; i < n; ++i) put(dx, k * n + i, int8_grad(v, gv, i, p), accumulate);
      continue;
    }
    const fq::Int4Params p = fq::int4_params(s.lo, s.hi);
    Int4Sums t{0, 0, 0, 0, 0};
    for (int64_t i = 0; i < n; ++i) add(t, int4_term(v, gv, i, p, s));
    for (int64_t i = 0; i < n; ++i) put(dx, k * n + i, int4_grad(v, gv, i, p, s, t), accumulate);
  }
}

template <typename D, typename G, typename X>
__global__ void backward_block_kernel(D* dx, const G* g, const X* x, int64_t groups, int64_t n, FakeQuant q,
                                      bool accumulate) {
  __shared__ Int4Sums part[kThreads / 32];
  for (int64_t k = blockIdx.x; k < groups; k += gridDim.x) {
    const X* v = x + k * n;
    const G* gv = g + k * n;
    const Stats s = block_stats(v, n);
    if (q.kind == FakeQuantKind::Int8Token) {
      const fq::Int8Params p = fq::int8_params(s.lo, s.hi, kIsBf16<X>);
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) put(dx, k * n + i, int8_grad(v, gv, i, p), accumulate);
      continue;
    }
    const fq::Int4Params p = fq::int4_params(s.lo, s.hi);
    Int4Sums t{0, 0, 0, 0, 0};
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) add(t, int4_term(v, gv, i, p, s));
    t = {cuda::warp_sum(t.d_scale), cuda::warp_sum(t.through), cuda::warp_sum(t.total), cuda::warp_sum(t.n_lo),
         cuda::warp_sum(t.n_hi)};
    __syncthreads();
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = t;
    __syncthreads();
    Int4Sums all = part[0];
    for (int w = 1; w < int(blockDim.x / 32); ++w) add(all, part[w]);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      put(dx, k * n + i, int4_grad(v, gv, i, p, s, all), accumulate);
  }
}

bool f32_or_bf16(DType d) {
  return d == DType::F32 || d == DType::BF16;
}

}  // namespace

void CudaOps::fake_quantize(Tensor out, const Tensor& x, const FakeQuant& q, Tensor amax) {
  const auto prof = profile("fake_quantize");
  SOLTRAIN_CHECK(out.dtype == x.dtype && f32_or_bf16(x.dtype) && out.numel() == x.numel() && x.rank() == 2 &&
                     out.data != x.data && q.on(),
                 "fake_quantize");
  const int64_t C = x.dim(1), G = q.group_of(C), n = x.numel(), groups = n / std::max<int64_t>(G, 1);
  SOLTRAIN_CHECK(G > 0 && C % G == 0, "fake_quantize: a row of ", C, " is not whole groups of ", G);
  float* am = nullptr;
  if (q.kind == FakeQuantKind::Nvfp4) {
    am = amax.defined() ? amax.f32() : static_cast<float*>(scratch(sizeof(float)));
    CUDA_CHECK(cudaMemsetAsync(am, 0, sizeof(float), stream_));
    if (x.dtype == DType::BF16)
      amax_kernel<<<cuda::blocks_for(n, kThreads, 2L * sm_count_), kThreads, 0, stream_>>>(am, x.as<bf16>(), n);
    else
      amax_kernel<<<cuda::blocks_for(n, kThreads, 2L * sm_count_), kThreads, 0, stream_>>>(am, x.f32(), n);
    CUDA_CHECK_LAUNCH();
  }
  const bool per_thread = G <= kThreadGroupMax;
  const unsigned blocks = per_thread ? cuda::blocks_for(groups, kThreads, 16L * sm_count_)
                                     : unsigned(std::min<int64_t>(groups, 16L * sm_count_));
  auto run = [&](auto* o, const auto* in) {
    if (per_thread)
      forward_thread_kernel<<<blocks, kThreads, 0, stream_>>>(o, in, groups, G, q, am);
    else
      forward_block_kernel<<<blocks, kThreads, 0, stream_>>>(o, in, groups, G, q, am);
  };
  if (x.dtype == DType::BF16)
    run(out.as<bf16>(), x.as<bf16>());
  else
    run(out.f32(), x.f32());
  CUDA_CHECK_LAUNCH();
}

void CudaOps::fake_quantize_backward(Tensor dx, bool accumulate, const Tensor& g, const Tensor& x, const FakeQuant& q) {
  const auto prof = profile("fake_quantize_backward");
  SOLTRAIN_CHECK(f32_or_bf16(dx.dtype) && f32_or_bf16(g.dtype) && f32_or_bf16(x.dtype) && x.rank() == 2 &&
                     g.numel() == x.numel() && dx.numel() == x.numel() && (dx.data != g.data || !accumulate),
                 "fake_quantize_backward");
  const int64_t C = x.dim(1), G = q.group_of(C), n = x.numel(), groups = n / std::max<int64_t>(G, 1);
  auto with = [&](auto* d, const auto* gv) {
    if (q.kind == FakeQuantKind::Mxfp4 || q.kind == FakeQuantKind::Nvfp4) {
      straight_kernel<<<cuda::blocks_for(n, kThreads, 8L * sm_count_), kThreads, 0, stream_>>>(d, gv, n, accumulate);
      return;
    }
    auto launch = [&](const auto* xv) {
      if (G <= kThreadGroupMax)
        backward_thread_kernel<<<cuda::blocks_for(groups, kThreads, 16L * sm_count_), kThreads, 0, stream_>>>(
            d, gv, xv, groups, G, q, accumulate);
      else
        backward_block_kernel<<<unsigned(std::min<int64_t>(groups, 16L * sm_count_)), kThreads, 0, stream_>>>(
            d, gv, xv, groups, G, q, accumulate);
    };
    if (x.dtype == DType::BF16)
      launch(x.as<bf16>());
    else
      launch(x.f32());
  };
  auto with_d = [&](const auto* gv) {
    if (dx.dtype == DType::BF16)
      with(dx.as<bf16>(), gv);
    else
      with(dx.f32(), gv);
  };
  if (g.dtype == DType::BF16)
    with_d(g.as<bf16>());
  else
    with_d(g.f32());
  CUDA_CHECK_LAUNCH();
}

}  // namespace soltrain
