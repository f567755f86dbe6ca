// CUDA: the fp8-hybrid recipe's quantisers and its delayed-scaling update (the FP8 GEMM is in linear.cu,
// next to the bf16 one). Codes are bitwise the CPU twin's (kernels/quant.h; see encode8). A quantiser
// reads bf16 once: each thread codes 8 values (one 16-byte load, one 8-byte store); the transposing form
// codes a 64×64 tile into shared memory and writes it back both ways, so a tensor needed in both layouts
// (a weight; the gradient of a trained weight's output) costs one read. max|x| is reduced per warp and
// max-ed into the history slot with one atomic per warp (non-negative floats order as their bits do).
#include <cuda_fp8.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/quant.h"

namespace soltrain {

using cuda::bf16;

namespace {
constexpr int kThreads = 256, kTile = 64;

// Eight values scaled and coded. From sm_89 the hardware converts two floats per instruction (cvt.rn.satfinite:
// round to nearest even, saturating to the largest finite code: quant.h's saturating rule, which took ~30
// integer instructions a value and made the casts compute-bound at half the memory bandwidth); below it,
// quant.h's arithmetic (the recipe refuses those GPUs, but the code builds for them).
template <bool kE5m2>
__device__ __forceinline__ void encode8(uint8_t (&code)[8], const cuda::Vec8& v, float s) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  for (int k = 0; k < 8; k += 2) {
    const __nv_fp8x2_storage_t pair = __nv_cvt_float2_to_fp8x2(
        make_float2(__fmul_rn(v[k], s), __fmul_rn(v[k + 1], s)), __NV_SATFINITE, kE5m2 ? __NV_E5M2 : __NV_E4M3);
    code[k] = uint8_t(pair & 0xff);  // .x is the low byte
    code[k + 1] = uint8_t(pair >> 8);
  }
#else
  for (int k = 0; k < 8; ++k) code[k] = quant::fp8_encode(v[k], s, kE5m2);
#endif
}

__device__ __forceinline__ void atomic_max_nonneg(float* p, float v) {
  atomicMax(reinterpret_cast<int*>(p), __float_as_int(v));
}
// The block's max|x| into *p with one atomic per block: one per warp had every warp of a tensor contend for
// one address (65k atomics for a 4096×4096 tensor), which cost as much as the cast itself.
__device__ __forceinline__ void block_max_into(float* p, float v) {
  __shared__ float warp_m[32];
  v = cuda::warp_max(v);
  if ((threadIdx.x & 31) == 0) warp_m[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0 && p) {
    float m = 0.0f;
    for (int w = 0; w < int(blockDim.x / 32); ++w) m = fmaxf(m, warp_m[w]);
    if (m > 0.0f) atomic_max_nonneg(p, m);
  }
}

__global__ void amax_kernel(float* out, const bf16* x, int64_t groups) {
  float m = 0.0f;
  for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += int64_t(gridDim.x) * blockDim.x) {
    const cuda::Vec8 v = cuda::load8(x + g * 8);
    for (int k = 0; k < 8; ++k) m = fmaxf(m, fabsf(v[k]));
  }
  block_max_into(out, m);
}

// The scale this launch codes with: delayed: the stored one; current: from this tensor's amax (block 0 also
// stores it, and max-es that amax into the history slot).
__device__ __forceinline__ float launch_scale(float* scale, const float* current_amax, float fp8_max, float* record) {
  if (!current_amax) return scale[1];
  const float s = quant::fp8_scale_from_amax(*current_amax, fp8_max);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
    scale[1] = s;
    scale[0] = quant::reciprocal_rn(s);
    if (record && *current_amax > 0.0f) atomic_max_nonneg(record, *current_amax);
  }
  return s;
}

template <bool kE5m2>
__global__ void quantize_kernel(uint8_t* out, const bf16* x, int64_t groups, float* scale, const float* current_amax,
                                float fp8_max, float* record) {
  const float s = launch_scale(scale, current_amax, fp8_max, record);
  float m = 0.0f;
  for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += int64_t(gridDim.x) * blockDim.x) {
    const cuda::Vec8 v = cuda::load8(x + g * 8);
    uint8_t c[8];
    for (int k = 0; k < 8; ++k) m = fmaxf(m, fabsf(v[k]));
    encode8<kE5m2>(c, v, s);
    *reinterpret_cast<uint2*>(out + g * 8) = *reinterpret_cast<const uint2*>(c);
  }
  block_max_into(current_amax ? nullptr : record, m);
}

// One 64×64 tile per block: rows r0.., cols c0.. of x [R, C] (R, C multiples of 8). out (row-major, optional)
// and out_t [C, R] (optional) each get the tile's codes. Rows of the shared tile are padded to 68 bytes so the
// column reads of the transposed write spread over banks; each thread writes 16 rows of one column as one
// 16-byte store (four threads cover a 64-byte run of an out_t row).
template <bool kE5m2>
__global__ void quantize_transpose_kernel(uint8_t* out, uint8_t* out_t, const bf16* x, int64_t R, int64_t C,
                                          float* scale, const float* current_amax, float fp8_max, float* record) {
  __shared__ __align__(16) uint8_t tile[kTile][kTile + 4];
  const float s = launch_scale(scale, current_amax, fp8_max, record);
  const int64_t r0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
  float m = 0.0f;
  // 64 rows × 8 groups of 8 columns = 512 groups, two per thread.
  for (int i = threadIdx.x; i < kTile * (kTile / 8); i += blockDim.x) {
    const int tr = i / (kTile / 8), tc = (i % (kTile / 8)) * 8;
    const int64_t r = r0 + tr, c = c0 + tc;
    if (r >= R || c >= C) continue;
    const cuda::Vec8 v = cuda::load8(x + r * C + c);
    uint8_t code[8];
    for (int k = 0; k < 8; ++k) m = fmaxf(m, fabsf(v[k]));
    encode8<kE5m2>(code, v, s);
    *reinterpret_cast<uint32_t*>(&tile[tr][tc]) = *reinterpret_cast<const uint32_t*>(code);
    *reinterpret_cast<uint32_t*>(&tile[tr][tc + 4]) = *reinterpret_cast<const uint32_t*>(code + 4);
    if (out) *reinterpret_cast<uint2*>(out + r * C + c) = *reinterpret_cast<const uint2*>(code);
  }
  block_max_into(current_amax ? nullptr : record, m);  // its __syncthreads also orders the tile
  if (!out_t) return;
  // out_t row c (a tile column): thread i writes rows 16·(i % 4) .. +15 of column i / 4.
  const int tc = threadIdx.x / 4, tr = (threadIdx.x % 4) * 16;
  const int64_t c = c0 + tc, r = r0 + tr;
  if (threadIdx.x >= kTile * 4 || c >= C || r >= R) return;
  uint8_t code[16];
  for (int k = 0; k < 16; ++k) code[k] = tile[tr + k][tc];
  if (r + 16 <= R && R % 16 == 0) {  // 16-byte aligned
    *reinterpret_cast<uint4*>(out_t + c * R + r) = *reinterpret_cast<const uint4*>(code);
  } else {
    for (int k = 0; k < 16 && r + k < R; ++k) out_t[c * R + r + k] = code[k];
  }
}

// One block per tensor: the window's max, the roll, the new scale (see Ops::fp8_update_scales).
__global__ void update_scales_kernel(float* history, float* scales, int H, float scaled_max) {
  extern __shared__ float window[];
  float* h = history + int64_t(blockIdx.x) * H;
  float m = 0.0f;
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    window[i] = h[i];
    m = fmaxf(m, window[i]);
  }
  __shared__ float warp_m[kThreads / 32];
  m = cuda::warp_max(m);
  if ((threadIdx.x & 31) == 0) warp_m[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    float amax = 0.0f;
    for (int w = 0; w < int(blockDim.x / 32); ++w) amax = fmaxf(amax, warp_m[w]);
    if (amax > 0.0f && amax <= 3.4028234663852886e38f) {
      const float s = quant::fp8_scale_from_amax(amax, scaled_max);
      scales[4 * blockIdx.x + 1] = s;
      scales[4 * blockIdx.x] = quant::reciprocal_rn(s);
    }
  }
  for (int i = threadIdx.x; i < H; i += blockDim.x) h[i] = i == 0 ? 0.0f : (i == H - 1 ? window[0] : window[i + 1]);
}

float max_of(DType t) {
  return t == DType::F8E5M2 ? quant::kE5m2Max : quant::kE4m3Max;
}
}  // namespace

void CudaOps::fp8_quantize(Tensor out, Tensor out_t, const Tensor& x, const Fp8Scaling& s) {
  const auto prof = profile(out_t.defined() ? "fp8_quantize_transpose" : "fp8_quantize");
  const Tensor& any = out.defined() ? out : out_t;
  SOLTRAIN_CHECK(any.defined() && x.dtype == DType::BF16 && x.rank() == 2 && cuda::aligned16(x.data) &&
                     cuda::aligned16(s.scale.data),
                 "fp8_quantize");
  SOLTRAIN_CHECK(!out.defined() || !out_t.defined() || out.dtype == out_t.dtype, "fp8_quantize: one format");
  const int64_t R = x.dim(0), C = x.dim(1);
  SOLTRAIN_CHECK(R % 8 == 0 && C % 8 == 0, "fp8_quantize: rows and columns in multiples of 8, got ", R, "x", C);
  const bool e5 = any.dtype == DType::F8E5M2;
  SOLTRAIN_CHECK(e5 || any.dtype == DType::F8E4M3, "fp8_quantize: output dtype");
  float* record = s.amax.defined() ? s.amax.f32() : nullptr;
  const float* current = nullptr;
  if (s.current) {
    float* a = static_cast<float*>(scratch(sizeof(float)));
    CUDA_CHECK(cudaMemsetAsync(a, 0, sizeof(float), stream_));
    amax_kernel<<<cuda::blocks_for(R * C / 8, kThreads, 2L * sm_count_), kThreads, 0, stream_>>>(a, x.as<bf16>(),
                                                                                                  R * C / 8);
    CUDA_CHECK_LAUNCH();
    current = a;
  }
  const float fmax = max_of(any.dtype);
  auto* o = static_cast<uint8_t*>(out.data);
  if (!out_t.defined()) {
    const unsigned blocks = cuda::blocks_for(R * C / 8, kThreads, 8L * sm_count_);
    if (e5)
      quantize_kernel<true><<<blocks, kThreads, 0, stream_>>>(o, x.as<bf16>(), R * C / 8, s.scale.f32(), current, fmax,
                                                              record);
    else
      quantize_kernel<false><<<blocks, kThreads, 0, stream_>>>(o, x.as<bf16>(), R * C / 8, s.scale.f32(), current,
                                                               fmax, record);
  } else {
    const dim3 grid(unsigned((C + kTile - 1) / kTile), unsigned((R + kTile - 1) / kTile));
    SOLTRAIN_CHECK(grid.y < 65536, "fp8_quantize: too many rows");
    auto* ot = static_cast<uint8_t*>(out_t.data);
    if (e5)
      quantize_transpose_kernel<true>
          <<<grid, kThreads, 0, stream_>>>(o, ot, x.as<bf16>(), R, C, s.scale.f32(), current, fmax, record);
    else
      quantize_transpose_kernel<false>
          <<<grid, kThreads, 0, stream_>>>(o, ot, x.as<bf16>(), R, C, s.scale.f32(), current, fmax, record);
  }
  CUDA_CHECK_LAUNCH();
}

void CudaOps::fp8_update_scales(Tensor history, Tensor scales, float fp8_max, int margin) {
  const auto prof = profile("fp8_update_scales");
  const int64_t Q = history.dim(0), H = history.dim(1);
  SOLTRAIN_CHECK(scales.numel() == 4 * Q && H >= 1 && H * sizeof(float) <= 48 * 1024, "fp8_update_scales");
  if (Q == 0) return;
  update_scales_kernel<<<unsigned(Q), kThreads, size_t(H) * sizeof(float), stream_>>>(
      history.f32(), scales.f32(), int(H), std::ldexp(fp8_max, -margin));
  CUDA_CHECK_LAUNCH();
}

std::string CudaOps::fp8_unsupported() const {
  if (compute_capability_ >= 89) return "";
  return cat("FP8 GEMMs need an NVIDIA GPU of compute capability 8.9 or newer (Ada, Hopper, Blackwell); this one is ",
             compute_capability_ / 10, ".", compute_capability_ % 10);
}

}  // namespace soltrain
