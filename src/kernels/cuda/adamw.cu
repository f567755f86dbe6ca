// CUDA: torch's AdamW update on fp32 masters, writing the bf16 compute copy in the same pass.
#include <algorithm>
#include <cmath>

#include "kernels/blockwise4.h"
#include "kernels/blockwise8.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/stochastic_round.h"

namespace soltrain {

using cuda::bf16;

namespace {
// One AdamW update's constants as the kernels take them, and torch's arithmetic for one element, in one place
// so that every kernel (fp32 moments, and both 8-bit paths, which must agree bit for bit) rounds the same way.
struct AdamWStep {
  float decay, b1c, beta2, b2c, step_size, bc2_sqrt, eps;  // 1 - lr·wd, 1 - β1, β2, 1 - β2, lr / (1 - β1^t), ...
  float grad_scale;
  const double* grad_sumsq;  // clipping's Σg² on the device, or null
  float max_grad_norm;
  uint64_t sr_seed;  // a BF16 master's stochastic rounding (kernels/stochastic_round.h)
  // Folds clipping's factor into grad_scale (the same double arithmetic as the host's clip_factor).
  __device__ void clip() {
    if (grad_sumsq) grad_scale *= clip_factor(*grad_sumsq, max_grad_norm);
  }
  // The new weight from w and g; m and v in, updated.
  __device__ float update(float w, float g, float& m, float& v) const {
    float wi = w * decay;
    const float gi = g * grad_scale;
    m = m + b1c * (gi - m);
    v = v * beta2 + b2c * gi * gi;
    wi -= step_size * (m / (sqrtf(v) / bc2_sqrt + eps));
    return wi;
  }
};

AdamWStep adamw_step(const AdamWParams& p) {
  const double bc1 = 1.0 - std::pow(p.beta1, p.step), bc2_sqrt = std::sqrt(1.0 - std::pow(p.beta2, p.step));
  return {float(1.0 - double(p.lr) * double(p.weight_decay)),
          float(1.0 - p.beta1),
          float(p.beta2),
          float(1.0 - p.beta2),
          float(double(p.lr) / bc1),
          float(bc2_sqrt),
          p.eps,
          p.grad_scale,
          p.grad_sumsq ? static_cast<const double*>(p.grad_sumsq->data) : nullptr,
          p.max_grad_norm,
          p.sr_seed};
}

// A master element as fp32, and the updated value stored back (what was stored returned): an fp32 master as
// is, a BF16 one (bf16_stochastic_round: the compute copy itself) rounded stochastically.
__device__ inline float load_master(const float* w, int64_t i) {
  return w[i];
}
__device__ inline float load_master(const bf16* w, int64_t i) {
  return __bfloat162float(w[i]);
}
__device__ inline float store_master(float* w, int64_t i, float x, uint64_t) {
  w[i] = x;
  return x;
}
__device__ inline float store_master(bf16* w, int64_t i, float x, uint64_t seed) {
  const bf16 b = __ushort_as_bfloat16(bf16_round_stochastic(x, stochastic_bits(seed, uint64_t(i))));
  w[i] = b;
  return __bfloat162float(b);
}

template <typename W>
__global__ void adamw_kernel(W* w, const float* g, float* m, float* v, bf16* copy, int64_t n, AdamWStep s) {
  s.clip();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float mi = m[i], vi = v[i];
    const float wi = store_master(w, i, s.update(load_master(w, i), g[i], mi, vi), s.sr_seed);
    m[i] = mi;
    v[i] = vi;
    if (copy) copy[i] = cuda::to_bf(wi);
  }
}

// bitsandbytes' 8-bit blockwise AdamW: one warp per quantisation block of 256 elements (8 per lane, lane +
// 32·k so each load is coalesced), many blocks per CTA. Each lane dequantises its elements' m and v, applies
// the update above, and the warp's max |m| and |v| (shuffles, no block barrier) give the absmax the new codes
// are quantised against (nearest map entry: binary search over the midpoints). The maps and their midpoints
// are staged in shared memory once per CTA, not once per 256 elements: one block per quantisation block spent
// most of its time there and in two barriers (69 ms for Qwen3-4B where fp32 AdamW takes 33; 58 with the
// warps, the binary searches then dominating: see quantize_bucketed).
constexpr int kWarpsPer8bitCta = 8;
// The two moments' maps, their midpoints and quantize_bucketed's tables, built once per pair of maps
// (build_quant_tables, CudaOps::quant_tables) and copied into shared memory by each CTA. Building them in every
// CTA (3,460 bucket searches and three barriers) cost more than the update itself where a parameter is small:
// the A3B's 18,432 expert matrices of 6,144 blocks each are one launch apiece, a warp then updating one block.
struct alignas(16) QuantTables {
  float map[2][256], mid[2][255];
  uint8_t below[2][2][kQuantBuckets];  // [moment][x < 0][bucket]: see quantize_bucketed
  // Copies the built tables in (16 bytes a thread per pass).
  __device__ void stage(const QuantTables* built) {
    static_assert(sizeof(QuantTables) % 16 == 0, "copied as int4");
    const int4* from = reinterpret_cast<const int4*>(built);
    int4* to = reinterpret_cast<int4*>(this);
    for (int i = threadIdx.x; i < int(sizeof(QuantTables) / 16); i += blockDim.x) to[i] = from[i];
    __syncthreads();
  }
  __device__ void build(const float* mmap, const float* vmap) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
      map[0][i] = mmap[i];
      map[1][i] = vmap[i];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 255; i += blockDim.x) {
      mid[0][i] = (map[0][i] + map[0][i + 1]) / 2;  // as torch: (code[:-1] + code[1:]) / 2
      mid[1][i] = (map[1][i] + map[1][i + 1]) / 2;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 2 * kQuantBuckets; i += blockDim.x)
      fill_quant_bucket(below[i / kQuantBuckets], i % kQuantBuckets, mid[i / kQuantBuckets]);
    __syncthreads();
  }
  // Moment k's code for x, its block's absmax reciprocal inv: the nearest map entry of x·inv clamped to [-1, 1].
  __device__ uint8_t quantize(int k, float x, float inv) const {
    return quantize_bucketed(fminf(fmaxf(x * inv, -1.0f), 1.0f), mid[k], below[k]);
  }
};

template <typename W>
__global__ void __launch_bounds__(32 * kWarpsPer8bitCta)
    adamw_8bit_kernel(W* w, const float* g, uint8_t* mc, uint8_t* vc, float* ma, float* va, const QuantTables* tables,
                      bf16* copy, int64_t n, AdamWStep s) {
  __shared__ QuantTables t;
  t.stage(tables);
  s.clip();
  const int lane = int(threadIdx.x % 32);
  const int64_t blocks = (n + 255) / 256;
  for (int64_t blk = int64_t(blockIdx.x) * kWarpsPer8bitCta + threadIdx.x / 32; blk < blocks;
       blk += int64_t(gridDim.x) * kWarpsPer8bitCta) {
    const float mscale = ma[blk], vscale = va[blk];
    // Every load of the block first, then the arithmetic and the stores: loads interleaved with stores to
    // w (which the compiler must assume may alias them) would make eight round trips to memory in a row.
    float wv[8], gv[8], mi[8], vi[8], am = 0.f, av = 0.f;
    uint8_t mq[8], vq[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int64_t i = blk * 256 + k * 32 + lane;
      if (i < n) wv[k] = load_master(w, i), gv[k] = g[i], mq[k] = mc[i], vq[k] = vc[i];
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int64_t i = blk * 256 + k * 32 + lane;
      mi[k] = vi[k] = 0.f;
      if (i < n) {
        mi[k] = t.map[0][mq[k]] * mscale;
        vi[k] = t.map[1][vq[k]] * vscale;
        const float wi = store_master(w, i, s.update(wv[k], gv[k], mi[k], vi[k]), s.sr_seed);
        if (copy) copy[i] = cuda::to_bf(wi);
      }
      am = fmaxf(am, fabsf(mi[k]));
      av = fmaxf(av, fabsf(vi[k]));
    }
    am = cuda::warp_max(am);
    av = cuda::warp_max(av);
    const float minv = 1.0f / fmaxf(am, 1e-38f), vinv = 1.0f / fmaxf(av, 1e-38f);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int64_t i = blk * 256 + k * 32 + lane;
      if (i < n) {
        mc[i] = t.quantize(0, mi[k], minv);
        vc[i] = t.quantize(1, vi[k], vinv);
      }
    }
    if (lane == 0) {
      ma[blk] = am;
      va[blk] = av;
    }
  }
}

// The same update for whole quantisation blocks with 16-byte accesses: lane l holds elements 4l..4l+3 and
// 128+4l..128+4l+3 of its block, so a warp moves w and g as two float4 per lane, each moment's codes as two
// 32-bit words and the bf16 copy as two 8-byte stores: 8 loads and 8-10 stores per lane where the kernel
// above issues 32 and 32 (byte-wide code accesses use a quarter of a load instruction's width). Which lane
// holds which element of a block does not change the result: the absmax is over the whole block.
// Four consecutive master elements at i (16-byte aligned for fp32, 8-byte for bf16) as fp32, and stored back
// (what was stored returned in x: a bf16 master's stochastically rounded values).
__device__ inline float4 load_master4(const float* w, int64_t i) {
  return *reinterpret_cast<const float4*>(w + i);
}
__device__ inline float4 load_master4(const bf16* w, int64_t i) {
  const uint2 u = *reinterpret_cast<const uint2*>(w + i);
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x)),
               hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}
__device__ inline void store_master4(float* w, int64_t i, float4& x, uint64_t) {
  *reinterpret_cast<float4*>(w + i) = x;
}
__device__ inline void store_master4(bf16* w, int64_t i, float4& x, uint64_t seed) {
  float* f = &x.x;
  uint16_t b[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    b[j] = bf16_round_stochastic(f[j], stochastic_bits(seed, uint64_t(i + j)));
    f[j] = __bfloat162float(__ushort_as_bfloat16(b[j]));
  }
  uint2 u;
  u.x = uint32_t(b[0]) | uint32_t(b[1]) << 16;
  u.y = uint32_t(b[2]) | uint32_t(b[3]) << 16;
  *reinterpret_cast<uint2*>(w + i) = u;
}

template <typename W>
__global__ void __launch_bounds__(32 * kWarpsPer8bitCta)
    adamw_8bit_vec_kernel(W* w, const float* g, uint8_t* mc, uint8_t* vc, float* ma, float* va,
                          const QuantTables* tables, bf16* copy, int64_t blocks, AdamWStep s) {
  __shared__ QuantTables t;
  t.stage(tables);
  s.clip();
  const int lane = int(threadIdx.x % 32);
  for (int64_t blk = int64_t(blockIdx.x) * kWarpsPer8bitCta + threadIdx.x / 32; blk < blocks;
       blk += int64_t(gridDim.x) * kWarpsPer8bitCta) {
    const float mscale = ma[blk], vscale = va[blk];
    float wv[8], gv[8], mi[8], vi[8], am = 0.f, av = 0.f;
    uint32_t mq[2], vq[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // every load first (see the scalar kernel)
      const int64_t i = blk * 256 + h * 128 + lane * 4;
      const float4 a = load_master4(w, i), b = *reinterpret_cast<const float4*>(g + i);
      wv[4 * h] = a.x, wv[4 * h + 1] = a.y, wv[4 * h + 2] = a.z, wv[4 * h + 3] = a.w;
      gv[4 * h] = b.x, gv[4 * h + 1] = b.y, gv[4 * h + 2] = b.z, gv[4 * h + 3] = b.w;
      mq[h] = *reinterpret_cast<const uint32_t*>(mc + i);
      vq[h] = *reinterpret_cast<const uint32_t*>(vc + i);
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int shift = 8 * (k % 4);
      mi[k] = t.map[0][(mq[k / 4] >> shift) & 255u] * mscale;
      vi[k] = t.map[1][(vq[k / 4] >> shift) & 255u] * vscale;
      wv[k] = s.update(wv[k], gv[k], mi[k], vi[k]);
      am = fmaxf(am, fabsf(mi[k]));
      av = fmaxf(av, fabsf(vi[k]));
    }
    am = cuda::warp_max(am);
    av = cuda::warp_max(av);
    const float minv = 1.0f / fmaxf(am, 1e-38f), vinv = 1.0f / fmaxf(av, 1e-38f);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t i = blk * 256 + h * 128 + lane * 4;
      float4 stored = make_float4(wv[4 * h], wv[4 * h + 1], wv[4 * h + 2], wv[4 * h + 3]);
      store_master4(w, i, stored, s.sr_seed);
      if (copy) {
        __nv_bfloat162 lo = __floats2bfloat162_rn(stored.x, stored.y), hi = __floats2bfloat162_rn(stored.z, stored.w);
        uint2 packed;
        packed.x = *reinterpret_cast<uint32_t*>(&lo);
        packed.y = *reinterpret_cast<uint32_t*>(&hi);
        *reinterpret_cast<uint2*>(copy + i) = packed;
      }
      uint32_t mo = 0, vo = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int k = 4 * h + j;
        mo |= uint32_t(t.quantize(0, mi[k], minv)) << (8 * j);
        vo |= uint32_t(t.quantize(1, vi[k], vinv)) << (8 * j);
      }
      *reinterpret_cast<uint32_t*>(mc + i) = mo;
      *reinterpret_cast<uint32_t*>(vc + i) = vo;
    }
    if (lane == 0) {
      ma[blk] = am;
      va[blk] = av;
    }
  }
}

// One CTA builds the tables for a pair of maps into `out` (global memory).
__global__ void build_quant_tables(const float* mmap, const float* vmap, QuantTables* out) {
  __shared__ QuantTables t;
  t.build(mmap, vmap);
  const int4* from = reinterpret_cast<const int4*>(&t);
  int4* to = reinterpret_cast<int4*>(out);
  for (int i = threadIdx.x; i < int(sizeof(QuantTables) / 16); i += blockDim.x) to[i] = from[i];
}

bool aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}
}  // namespace

const void* CudaOps::quant_tables(const Tensor& mmap, const Tensor& vmap) {
  // (built again only when another optimizer's maps come: the maps of one run are two buffers for every parameter)
  if (quant_tables_.bytes() == 0 || quant_maps_[0] != mmap.data || quant_maps_[1] != vmap.data) {
    if (quant_tables_.bytes() == 0) quant_tables_ = alloc(sizeof(QuantTables));
    build_quant_tables<<<1, 256, 0, stream_>>>(mmap.f32(), vmap.f32(), static_cast<QuantTables*>(quant_tables_.data()));
    CUDA_CHECK_LAUNCH();
    quant_maps_[0] = mmap.data, quant_maps_[1] = vmap.data;
  }
  return quant_tables_.data();
}

void CudaOps::adamw(Tensor master, const Tensor& grad, Tensor m, Tensor v, const AdamWParams& p, Tensor* compute_copy) {
  const auto prof = profile("adamw");
  const int64_t n = master.numel();
  if (master.dtype == DType::BF16) {  // bf16_stochastic_round: the master is the compute copy
    SOLTRAIN_CHECK(!compute_copy || compute_copy->data == master.data, "adamw: a bf16 master is its own copy");
    adamw_kernel<<<cuda::blocks_for(n, 256, 8 * 1024), 256, 0, stream_>>>(master.as<bf16>(), grad.f32(), m.f32(),
                                                                          v.f32(), nullptr, n, adamw_step(p));
    CUDA_CHECK_LAUNCH();
    return;
  }
  adamw_kernel<<<cuda::blocks_for(n, 256, 8 * 1024), 256, 0, stream_>>>(
      master.f32(), grad.f32(), m.f32(), v.f32(), compute_copy ? compute_copy->as<bf16>() : nullptr, n, adamw_step(p));
  CUDA_CHECK_LAUNCH();
}

void CudaOps::adamw_8bit(Tensor master, const Tensor& grad, const Blockwise8& m, const Blockwise8& v,
                         const AdamWParams& p, Tensor* compute_copy) {
  const auto prof = profile("adamw_8bit");
  const AdamWStep step = adamw_step(p);
  const int64_t n = master.numel();
  static_assert(kBlockwise8Block == 256, "one warp per quantisation block, 8 elements per lane");
  float *ma = m.absmax.f32(), *va = v.absmax.f32();
  const float* g = grad.f32();
  uint8_t *mc = m.code.as<uint8_t>(), *vc = v.code.as<uint8_t>();
  const auto* tables = static_cast<const QuantTables*>(quant_tables(m.map, v.map));
  // Enough CTAs to fill the GPU several times over; each warp then walks the blocks grid-stride.
  auto ctas = [](int64_t blocks) {
    return unsigned(std::min<int64_t>((blocks + kWarpsPer8bitCta - 1) / kWarpsPer8bitCta, 132 * 8));
  };
  // Whole blocks take the 16-byte path when every pointer allows it (parameters sit at any offset of the
  // store); a partial last block, or unaligned storage, the element-wise kernel (the same arithmetic). A bf16
  // master (bf16_stochastic_round) is its own compute copy and is rounded stochastically by element index, so
  // both kernels store the same bits.
  auto run = [&](auto* w, bf16* copy) {
    int64_t whole = 0;
    if (aligned(w, 4 * sizeof(*w)) && aligned(g, 16) && aligned(mc, 4) && aligned(vc, 4) &&
        (!copy || aligned(copy, 8))) {
      whole = n / kBlockwise8Block;
      if (whole > 0) {
        adamw_8bit_vec_kernel<<<ctas(whole), 32 * kWarpsPer8bitCta, 0, stream_>>>(w, g, mc, vc, ma, va, tables, copy,
                                                                                  whole, step);
        CUDA_CHECK_LAUNCH();
      }
    }
    const int64_t done = whole * kBlockwise8Block, rest = n - done;
    if (rest == 0) return;
    // (the element-wise kernel's element i is w[done + i]: its stochastic rounding draws from there on)
    AdamWStep tail = step;
    tail.sr_seed = stochastic_seed_at(step.sr_seed, uint64_t(done));
    adamw_8bit_kernel<<<ctas((rest + kBlockwise8Block - 1) / kBlockwise8Block), 32 * kWarpsPer8bitCta, 0, stream_>>>(
        w + done, g + done, mc + done, vc + done, ma + whole, va + whole, tables, copy ? copy + done : nullptr, rest,
        tail);
    CUDA_CHECK_LAUNCH();
  };
  if (master.dtype == DType::BF16) {
    SOLTRAIN_CHECK(!compute_copy || compute_copy->data == master.data, "adamw_8bit: a bf16 master is its own copy");
    run(master.as<bf16>(), nullptr);
  } else {
    run(master.f32(), compute_copy ? compute_copy->as<bf16>() : nullptr);
  }
}

namespace {
// torchao's AdamW4bit: one warp per block of 128, four consecutive elements (two code bytes) per lane; the maps in
// shared memory; the same update and quantisation as the CPU's (kernels/blockwise4.h).
__global__ void __launch_bounds__(32 * kWarpsPer8bitCta)
    adamw_4bit_kernel(float* w, const float* g, uint8_t* mc, uint8_t* vc, float* ms, float* vs, const float* mmap,
                      const float* vmap, bf16* copy, int64_t blocks, AdamWStep s) {
  __shared__ float map[2][16];
  if (threadIdx.x < 16) {
    map[0][threadIdx.x] = mmap[threadIdx.x];
    map[1][threadIdx.x] = vmap[threadIdx.x];
  }
  __syncthreads();
  s.clip();
  const int lane = int(threadIdx.x % 32);
  for (int64_t blk = int64_t(blockIdx.x) * kWarpsPer8bitCta + threadIdx.x / 32; blk < blocks;
       blk += int64_t(gridDim.x) * kWarpsPer8bitCta) {
    const int64_t i0 = blk * kBlockwise4Block + lane * 4, b0 = i0 / 2;
    const float mscale = ms[blk], vscale = vs[blk];
    float mi[4], vi[4], am = 0.f, av = 0.f;
    for (int j = 0; j < 4; ++j) {
      const uint8_t mb = mc[b0 + j / 2], vb = vc[b0 + j / 2];
      mi[j] = map[0][j % 2 ? mb & 15 : mb >> 4] * mscale;
      vi[j] = map[1][j % 2 ? vb & 15 : vb >> 4] * vscale;
      const float wi = s.update(w[i0 + j], g[i0 + j], mi[j], vi[j]);
      w[i0 + j] = wi;
      if (copy) copy[i0 + j] = cuda::to_bf(wi);
      am = fmaxf(am, fabsf(mi[j]));
      av = fmaxf(av, fabsf(vi[j]));
    }
    am = fmaxf(cuda::warp_max(am), 1e-12f);
    av = fmaxf(cuda::warp_max(av), 1e-12f);
    __syncwarp();
    if (lane == 0) {
      ms[blk] = am;
      vs[blk] = av;
    }
    for (int j = 0; j < 4; j += 2) {
      mc[b0 + j / 2] = uint8_t(quantize4(mi[j] / am, map[0]) << 4 | quantize4(mi[j + 1] / am, map[0]));
      vc[b0 + j / 2] = uint8_t(quantize4(vi[j] / av, map[1]) << 4 | quantize4(vi[j + 1] / av, map[1]));
    }
  }
}
}  // namespace

void CudaOps::adamw_4bit(Tensor master, const Tensor& grad, const Blockwise8& m, const Blockwise8& v,
                         const AdamWParams& p, Tensor* compute_copy) {
  const auto prof = profile("adamw_4bit");
  const int64_t n = master.numel(), blocks = n / kBlockwise4Block;
  SOLTRAIN_CHECK(n % kBlockwise4Block == 0 && m.code.numel() == n / 2, "adamw_4bit: a parameter of whole blocks");
  static_assert(kBlockwise4Block == 128, "one warp per quantisation block, 4 elements per lane");
  const unsigned ctas = unsigned(std::min<int64_t>((blocks + kWarpsPer8bitCta - 1) / kWarpsPer8bitCta, 132 * 8));
  adamw_4bit_kernel<<<std::max(ctas, 1u), 32 * kWarpsPer8bitCta, 0, stream_>>>(
      master.f32(), grad.f32(), m.code.as<uint8_t>(), v.code.as<uint8_t>(), m.absmax.f32(), v.absmax.f32(), m.map.f32(),
      v.map.f32(), compute_copy ? compute_copy->as<bf16>() : nullptr, blocks, adamw_step(p));
  CUDA_CHECK_LAUNCH();
}

}  // namespace soltrain
