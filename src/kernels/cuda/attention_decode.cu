// CUDA: attention of new query tokens against a bf16 KV cache (decoding and prefill), and the decode step's
// small ops (the new keys and values appended, the inputs advanced). Two forms of attention: per (query, KV head)
// for the usual head sizes (below), else per (query, head), whose warps take every kWarps-th key with an online
// fp32 softmax, then merge.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace soltrain {

using cuda::bf16;

namespace {
constexpr int kWarps = 8;

// The paged cache's addressing (kernels/ops.h): the pool row of sequence b's position p.
struct Paged {
  const int32_t* table;
  int blocks, bs;  // table entries per sequence, positions per block
  __device__ int64_t row(int b, int p) const { return int64_t(table[int64_t(b) * blocks + p / bs]) * bs + p % bs; }
};
constexpr int kMaxPerLane = 8;  // head_dim ≤ 32·8 = 256

// Lane `lane` owns elements c = lane + 32·i of the head. Keys are walked one per warp iteration: a decode
// query has at most a few thousand keys per block and this keeps every warp's loads coalesced.
__global__ void attention_decode_kernel(bf16* out, const bf16* q, const bf16* kc, const bf16* vc, const int32_t* lens,
                                        Paged paged, int Tq, int H, int Hkv, int hd, float scale) {
  const int row = blockIdx.x, h = blockIdx.y, b = row / Tq, t = row % Tq;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, kh = h / (H / Hkv);
  const int pos = lens[b] - Tq + t;  // attends to keys 0..pos
  float qv[kMaxPerLane], acc[kMaxPerLane];
  const bf16* qi = q + (int64_t(row) * H + h) * hd;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int c = lane + 32 * i;
    qv[i] = c < hd ? cuda::to_f(qi[c]) : 0.f;
    acc[i] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  const int64_t stride = int64_t(Hkv) * hd;
  const bf16* kb = kc + int64_t(kh) * hd;
  const bf16* vb = vc + int64_t(kh) * hd;
  for (int j = warp; j <= pos; j += kWarps) {
    const int64_t at = paged.row(b, j) * stride;
    const bf16* kj = kb + at;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int c = lane + 32 * i;
      if (c < hd) s += qv[i] * cuda::to_f(kj[c]);
    }
    s = cuda::warp_sum(s) * scale;
    const float m_new = fmaxf(m, s), corr = __expf(m - m_new), p = __expf(s - m_new);
    l = l * corr + p;
    const bf16* vj = vb + at;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int c = lane + 32 * i;
      if (c < hd) acc[i] = acc[i] * corr + p * cuda::to_f(vj[c]);
    }
    m = m_new;
  }
  // Merge the warps' partial softmaxes: out = Σ_w acc_w·e^(m_w−M) / Σ_w l_w·e^(m_w−M).
  __shared__ float sm[kWarps], sl[kWarps], sacc[kWarps][32 * kMaxPerLane];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) sacc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm[w]);
  float L = 0.f;
  for (int w = 0; w < kWarps; ++w) L += sm[w] == -INFINITY ? 0.f : sl[w] * __expf(sm[w] - M);
  bf16* o = out + (int64_t(row) * H + h) * hd;
  for (int c = threadIdx.x; c < hd; c += blockDim.x) {
    float v = 0.f;
    for (int w = 0; w < kWarps; ++w)
      if (sm[w] != -INFINITY) v += sacc[w][c] * __expf(sm[w] - M);
    o[c] = cuda::to_bf(v / L);
  }
}
// The grouped form (head_dim 16, 32, 64, 128 or 256 with G = H / Hkv query heads per KV head, G ∈ {1, 2, 4, 8}): one
// block per (query, KV head) reads that head's keys and values once for its G query heads, L = head_dim / 8 lanes
// holding one key as 16-byte pieces (8 bf16 a lane), kThreads / L keys in flight per block and the next one's loads
// issued before the current one is used. The kernel above reads each cached row once per query head and 2 bytes a lane.
// Scores in the log2 domain (scale · log2 e folded into q), an online softmax per (lane group, head), merged
// across the groups at the end.
constexpr int kGqaThreads = 128;
template <int G, int L>
__global__ void __launch_bounds__(kGqaThreads)
    attention_decode_gqa_kernel(bf16* out, const bf16* q, const bf16* kc, const bf16* vc, const int32_t* lens, int Tq,
                                Paged paged, int H, int Hkv, float scale_log2) {
  constexpr int kGroups = kGqaThreads / L, hd = 8 * L;
  const int row = blockIdx.x, kh = blockIdx.y, b = row / Tq, t = row % Tq;
  const int grp = threadIdx.x / L, lane = threadIdx.x % L;
  const int pos = lens[b] - Tq + t;  // attends to keys 0..pos
  float qv[G][8], acc[G][8], m[G], l[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const cuda::F8 f = cuda::load8f(q + (int64_t(row) * H + kh * G + g) * hd + lane * 8);
#pragma unroll
    for (int i = 0; i < 8; ++i) qv[g][i] = f.v[i] * scale_log2, acc[g][i] = 0.f;
    m[g] = -INFINITY, l[g] = 0.f;
  }
  const int64_t stride = int64_t(Hkv) * hd;
  const bf16* kb = kc + int64_t(kh) * hd + lane * 8;
  const bf16* vb = vc + int64_t(kh) * hd + lane * 8;
  const uint4 zero{0, 0, 0, 0};
  uint4 kr = zero, vr = zero;
  if (grp <= pos) {
    const int64_t at = paged.row(b, grp) * stride;
    kr = *reinterpret_cast<const uint4*>(kb + at);
    vr = *reinterpret_cast<const uint4*>(vb + at);
  }
  // Every lane runs the same trips (the shuffles need the whole warp); a group past the end skips the update.
  for (int j0 = 0; j0 <= pos; j0 += kGroups) {
    const int j = j0 + grp, next = j + kGroups;
    uint4 kn = zero, vn = zero;
    if (next <= pos) {
      const int64_t at = paged.row(b, next) * stride;
      kn = *reinterpret_cast<const uint4*>(kb + at);
      vn = *reinterpret_cast<const uint4*>(vb + at);
    }
    const cuda::Vec8 k8{kr}, v8{vr};
    float s[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float d = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) d += qv[g][i] * k8[i];
#pragma unroll
      for (int o = L / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
      s[g] = d;
    }
    if (j <= pos) {
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float m_new = fmaxf(m[g], s[g]), corr = exp2f(m[g] - m_new), p = exp2f(s[g] - m_new);
        l[g] = l[g] * corr + p;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] = acc[g][i] * corr + p * v8[i];
        m[g] = m_new;
      }
    }
    kr = kn, vr = vn;
  }
  __shared__ float sm[kGroups][G], sl[kGroups][G], sacc[kGroups][G][hd];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (lane == 0) sm[grp][g] = m[g], sl[grp][g] = l[g];
#pragma unroll
    for (int i = 0; i < 8; ++i) sacc[grp][g][lane * 8 + i] = acc[g][i];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * hd; idx += kGqaThreads) {
    const int g = idx / hd, c = idx % hd;
    float M = -INFINITY;
    for (int w = 0; w < kGroups; ++w) M = fmaxf(M, sm[w][g]);
    float den = 0.f, num = 0.f;
    for (int w = 0; w < kGroups; ++w)
      if (sm[w][g] != -INFINITY) {
        const float e = exp2f(sm[w][g] - M);
        den += sl[w][g] * e;
        num += sacc[w][g][c] * e;
      }
    out[(int64_t(row) * H + kh * G + g) * hd + c] = cuda::to_bf(num / den);
  }
}

template <int L>
bool launch_gqa(int G, dim3 grid, cudaStream_t st, bf16* out, const bf16* q, const bf16* kc, const bf16* vc,
                const int32_t* lens, int Tq, Paged paged, int H, int Hkv, float scale_log2) {
  switch (G) {
    case 1:
      attention_decode_gqa_kernel<1, L>
          <<<grid, kGqaThreads, 0, st>>>(out, q, kc, vc, lens, Tq, paged, H, Hkv, scale_log2);
      return true;
    case 2:
      attention_decode_gqa_kernel<2, L>
          <<<grid, kGqaThreads, 0, st>>>(out, q, kc, vc, lens, Tq, paged, H, Hkv, scale_log2);
      return true;
    case 4:
      attention_decode_gqa_kernel<4, L>
          <<<grid, kGqaThreads, 0, st>>>(out, q, kc, vc, lens, Tq, paged, H, Hkv, scale_log2);
      return true;
    case 8:
      attention_decode_gqa_kernel<8, L>
          <<<grid, kGqaThreads, 0, st>>>(out, q, kc, vc, lens, Tq, paged, H, Hkv, scale_log2);
      return true;
    default: return false;
  }
}

// One block per new token: its key and value rows into the cache at position lens[b] − Tq + t (16-byte pieces
// where the row allows, else 2-byte elements).
__global__ void kv_append_kernel(bf16* kc, bf16* vc, const bf16* k, const bf16* v, const int32_t* lens, int Tq,
                                 Paged paged, int row) {
  const int token = blockIdx.x, b = token / Tq, t = token % Tq;
  const int64_t at = paged.row(b, lens[b] - Tq + t) * row, from = int64_t(token) * row;
  if (row % 8 == 0) {
    const int4* ks = reinterpret_cast<const int4*>(k + from);
    const int4* vs = reinterpret_cast<const int4*>(v + from);
    int4* kd = reinterpret_cast<int4*>(kc + at);
    int4* vd = reinterpret_cast<int4*>(vc + at);
    for (int i = threadIdx.x; i < row / 8; i += blockDim.x) kd[i] = ks[i], vd[i] = vs[i];
  } else {
    for (int i = threadIdx.x; i < row; i += blockDim.x) kc[at + i] = k[from + i], vc[at + i] = v[from + i];
  }
}
// The decode step's q, k and v from one GEMM's output (Ops::decode_qkv): a warp per (token, head of q, k or v). The
// lanes are laid out as qk_norm_rope's forward lays them out (pairs (i, i+1) and (i + half, i + half + 1) for
// i = 2·lane + 64m) with its rounding (x̂ rounded to bf16, the weight and the rotation in fp32, y rounded once), and
// without a norm as rope's kernel rounds, so q and the cached keys are what qk_norm_rope_forward (or rope) and
// kv_append give. Three launches a layer become one.
template <int kIters>
__global__ void decode_qkv_kernel(bf16* q, bf16* kc, bf16* vc, const bf16* qkv, const bf16* q_norm, const bf16* k_norm,
                                  const int32_t* pos, const float* inv_freq, const int32_t* lens, Paged paged,
                                  int64_t N, int Tq, int H, int Hkv, int half, float eps) {
  const int C = 2 * half, slots = H + 2 * Hkv;
  for (int64_t item = int64_t(blockIdx.x) * kWarps + threadIdx.y; item < N * slots;
       item += int64_t(gridDim.x) * kWarps) {
    const int64_t n = item / slots;
    const int s = int(item % slots);
    const bf16* x = qkv + n * slots * C + int64_t(s) * C;
    bf16* y;
    if (s < H) {
      y = q + (n * H + s) * C;
    } else {
      const int b = int(n / Tq), t = int(n % Tq), kv = s < H + Hkv ? s - H : s - H - Hkv;
      y = (s < H + Hkv ? kc : vc) + (paged.row(b, lens[b] - Tq + t) * Hkv + kv) * C;
    }
    if (s >= H + Hkv) {  // a value row: copied as it is
      for (int i = 2 * threadIdx.x; i < C; i += 64)
        *reinterpret_cast<__nv_bfloat162*>(y + i) = *reinterpret_cast<const __nv_bfloat162*>(x + i);
      continue;
    }
    const bf16* w = s < H ? q_norm : k_norm;  // null: rope alone
    float2 lo[kIters], hi[kIters];
#pragma unroll
    for (int m = 0; m < kIters; ++m) {
      const int i = 2 * threadIdx.x + 64 * m;
      lo[m] = hi[m] = make_float2(0.f, 0.f);
      if (i < half) {
        lo[m] = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(x + i));
        hi[m] = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(x + i + half));
      }
    }
    float rs = 0.f;
    if (w) {
      float ss = 0.f;
#pragma unroll
      for (int m = 0; m < kIters; ++m)
        ss += lo[m].x * lo[m].x + lo[m].y * lo[m].y + hi[m].x * hi[m].x + hi[m].y * hi[m].y;
      rs = rsqrtf(cuda::warp_sum(ss) / float(C) + eps);
    }
    const float p = float(pos[n]);
#pragma unroll
    for (int m = 0; m < kIters; ++m) {
      const int i = 2 * threadIdx.x + 64 * m;
      if (i >= half) continue;
      float a0 = lo[m].x, a1 = lo[m].y, b0 = hi[m].x, b1 = hi[m].y;
      if (w) {
        a0 = cuda::to_f(w[i]) * cuda::to_f(cuda::to_bf(a0 * rs));
        a1 = cuda::to_f(w[i + 1]) * cuda::to_f(cuda::to_bf(a1 * rs));
        b0 = cuda::to_f(w[i + half]) * cuda::to_f(cuda::to_bf(b0 * rs));
        b1 = cuda::to_f(w[i + half + 1]) * cuda::to_f(cuda::to_bf(b1 * rs));
      }
      float s0, c0, s1, c1;
      sincosf(p * inv_freq[i], &s0, &c0);  // full precision, as the rope kernels
      sincosf(p * inv_freq[i + 1], &s1, &c1);
      *reinterpret_cast<__nv_bfloat162*>(y + i) = __floats2bfloat162_rn(a0 * c0 - b0 * s0, a1 * c1 - b1 * s1);
      *reinterpret_cast<__nv_bfloat162*>(y + i + half) = __floats2bfloat162_rn(b0 * c0 + a0 * s0, b1 * c1 + a1 * s1);
    }
  }
}

__global__ void advance_decode_kernel(int32_t* ids, int32_t* positions, int32_t* lens, const int32_t* drawn, int B) {
  for (int b = blockIdx.x * blockDim.x + threadIdx.x; b < B; b += gridDim.x * blockDim.x) {
    ids[b] = drawn[b];
    positions[b] = lens[b]++;
  }
}
}  // namespace

void CudaOps::advance_decode(Tensor ids, Tensor positions, Tensor lens, const Tensor& drawn) {
  const auto prof = profile("advance_decode");
  const int64_t B = lens.numel();
  SOLTRAIN_CHECK(ids.numel() == B && positions.numel() == B && drawn.numel() == B, "advance_decode shapes");
  if (B == 0) return;
  advance_decode_kernel<<<cuda::blocks_for(B, 256), 256, 0, stream_>>>(ids.i32(), positions.i32(), lens.i32(),
                                                                       drawn.i32(), int(B));
  CUDA_CHECK_LAUNCH();
}

namespace {
Paged paged_of(const Tensor& table, const Tensor& pool) {
  SOLTRAIN_CHECK(table.dtype == DType::I32 && table.shape.size() == 2 && pool.shape.size() == 4, "paged cache shapes");
  return Paged{table.i32(), int(table.dim(1)), int(pool.dim(1))};
}
}  // namespace

void CudaOps::kv_append(Tensor k_pool, Tensor v_pool, const Tensor& k, const Tensor& v, const Tensor& lens,
                        const Tensor& table) {
  const auto prof = profile("kv_append");
  const int64_t B = table.dim(0), row = k_pool.dim(2) * k_pool.dim(3);
  const int64_t tokens = k.dim(0);
  SOLTRAIN_CHECK(B > 0 && tokens % B == 0 && k.numel() == tokens * row && v.numel() == k.numel() && lens.numel() == B,
                 "kv_append shapes");
  if (tokens == 0) return;
  kv_append_kernel<<<unsigned(tokens), 128, 0, stream_>>>(k_pool.as<bf16>(), v_pool.as<bf16>(), k.as<bf16>(),
                                                          v.as<bf16>(), lens.i32(), int(tokens / B),
                                                          paged_of(table, k_pool), int(row));
  CUDA_CHECK_LAUNCH();
}

void CudaOps::decode_qkv(Tensor q, Tensor k_pool, Tensor v_pool, Tensor qkv, const Tensor& q_norm, const Tensor& k_norm,
                         const Tensor& positions, const Tensor& inv_freq, float eps, const Tensor& lens,
                         const Tensor& table) {
  const auto prof = profile("decode_qkv");
  const int64_t B = table.dim(0), N = q.dim(0), H = q.dim(1), hd = q.dim(2), Hkv = k_pool.dim(2);
  SOLTRAIN_CHECK(B > 0 && N % B == 0 && k_pool.dim(3) == hd && qkv.numel() == N * (H + 2 * Hkv) * hd &&
                     positions.numel() == N && lens.numel() == B && hd % 4 == 0 && hd <= 256,
                 "decode_qkv shapes");
  if (N == 0) return;
  const Paged paged = paged_of(table, k_pool);
  const int64_t warps = N * (H + 2 * Hkv);
  const unsigned grid = unsigned(std::min<int64_t>((warps + kWarps - 1) / kWarps, int64_t(1) << 20));
  const dim3 block{32, kWarps};
  const bf16* qn = q_norm.defined() ? q_norm.as<bf16>() : nullptr;
  const bf16* kn = k_norm.defined() ? k_norm.as<bf16>() : nullptr;
  auto launch = [&](auto kernel) {
    kernel<<<grid, block, 0, stream_>>>(q.as<bf16>(), k_pool.as<bf16>(), v_pool.as<bf16>(), qkv.as<bf16>(), qn, kn,
                                        positions.i32(), inv_freq.f32(), lens.i32(), paged, N, int(N / B), int(H),
                                        int(Hkv), int(hd / 2), eps);
  };
  if (hd <= 128)
    launch(decode_qkv_kernel<1>);
  else
    launch(decode_qkv_kernel<2>);
  CUDA_CHECK_LAUNCH();
}

void CudaOps::attention_decode(Tensor out, const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                               const Tensor& lens, const Tensor& table, float scale) {
  const auto prof = profile("attention_decode");
  const int64_t B = table.dim(0), Hkv = k_pool.dim(2), hd = k_pool.dim(3);
  const Paged paged = paged_of(table, k_pool);
  const int64_t rows = q.dim(0), H = q.dim(1);
  SOLTRAIN_CHECK(rows % B == 0 && q.dim(2) == hd && lens.numel() == B && H % Hkv == 0, "attention_decode shapes");
  if (hd > 32 * kMaxPerLane) user_error("head_dim ", hd, " is above the decoder's limit of ", 32 * kMaxPerLane);
  if (rows == 0) return;
  // The grouped form where it has an instance (SOLTRAIN_DECODE_ATTENTION=rows keeps the per-head one, to compare).
  static const bool per_head = [] {
    const char* e = std::getenv("SOLTRAIN_DECODE_ATTENTION");
    return e && std::strcmp(e, "rows") == 0;
  }();
  if (!per_head) {
    const int G = int(H / Hkv);
    const dim3 gqa{unsigned(rows), unsigned(Hkv)};
    const float s2 = scale * 1.4426950408889634f;  // log2(e)
    const auto* qp = q.as<bf16>();
    const auto* kp = k_pool.as<bf16>();
    const auto* vp = v_pool.as<bf16>();
    bf16* op = out.as<bf16>();
    const int tq = int(rows / B);
    const bool launched =
        hd == 16    ? launch_gqa<2>(G, gqa, stream_, op, qp, kp, vp, lens.i32(), tq, paged, int(H), int(Hkv), s2)
        : hd == 32  ? launch_gqa<4>(G, gqa, stream_, op, qp, kp, vp, lens.i32(), tq, paged, int(H), int(Hkv), s2)
        : hd == 64  ? launch_gqa<8>(G, gqa, stream_, op, qp, kp, vp, lens.i32(), tq, paged, int(H), int(Hkv), s2)
        : hd == 128 ? launch_gqa<16>(G, gqa, stream_, op, qp, kp, vp, lens.i32(), tq, paged, int(H), int(Hkv), s2)
        : hd == 256 ? launch_gqa<32>(G, gqa, stream_, op, qp, kp, vp, lens.i32(), tq, paged, int(H), int(Hkv), s2)
                    : false;
    if (launched) {
      CUDA_CHECK_LAUNCH();
      return;
    }
  }
  const dim3 grid{unsigned(rows), unsigned(H)};
  attention_decode_kernel<<<grid, 32 * kWarps, 0, stream_>>>(out.as<bf16>(), q.as<bf16>(), k_pool.as<bf16>(),
                                                             v_pool.as<bf16>(), lens.i32(), paged, int(rows / B),
                                                             int(H), int(Hkv), int(hd), scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace soltrain
