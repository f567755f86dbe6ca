// CUDA sm_90a: flash attention forward on warpgroup MMA, laid out like FlashAttention-3. Same algorithm
// and outputs as the portable kernel in attention_forward.cu (causal, packed documents, GQA, fp32 online
// softmax, log-sum-exp saved). A block is three warpgroups: one copies Q once and K/V tiles of 128 keys
// through a two-stage ring with TMA (mbarriers say when a stage is full and when both consumers are done
// with it), and two each own 64 query rows. A consumer issues S = Q Kᵀ for tile j, then O += P V for tile
// j - 1, and runs tile j's softmax while the tensor cores work on both; P goes from registers straight
// into the next product. No block-wide barrier inside the loop.
#include <cfloat>

#include "kernels/cuda/attention_sm90.cuh"
#include "kernels/cuda/attention_sm90.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/tensor_map.h"

namespace soltrain::cuda {

using namespace attn;
using namespace attn::sm90;

namespace {

constexpr int kM = 128, kN = 128;  // queries per block, keys per tile
constexpr int kStages = 2;         // K/V ring depth (3 measured no faster: bench/NOTES.md run 13)
constexpr int kThreads = 3 * kWarpgroup;
[[maybe_unused]] constexpr int kConsumerWarps = 8;  // arrivals that release a stage (each consumer warp's first lane)

template <int D>
struct ForwardSmem {
  static constexpr int kK = kM * D, kV = kK + kStages * kN * D, kEnd = kV + kStages * kN * D;  // bf16 offsets
  static constexpr size_t bytes() { return size_t(kEnd) * sizeof(bf16) + (1 + 4 * kStages) * sizeof(uint64_t) + 1024; }
};

#ifdef SOLTRAIN_SM90_DEVICE
// Row-wise online softmax of one tile in place: s becomes unnormalised probabilities exp2(s·scale − m),
// m the running maximum (log2 domain), l the running per-thread partial sums; alpha rescales the old O.
template <bool kMasked>
__device__ __forceinline__ void online_softmax(float (&s)[kN / 2], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                               int k0, const int (&row)[2], int len, int t, float scale_log2) {
  if constexpr (kMasked) {
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) {
      const int key = k0 + i / 4 * 8 + 2 * t + (i & 1), r = i / 2 % 2;
      if (key > row[r] || key >= len) s[i] = -INFINITY;
    }
  }
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) mx[i / 2 % 2] = fmaxf(mx[i / 2 % 2], s[i]);
  float neg_m[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    // m starts at -FLT_MAX, not -inf: a row with every key masked so far keeps alpha = 1 and p = 0
    const float m_new = fmaxf(m[r], mx[r] * scale_log2);
    alpha[r] = fast_exp2(m[r] - m_new);
    m[r] = m_new;
    neg_m[r] = -m_new;
  }
  float sum[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) {
    s[i] = fast_exp2(fmaf(s[i], scale_log2, neg_m[i / 2 % 2]));
    sum[i / 2 % 2] += s[i];
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + sum[r];
}
#endif

template <int D>
__global__ void __launch_bounds__(kThreads, 1)
    flash_forward_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                         const __grid_constant__ CUtensorMap v_map, bf16* out, float* lse, const int32_t* cu, int64_t N,
                         int H, int Hkv, float scale_log2) {
#ifdef SOLTRAIN_SM90_DEVICE
  using L = ForwardSmem<D>;
  extern __shared__ unsigned char smem_raw[];
  bf16* const tiles = align1024(smem_raw);
  bf16* const Qs = tiles;
  bf16* const Kb = tiles + L::kK;  // stage s at + s * kN * D
  bf16* const Vb = tiles + L::kV;
  uint64_t* const bars = reinterpret_cast<uint64_t*>(tiles + L::kEnd);
  uint64_t* const q_full = bars;
  uint64_t* const k_full = bars + 1;  // [kStages] each
  uint64_t* const v_full = k_full + kStages;
  uint64_t* const k_free = v_full + kStages;
  uint64_t* const v_free = k_free + kStages;

  const int h = blockIdx.y, kh = h / (H / Hkv), doc = blockIdx.z;
  const int start = cu[doc], len = cu[doc + 1] - cu[doc];
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kM;  // longest-running blocks (most keys) first
  if (q0 >= len) return;
  const int last_tile = min(q0 + kM - 1, len - 1) / kN;
  if (threadIdx.x == 0) {
    mbar_init(q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(k_full + s, 1);
      mbar_init(v_full + s, 1);
      mbar_init(k_free + s, kConsumerWarps);
      mbar_init(v_free + s, kConsumerWarps);
    }
    mbar_init_fence();
  }
  __syncthreads();

  const int wg = threadIdx.x / kWarpgroup;
  if (wg == 0) {  // the copy warpgroup: one thread issues every TMA
    release_registers<24>();
    if (threadIdx.x != 0) return;
    mbar_expect_tx(q_full, kM * D * sizeof(bf16));
    for (int j = 0; j < D / 64; ++j) tma_load(Qs + j * kM * 64, &q_map, j * 64, h, start + q0, q_full);
    for (int kt = 0; kt <= last_tile; ++kt) {
      const int s = kt % kStages, use = kt / kStages;
      if (use > 0) mbar_wait(k_free + s, (use - 1) % 2);
      mbar_expect_tx(k_full + s, kN * D * sizeof(bf16));
      for (int j = 0; j < D / 64; ++j)
        tma_load(Kb + s * kN * D + j * kN * 64, &k_map, j * 64, kh, start + kt * kN, k_full + s);
      if (use > 0) mbar_wait(v_free + s, (use - 1) % 2);
      mbar_expect_tx(v_full + s, kN * D * sizeof(bf16));
      for (int j = 0; j < D / 64; ++j)
        tma_load(Vb + s * kN * D + j * kN * 64, &v_map, j * 64, kh, start + kt * kN, v_full + s);
    }
    return;
  }
  claim_registers<240>();

  const int cw = wg - 1, tid = threadIdx.x % kWarpgroup, warp = tid / 32, g = tid % 32 / 4, t = tid % 4;
  const bool leader = tid % 32 == 0;  // arrives for its warp
  const int wq0 = q0 + cw * 64;       // this warpgroup's first query
  const int row[2] = {wq0 + warp * 16 + g, wq0 + warp * 16 + g + 8};
  // tiles that cross this group's diagonal or the document's end need masking
  auto needs_mask = [&](int kt) { return kt * kN + kN - 1 > wq0 || kt * kN + kN > len; };

  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  float m[2] = {-FLT_MAX, -FLT_MAX}, l[2] = {0.f, 0.f}, alpha[2];
  float s[kN / 2];
  uint32_t p[kN / 16][4];

  auto scores = [&](int kt) {  // issue S = Q Kᵀ for tile kt (not waited for)
    mbar_wait(k_full + kt % kStages, kt / kStages % 2);
    const bf16* Ks = Kb + kt % kStages * kN * D;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) wgmma_ss<kN>(s, k_major<kM>(Qs, cw * 64, ks), k_major<kN>(Ks, 0, ks), ks > 0);
    wgmma_commit();
  };
  auto softmax = [&](int kt) {
    if (needs_mask(kt))
      online_softmax<true>(s, m, l, alpha, kt * kN, row, len, t, scale_log2);
    else
      online_softmax<false>(s, m, l, alpha, kt * kN, row, len, t, scale_log2);
  };
  auto to_p = [&]() {
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) c_to_a(p[kk], &s[8 * kk], &s[8 * kk + 4]);
  };
  auto values = [&](int kt) {  // issue O += P V for tile kt (not waited for)
    mbar_wait(v_full + kt % kStages, kt / kStages % 2);
    const bf16* Vs = Vb + kt % kStages * kN * D;
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) wgmma_rs<D>(o, p[kk], mn_major<kN>(Vs, kk), 1);
    wgmma_commit();
  };

  mbar_wait(q_full, 0);
  wgmma_fence();
  scores(0);
  wgmma_wait<0>();
  fence_accumulators(s);
  if (leader) mbar_arrive(k_free);
  softmax(0);
  to_p();
  for (int kt = 1; kt <= last_tile; ++kt) {
    wgmma_fence();
    scores(kt);
    values(kt - 1);
    wgmma_wait<1>();  // S of tile kt is in; P V of tile kt - 1 may still run
    fence_accumulators(s);
    if (leader) mbar_arrive(k_free + kt % kStages);
    softmax(kt);
    wgmma_wait<0>();
    fence_accumulators(o);
    if (leader) mbar_arrive(v_free + (kt - 1) % kStages);
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] *= alpha[i / 2 % 2];
    to_p();
  }
  wgmma_fence();
  values(last_tile);
  wgmma_wait<0>();
  fence_accumulators(o);

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= len) continue;
    store_row<D>(out + ((int64_t(start) + row[r]) * H + h) * int64_t(D), o, r, 1.f / l[r]);
    if (t == 0) lse[int64_t(h) * N + start + row[r]] = (m[r] + log2f(l[r])) / kLog2e;
  }
#endif
}

template <int D>
void launch(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
            const SeqLayout& seq, float scale, cudaStream_t s) {
  static bool configured = false;
  if (!configured) {
    CUDA_CHECK(cudaFuncSetAttribute(flash_forward_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(ForwardSmem<D>::bytes())));
    configured = true;
  }
  const int H = int(q.dim(1)), Hkv = int(k.dim(1));
  const dim3 grid(unsigned((seq.max_seqlen + kM - 1) / kM), unsigned(H), unsigned(seq.cu_seqlens.numel() - 1));
  flash_forward_kernel<D><<<grid, kThreads, ForwardSmem<D>::bytes(), s>>>(
      head_tile_map(q, kM), head_tile_map(k, kN), head_tile_map(v, kN), out.as<bf16>(), lse.f32(), seq.cu_seqlens.i32(),
      q.dim(0), H, Hkv, scale * kLog2e);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void flash_forward_sm90(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                        const SeqLayout& seq, float scale, cudaStream_t s) {
  if (q.dim(2) == 64)
    launch<64>(out, lse, q, k, v, seq, scale, s);
  else
    launch<128>(out, lse, q, k, v, seq, scale, s);
}

}  // namespace soltrain::cuda
