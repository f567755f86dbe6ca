// CUDA: the experts' grouped GEMMs (model/moe.h): one launch per projection covers every expert, each
// thread block finding its expert and rows from the device-side offsets moe_permute wrote, so nothing waits
// for the host. bf16 tensor-core MMA (m16n8k16, fp32 accumulation; sm_80 and up) with a cp.async pipeline of
// kStages tiles, the fragments loaded with ldmatrix (.trans for operands stored along M or N, so no operand is
// ever transposed in memory). Three shapes:
//   forward  y[rows_e] = alpha · x[rows_e] · w[e]ᵀ (+ y)      rows grouped, A and B K-contiguous
//   dx       dx[rows_e] = alpha · dy[rows_e] · w[e] (+ dx)     rows grouped, B N-contiguous
//   dw       dw[e] += alpha · dy[rows_e]ᵀ · x[rows_e]          the reduction grouped, A and B M/N-contiguous
#include <algorithm>
#include <cstdlib>
#include <string>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_sm90.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/tensor_map.h"

namespace soltrain {

using cuda::bf16;
namespace mma = cuda::attn;

namespace {
constexpr int kBK = 32, kStages = 3, kThreads = 256, kPad = 8;

// One operand's tile in shared memory: element (i, k), i along the output's M (or N) side, k the reduction.
// k-contiguous operands are stored [i][k] (pitch kBK + kPad), the others [k][i] (pitch BI + kPad): both pitches
// keep ldmatrix's eight 16-byte rows on distinct banks.
template <int BI, bool KContig>
struct Tile {
  static constexpr int pitch = KContig ? kBK + kPad : BI + kPad;
  static constexpr int elems = KContig ? BI * pitch : kBK * pitch;

  // Global → shared by 16-byte cp.async; chunks outside [i_end) × [k_begin, k_end) are zero-filled. A
  // k-contiguous operand is addressed src[i·ld + k], the other src[k·ld + i]. i_end and ld are multiples of 8
  // along the contiguous side (checked by the launcher), so a chunk is wholly in or out.
  __device__ static void load(bf16* dst, const bf16* src, int64_t ld, int64_t i0, int64_t i_end, int64_t k0,
                              int64_t k_end) {
    if constexpr (KContig) {
      for (int c = threadIdx.x; c < BI * (kBK / 8); c += kThreads) {
        const int r = c / (kBK / 8), kc = c % (kBK / 8) * 8;
        const int64_t i = i0 + r, k = k0 + kc;
        const bool ok = i < i_end && k < k_end;
        mma::cp_async16(dst + r * pitch + kc, ok ? src + i * ld + k : src, ok);
      }
    } else {
      for (int c = threadIdx.x; c < kBK * (BI / 8); c += kThreads) {
        const int r = c / (BI / 8), ic = c % (BI / 8) * 8;
        const int64_t k = k0 + r, i = i0 + ic;
        const bool ok = i < i_end && k < k_end;
        mma::cp_async16(dst + r * pitch + ic, ok ? src + k * ld + i : src, ok);
      }
    }
  }
  // The A fragment (16 i × 16 k) at tile row i, reduction column k.
  __device__ static void frag_a(uint32_t a[4], const bf16* t, int i, int k) {
    const int lane = threadIdx.x % 32;
    if constexpr (KContig)
      mma::ldmatrix_x4(a, t + (i + lane % 16) * pitch + k + (lane / 16) * 8);
    else
      mma::ldmatrix_x4_trans(a, t + (k + lane % 8 + (lane / 16) * 8) * pitch + i + (lane / 8 % 2) * 8);
  }
  // The B fragments of two 8-wide n-tiles at tile row i (16 n × 16 k).
  __device__ static void frag_b2(uint32_t b0[2], uint32_t b1[2], const bf16* t, int i, int k) {
    if constexpr (KContig)
      mma::load_b2(b0, b1, t + i * pitch + k, pitch);
    else
      mma::load_b2_trans(b0, b1, t + k * pitch + i, pitch);
  }
};

enum class Group { Rows, Reduction };

struct GemmArgs {
  const bf16* a;
  int64_t lda;
  const bf16* b;
  int64_t ldb, b_stride;  // b_stride: elements between experts' B (rows grouped)
  void* c;                // bf16 [rows, N] (rows grouped) or F32 [E, M, N] (reduction grouped)
  const int32_t* offsets;
  int E;
  int64_t M, N, K;  // rows grouped: M the total rows; reduction grouped: M the output's rows, K unused
  float alpha;
  bool accumulate;
};

// Rows grouped: this block's expert and rows, from its tile slot. Each expert's rows make ceil(count / BM)
// tiles, in expert order; slots past the last tile (the grid is sized for the worst case) get e = -1.
template <int BM>
__device__ void find_tile(const int32_t* offsets, int E, int slot, int& e_out, int64_t& m0, int64_t& m_end) {
  __shared__ int s_e, s_m0, s_end;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    if (lane == 0) s_e = -1;
    __syncwarp();
    int before = 0;
    for (int base = 0; base < E; base += 32) {
      const int e = base + lane;
      const int lo = e < E ? offsets[e] : 0, hi = e < E ? offsets[e + 1] : 0;
      const int tiles = (hi - lo + BM - 1) / BM;
      int incl = tiles;
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      const int first = before + incl - tiles;
      if (e < E && slot >= first && slot < first + tiles) s_e = e, s_m0 = lo + (slot - first) * BM, s_end = hi;
      before += __shfl_sync(0xffffffffu, incl, 31);
    }
  }
  __syncthreads();
  e_out = s_e, m0 = s_m0, m_end = s_end;
}

// Block tile BM × BN over WM × WN warps (kThreads / 32 of them); each warp's tile is MI 16-row by NI 8-column
// MMA tiles.
template <int BM, int BN, int WM, int WN, bool AK, bool BK_, Group G>
__global__ void __launch_bounds__(kThreads) grouped_gemm(GemmArgs p) {
  static_assert(WM * WN * 32 == kThreads, "warp grid");
  constexpr int WTM = BM / WM, WTN = BN / WN, MI = WTM / 16, NI = WTN / 8;
  static_assert(MI >= 1 && NI >= 2 && NI % 2 == 0, "warp tile");
  using TA = Tile<BM, AK>;
  using TB = Tile<BN, BK_>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* smem = reinterpret_cast<bf16*>(smem_raw);

  int e;
  int64_t m0, m_end, k_begin, k_end;
  const bf16* b = p.b;
  if constexpr (G == Group::Rows) {
    find_tile<BM>(p.offsets, p.E, blockIdx.x, e, m0, m_end);
    if (e < 0) return;
    k_begin = 0, k_end = p.K;
    b += int64_t(e) * p.b_stride;
  } else {
    e = blockIdx.z;
    m0 = int64_t(blockIdx.y) * BM, m_end = p.M;
    k_begin = p.offsets[e], k_end = p.offsets[e + 1];
    if (k_end == k_begin) return;  // no rows: nothing to add
  }
  const int64_t n0 = int64_t(G == Group::Rows ? blockIdx.y : blockIdx.x) * BN;
  const int ktiles = int((k_end - k_begin + kBK - 1) / kBK);

  auto stage_a = [&](int s) { return smem + s * (TA::elems + TB::elems); };
  auto stage_b = [&](int s) { return stage_a(s) + TA::elems; };
  auto load = [&](int kt, int s) {
    const int64_t k0 = k_begin + int64_t(kt) * kBK;
    TA::load(stage_a(s), p.a, p.lda, m0, m_end, k0, k_end);
    TB::load(stage_b(s), b, p.ldb, n0, p.N, k0, k_end);
  };

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / WN, wn = warp % WN;
  float acc[MI][NI][4] = {};

  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ktiles) load(s, s);
    mma::cp_async_commit();
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 2) : "memory");
    __syncthreads();  // tile kt is in; every warp is done with the stage the next load overwrites
    if (kt + kStages - 1 < ktiles) load(kt + kStages - 1, (kt + kStages - 1) % kStages);
    mma::cp_async_commit();
    const bf16 *ta = stage_a(kt % kStages), *tb = stage_b(kt % kStages);
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      uint32_t af[MI][4], bfr[NI][2];
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) TA::frag_a(af[mi], ta, wm * WTM + mi * 16, kk);
#pragma unroll
      for (int ni = 0; ni < NI; ni += 2) TB::frag_b2(bfr[ni], bfr[ni + 1], tb, wn * WTN + ni * 8, kk);
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) mma::mma(acc[mi][ni], af[mi], bfr[ni]);
    }
  }
  mma::cp_async_wait_all();

  // Epilogue: C fragment element (g, 2t..2t+1) and (g + 8, ...); N is even, so a pair is wholly in or out.
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = m0 + wm * WTM + mi * 16 + lane / 4 + h * 8;
        const int64_t col = n0 + wn * WTN + ni * 8 + (lane % 4) * 2;
        if (row >= m_end || col >= p.N) continue;
        float v0 = p.alpha * acc[mi][ni][2 * h], v1 = p.alpha * acc[mi][ni][2 * h + 1];
        if constexpr (G == Group::Rows) {
          __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(static_cast<bf16*>(p.c) + row * p.N + col);
          if (p.accumulate) {
            const float2 old = __bfloat1622float2(*out);
            v0 += old.x, v1 += old.y;
          }
          *out = __floats2bfloat162_rn(v0, v1);
        } else {
          float2* out = reinterpret_cast<float2*>(static_cast<float*>(p.c) + (int64_t(e) * p.M + row) * p.N + col);
          const float2 old = *out;
          *out = make_float2(old.x + v0, old.y + v1);
        }
      }
}

// Hopper (sm_90a): the rows-grouped forward and dx, the two big GEMMs of a LoRA step, on warpgroup MMA. Two
// consumer warpgroups each own 64 of the block's 128 rows against 128 output columns (m64n128k16, fp32
// accumulators in registers); 64-wide contraction tiles in the 128-byte-swizzled layout of attention_sm90.cuh,
// loaded by every thread with cp.async through kWgStages stages, two tiles ahead of the MMAs, one wgmma group in
// flight. The weight is K-major in the forward (w[e] [N, K]) and N-major in dx (w[e] [K, N]: kTransB). (A
// three-stage form, two blocks per SM, measured no faster: run 78.)
constexpr int kWgStages = 4, kWgBM = 128, kWgBN = 128, kWgBK = 64;
constexpr size_t kWgStageElems = size_t(kWgBM + kWgBN) * kWgBK;
constexpr size_t kWgSmem = kWgStages * kWgStageElems * sizeof(bf16) + 1024;  // + the 1024-byte alignment

template <bool kTransB>
__global__ void __launch_bounds__(256) grouped_gemm_sm90(GemmArgs p) {
#ifdef SOLTRAIN_SM90_DEVICE
  namespace h = cuda::attn::sm90;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* smem = h::align1024(smem_raw);
  int e;
  int64_t m0, m_end;
  find_tile<kWgBM>(p.offsets, p.E, blockIdx.x, e, m0, m_end);
  if (e < 0) return;
  const bf16* b = p.b + int64_t(e) * p.b_stride;
  const int64_t n0 = int64_t(blockIdx.y) * kWgBN;
  const int ktiles = int((p.K + kWgBK - 1) / kWgBK);
  auto tile_a = [&](int s) { return smem + s * kWgStageElems; };
  auto tile_b = [&](int s) { return tile_a(s) + kWgBM * kWgBK; };
  // sw128: row r's 16-byte chunk c at chunk c ^ (r % 8) of its 128-byte row (a 64-column block of R rows)
  auto load = [&](int kt, int s) {
    const int64_t k0 = int64_t(kt) * kWgBK;
    bf16* ta = tile_a(s);
    for (int c = threadIdx.x; c < kWgBM * 8; c += 256) {  // A: 128 rows x 8 chunks, K-major
      const int r = c / 8, kc = c % 8;
      const int64_t row = m0 + r, k = k0 + kc * 8;
      const bool ok = row < m_end && k < p.K;
      mma::cp_async16(ta + r * 64 + ((kc ^ (r % 8)) * 8), ok ? p.a + row * p.lda + k : p.a, ok);
    }
    bf16* tb = tile_b(s);
    if constexpr (!kTransB) {
      for (int c = threadIdx.x; c < kWgBN * 8; c += 256) {  // B: 128 n-rows x 8 chunks, K-major
        const int r = c / 8, kc = c % 8;
        const int64_t n = n0 + r, k = k0 + kc * 8;
        const bool ok = n < p.N && k < p.K;
        mma::cp_async16(tb + r * 64 + ((kc ^ (r % 8)) * 8), ok ? b + n * p.ldb + k : b, ok);
      }
    } else {
      for (int c = threadIdx.x; c < kWgBK * 16; c += 256) {  // B: 64 k-rows x 16 chunks (two 64-column blocks)
        const int r = c / 16, nc = c % 16, blk = nc / 8, cc = nc % 8;
        const int64_t k = k0 + r, n = n0 + nc * 8;
        const bool ok = k < p.K && n < p.N;
        mma::cp_async16(tb + blk * (kWgBK * 64) + r * 64 + ((cc ^ (r % 8)) * 8), ok ? b + k * p.ldb + n : b, ok);
      }
    }
  };
  const int wg = threadIdx.x / 128;
  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
  for (int s = 0; s < kWgStages - 2; ++s) {
    if (s < ktiles) load(s, s);
    mma::cp_async_commit();
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kWgStages - 3) : "memory");
    h::fence_shared_to_async();
    __syncthreads();  // tile kt is in for everyone, and every warpgroup's MMAs on tile kt - 2 are done
    if (kt + kWgStages - 2 < ktiles) load(kt + kWgStages - 2, (kt + kWgStages - 2) % kWgStages);
    mma::cp_async_commit();
    const bf16 *ta = tile_a(kt % kWgStages), *tb = tile_b(kt % kWgStages);
    h::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kWgBK / 16; ++ks) {
      const uint64_t da = h::k_major<kWgBM>(ta, wg * 64, ks);
      const uint64_t db = kTransB ? h::mn_major<kWgBK>(tb, ks) : h::k_major<kWgBN>(tb, 0, ks);
      h::wgmma_ss_n128<0, kTransB ? 1 : 0>(acc, da, db, kt > 0 || ks > 0);
    }
    h::wgmma_commit();
    h::wgmma_wait<1>();
  }
  h::wgmma_wait<0>();
  h::fence_accumulators(acc);
  mma::cp_async_wait_all();
  // d[4j + e]: row 16w + g + 8(e / 2) of the warpgroup's 64, column 8j + 2t + (e % 2)
  const int w = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int64_t row = m0 + wg * 64 + w * 16 + lane / 4 + hh * 8, col = n0 + j * 8 + (lane % 4) * 2;
      if (row >= m_end || col >= p.N) continue;
      float v0 = p.alpha * acc[4 * j + 2 * hh], v1 = p.alpha * acc[4 * j + 2 * hh + 1];
      __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(static_cast<bf16*>(p.c) + row * p.N + col);
      if (p.accumulate) {
        const float2 old = __bfloat1622float2(*out);
        v0 += old.x, v1 += old.y;
      }
      *out = __floats2bfloat162_rn(v0, v1);
    }
#endif
}

// Hopper (sm_90a), warp-specialised: the same rows-grouped forward and dx with the operands brought by TMA. One
// copy warp issues every load into a ring of kTmaStages stages (full / empty mbarriers), running ahead of the
// MMAs by the whole ring; two consumer warpgroups each own 64 of the block's 128 rows against 256 output columns
// (two m64n128k16 per 16-wide step, 128 fp32 accumulators a thread). A tile that runs past its expert's rows
// reads the next expert's (or zeros past the end) and stores none of them. Up to three terms are summed over their
// concatenated contraction (an expert projection and its LoRA factor's, or dx's several): each term's last k-tile
// reads zeros in A's columns past its K, so whatever B holds there (dx: the next expert's rows) adds nothing.
constexpr int kTmaBM = 128, kTmaBN = 256, kTmaBK = 64, kTmaStages = 4, kTmaTerms = 3;
struct TmaTerms {  // a: [M, K_t] with 64 x 128 boxes; b: [E·N, K_t] (forward) or [E·K_t, N] (dx) with its boxes
  CUtensorMap a[kTmaTerms], b[kTmaTerms];
  int k[kTmaTerms], ktiles[kTmaTerms], n;
};
constexpr size_t kTmaA = size_t(kTmaBM) * kTmaBK, kTmaB = size_t(kTmaBN) * kTmaBK;  // elements per stage
constexpr size_t kTmaSmem = kTmaStages * (kTmaA + kTmaB) * sizeof(bf16) + 2 * kTmaStages * sizeof(uint64_t) + 1024;

template <bool kTransB>
__global__ void __launch_bounds__(384, 1) grouped_gemm_tma(const __grid_constant__ TmaTerms terms, GemmArgs p) {
#ifdef SOLTRAIN_SM90_DEVICE
  namespace h = cuda::attn::sm90;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* const tiles = h::align1024(smem_raw);
  uint64_t* const full = reinterpret_cast<uint64_t*>(tiles + kTmaStages * (kTmaA + kTmaB));
  uint64_t* const empty = full + kTmaStages;
  int e;
  int64_t m0, m_end;
  find_tile<kTmaBM>(p.offsets, p.E, blockIdx.x, e, m0, m_end);
  if (e < 0) return;
  const int n0 = int(blockIdx.y) * kTmaBN;
  int ktiles = 0;
  for (int t = 0; t < terms.n; ++t) ktiles += terms.ktiles[t];
  auto tile_a = [&](int s) { return tiles + s * (kTmaA + kTmaB); };
  auto tile_b = [&](int s) { return tile_a(s) + kTmaA; };
  if (threadIdx.x == 0) {
    for (int s = 0; s < kTmaStages; ++s) {
      h::mbar_init(full + s, 1);
      h::mbar_init(empty + s, 8);  // each consumer warp's leader
    }
    h::mbar_init_fence();
  }
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg == 0) {  // the copy warpgroup: one thread issues every TMA
    h::release_registers<40>();
    if (threadIdx.x != 0) return;
    int g = 0;  // the k-tile over all terms: its stage and phase
    for (int t = 0; t < terms.n; ++t)
      for (int kt = 0; kt < terms.ktiles[t]; ++kt, ++g) {
        const int s = g % kTmaStages, use = g / kTmaStages;
        if (use > 0) h::mbar_wait(empty + s, (use - 1) % 2);
        h::mbar_expect_tx(full + s, uint32_t((kTmaA + kTmaB) * sizeof(bf16)));
        h::tma_load(tile_a(s), &terms.a[t], kt * kTmaBK, 0, int(m0), full + s);
        if constexpr (!kTransB) {  // w[e] [N, K]: rows e·N + n0 .. + 256, K-major
          h::tma_load(tile_b(s), &terms.b[t], kt * kTmaBK, 0, e * int(p.N) + n0, full + s);
        } else {  // w[e] [K, N]: rows e·K + k0 .. + 64, four 64-column blocks (N-major)
          for (int j = 0; j < kTmaBN / 64; ++j)
            h::tma_load(tile_b(s) + j * 64 * kTmaBK, &terms.b[t], n0 + 64 * j, 0, e * terms.k[t] + kt * kTmaBK,
                        full + s);
        }
      }
    return;
  }
  h::claim_registers<232>();
  const int cw = wg - 1, tid = threadIdx.x % 128, w = tid / 32, lane = tid % 32;
  float acc[2][64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[0][i] = acc[1][i] = 0.f;
  for (int kt = 0; kt < ktiles; ++kt) {
    const int s = kt % kTmaStages;
    h::mbar_wait(full + s, kt / kTmaStages % 2);
    const bf16 *ta = tile_a(s), *tb = tile_b(s);
    h::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kTmaBK / 16; ++ks) {
      const uint64_t da = h::k_major<kTmaBM>(ta, cw * 64, ks);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint64_t db =
            kTransB ? h::mn_major<kTmaBK>(tb + half * 2 * 64 * kTmaBK, ks) : h::k_major<kTmaBN>(tb, half * 128, ks);
        h::wgmma_ss_n128<0, kTransB ? 1 : 0>(acc[half], da, db, kt > 0 || ks > 0);
      }
    }
    h::wgmma_commit();
    h::wgmma_wait<1>();  // tile kt - 1's MMAs are done: its stage goes back to the copy warp
    if (kt > 0 && lane == 0) h::mbar_arrive(empty + (kt - 1) % kTmaStages);
  }
  h::wgmma_wait<0>();
  h::fence_accumulators(acc[0]);
  h::fence_accumulators(acc[1]);
  // d[4j + e]: row 16w + g + 8(e / 2) of the warpgroup's 64, column 8j + 2t + (e % 2) of its half
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int64_t row = m0 + cw * 64 + w * 16 + lane / 4 + hh * 8;
        const int64_t col = n0 + half * 128 + j * 8 + (lane % 4) * 2;
        if (row >= m_end || col >= p.N) continue;
        float v0 = p.alpha * acc[half][4 * j + 2 * hh], v1 = p.alpha * acc[half][4 * j + 2 * hh + 1];
        __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(static_cast<bf16*>(p.c) + row * p.N + col);
        if (p.accumulate) {
          const float2 old = __bfloat1622float2(*out);
          v0 += old.x, v1 += old.y;
        }
        *out = __floats2bfloat162_rn(v0, v1);
      }
#endif
}

// Above 48 KiB of dynamic shared memory a kernel needs the opt-in, once per kernel.
template <auto Kernel>
void allow_shared_memory(size_t bytes) {
  static const bool done = [bytes] {
    CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    return true;
  }();
  (void)done;
}

template <bool kTransB>
void launch_sm90(const GemmArgs& p, cudaStream_t stream) {
  auto* kernel = grouped_gemm_sm90<kTransB>;
  allow_shared_memory<grouped_gemm_sm90<kTransB>>(kWgSmem);
  const dim3 grid(unsigned((p.M + kWgBM - 1) / kWgBM + p.E), unsigned((p.N + kWgBN - 1) / kWgBN));
  kernel<<<grid, 256, kWgSmem, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

// The TMA form over `n` terms {a [M, K_t], b, K_t} where its maps can describe them (contiguous 16-byte rows,
// aligned, int coordinates); false otherwise. p gives the output, the offsets and N.
struct TermOperands {
  const bf16* a;
  const bf16* b;
  int64_t k;
};
template <bool kTransB>
bool launch_tma(const GemmArgs& p, const TermOperands* ts, int n, cudaStream_t stream) {
  if (n < 1 || n > kTmaTerms || p.N % 8 != 0 || p.M >= (int64_t(1) << 31)) return false;
  TmaTerms terms{};
  terms.n = n;
  for (int t = 0; t < n; ++t) {
    const int64_t k = ts[t].k, rows_b = int64_t(p.E) * (kTransB ? k : p.N), cols_b = kTransB ? p.N : k;
    if (k <= 0 || k % 8 != 0 || rows_b >= (int64_t(1) << 31) || !cuda::aligned16(ts[t].a) || !cuda::aligned16(ts[t].b))
      return false;
    terms.a[t] = cuda::matrix_tile_map(ts[t].a, p.M, k, kTmaBM);
    terms.b[t] = cuda::matrix_tile_map(ts[t].b, rows_b, cols_b, kTransB ? kTmaBK : kTmaBN);
    terms.k[t] = int(k);
    terms.ktiles[t] = int((k + kTmaBK - 1) / kTmaBK);
  }
  allow_shared_memory<grouped_gemm_tma<kTransB>>(kTmaSmem);
  const dim3 grid(unsigned((p.M + kTmaBM - 1) / kTmaBM + p.E), unsigned((p.N + kTmaBN - 1) / kTmaBN));
  grouped_gemm_tma<kTransB><<<grid, 384, kTmaSmem, stream>>>(terms, p);
  CUDA_CHECK_LAUNCH();
  return true;
}

// One GEMM's operands as a single TMA term, where they are contiguous (a's rows K long, each expert's B N·K).
template <bool kTransB>
bool launch_tma(const GemmArgs& p, cudaStream_t stream) {
  if (p.lda != p.K || p.ldb != (kTransB ? p.N : p.K) || p.b_stride != p.N * p.K) return false;
  const TermOperands t{p.a, p.b, p.K};
  return launch_tma<kTransB>(p, &t, 1, stream);
}

template <int BM, int BN, int WM, int WN, bool AK, bool BK_, Group G>
void launch(const GemmArgs& p, dim3 grid, cudaStream_t stream) {
  constexpr size_t bytes = size_t(kStages) * (Tile<BM, AK>::elems + Tile<BN, BK_>::elems) * sizeof(bf16);
  auto* kernel = grouped_gemm<BM, BN, WM, WN, AK, BK_, G>;
  allow_shared_memory<grouped_gemm<BM, BN, WM, WN, AK, BK_, G>>(bytes);
  kernel<<<grid, kThreads, bytes, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

// Rows grouped: tile slots for the worst case (each expert may end in a partial tile); BN by the output's
// width, so the LoRA factors' rank-wide outputs do not pay for a 128-wide tile.
// On sm_90 outputs 128 wide or more go to the warp-specialised TMA kernel where its maps fit the operands (run 78:
// 315-377 TFLOP/s on the A3B's shapes, 1.7-2x the cp.async wgmma form, 2.2-3x mma.sync), else to the cp.async
// wgmma one. SOLTRAIN_GROUPED_GEMM picks another: =wgmma (the cp.async form) or =mma (the mma.sync kernels, which
// serve every other GPU and the narrow LoRA outputs). Read per call: the GPU tests switch it between calls.
enum class Form { Mma, Wgmma, Tma };
Form grouped_form() {
  const char* v = std::getenv("SOLTRAIN_GROUPED_GEMM");
  const std::string f = v ? v : "";
  return f == "mma" ? Form::Mma : f == "wgmma" ? Form::Wgmma : Form::Tma;
}

template <bool BK_>
void launch_rows(const GemmArgs& p, cudaStream_t stream, bool sm90) {
  if (sm90 && p.N >= 128) switch (grouped_form()) {
      case Form::Tma:
        if (launch_tma<!BK_>(p, stream)) return;
        [[fallthrough]];
      case Form::Wgmma: return launch_sm90<!BK_>(p, stream);
      case Form::Mma: break;
    }
  constexpr int BM = 128;
  const auto slots = unsigned((p.M + BM - 1) / BM + p.E);
  auto grid = [&](int bn) { return dim3(slots, unsigned((p.N + bn - 1) / bn)); };
  if (p.N >= 128)
    launch<BM, 128, 4, 2, true, BK_, Group::Rows>(p, grid(128), stream);
  else if (p.N >= 64)
    launch<BM, 64, 4, 2, true, BK_, Group::Rows>(p, grid(64), stream);
  else
    launch<BM, 32, 4, 2, true, BK_, Group::Rows>(p, grid(32), stream);
}

// The LoRA factors' gradients ([R, W] or [W, R] per expert) tile the wide side W by 128, or by 64 with
// SOLTRAIN_NARROW_DW=64 (twice the blocks, each over its expert's rows: a busy expert's blocks finish sooner; the
// narrow operand is re-read from L2). Read per call, as grouped_form(), for the benchmark to compare them.
bool narrow_dw_64() {
  const char* v = std::getenv("SOLTRAIN_NARROW_DW");
  return v && std::string(v) == "64";
}

void launch_reduction(const GemmArgs& p, cudaStream_t stream) {
  auto grid = [&](int bm, int bn) {
    return dim3(unsigned((p.N + bn - 1) / bn), unsigned((p.M + bm - 1) / bm), unsigned(p.E));
  };
  const bool w64 = (p.M < 64 || p.N < 64) && narrow_dw_64();
  if (p.M < 64 && w64)  // a LoRA A's gradient: R rows
    launch<32, 64, 2, 4, false, false, Group::Reduction>(p, grid(32, 64), stream);
  else if (p.M < 64)
    launch<32, 128, 1, 8, false, false, Group::Reduction>(p, grid(32, 128), stream);
  else if (p.N < 64 && w64)  // a LoRA B's gradient: R columns
    launch<64, 32, 4, 2, false, false, Group::Reduction>(p, grid(64, 32), stream);
  else if (p.N < 64)
    launch<128, 32, 4, 2, false, false, Group::Reduction>(p, grid(128, 32), stream);
  else
    launch<128, 128, 4, 2, false, false, Group::Reduction>(p, grid(128, 128), stream);
}

// The kernels move 16-byte chunks: bf16 operands, aligned, with widths (in, out) multiples of 8.
void check_operands(const char* op, std::initializer_list<const Tensor*> ts, int64_t in, int64_t out) {
  for (const Tensor* t : ts)
    SOLTRAIN_CHECK(t->dtype == DType::BF16 && cuda::aligned16(t->data), op, ": bf16 operands, 16-byte aligned");
  SOLTRAIN_CHECK(in % 8 == 0 && out % 8 == 0, op, ": the projections' widths must be multiples of 8, not ", in, " x ",
                 out);
}
}  // namespace

void CudaOps::grouped_linear_forward(Tensor y, const Tensor& x, const Tensor& w, const Tensor& offsets, float alpha,
                                     bool accumulate) {
  const int64_t E = w.dim(0), out = w.dim(1), in = w.dim(2), M = x.dim(0);
  // (the profile tells the LoRA factors' rank-wide products from the experts' own)
  const auto prof = profile(out < 128 ? "grouped_linear_forward_narrow" : "grouped_linear_forward");
  SOLTRAIN_CHECK(offsets.numel() == E + 1 && x.dim(1) == in && y.dim(1) == out && y.dim(0) == M,
                 "grouped_linear_forward shapes");
  check_operands("grouped_linear_forward", {&y, &x, &w}, in, out);
  if (M == 0) return;
  const GemmArgs p{x.as<bf16>(), in, w.as<bf16>(), in, out * in, y.data,    offsets.as<int32_t>(),
                   int(E),       M,  out,          in, alpha,    accumulate};
  launch_rows<true>(p, stream_, sm90_);
}

void CudaOps::grouped_linear_sum(Tensor y, const std::vector<GroupedTerm>& terms, GroupedOrient orient,
                                 const Tensor& offsets, bool accumulate) {
  const int64_t M = y.dim(0), N = y.dim(1), E = terms.empty() ? 0 : terms[0].w.dim(0);
  const bool dx = orient == GroupedOrient::Dx;
  SOLTRAIN_CHECK(offsets.numel() == E + 1, "grouped_linear_sum: offsets for ", E, " experts");
  // One TMA product over the terms' concatenated contraction on sm_90 (the kernel above), else term by term.
  if (sm90_ && N >= 128 && M > 0 && grouped_form() == Form::Tma && int(terms.size()) <= kTmaTerms &&
      y.dtype == DType::BF16 && cuda::aligned16(y.data)) {
    TermOperands ts[kTmaTerms];
    int n = 0;
    bool fits = true;
    for (const GroupedTerm& t : terms) {
      const int64_t k = t.a.dim(1);
      fits = fits && t.a.dtype == DType::BF16 && t.w.dtype == DType::BF16 && t.a.dim(0) == M && t.w.dim(0) == E &&
             t.w.dim(1) == (dx ? k : N) && t.w.dim(2) == (dx ? N : k);
      ts[n++] = {t.a.as<bf16>(), t.w.as<bf16>(), k};
    }
    if (fits) {
      const auto prof = profile(dx ? "grouped_linear_dx" : "grouped_linear_forward");
      const GemmArgs p{nullptr, 0, nullptr, 0, 0, y.data, offsets.as<int32_t>(), int(E), M, N, 0, 1.0f, accumulate};
      if (dx ? launch_tma<true>(p, ts, n, stream_) : launch_tma<false>(p, ts, n, stream_)) return;
    }
  }
  Ops::grouped_linear_sum(y, terms, orient, offsets, accumulate);
}

void CudaOps::grouped_linear_backward(Tensor* dx, bool accumulate_dx, Tensor* dw, const Tensor& dy, const Tensor& x,
                                      const Tensor& w, const Tensor& offsets, float alpha) {
  const int64_t E = w.dim(0), out = w.dim(1), in = w.dim(2), M = dy.dim(0);
  SOLTRAIN_CHECK(offsets.numel() == E + 1 && dy.dim(1) == out && x.dim(1) == in && x.dim(0) == M &&
                     (!dw || (dw->numel() == E * out * in && dw->dtype == DType::F32)) &&
                     (!dx || (dx->dim(0) == M && dx->dim(1) == in)),
                 "grouped_linear_backward shapes");
  check_operands("grouped_linear_backward", {&dy, &x, &w}, in, out);
  if (M == 0) return;
  if (dx) {  // dx[rows_e] = dy[rows_e] · w[e]: w[e] is [out = k][in = n], n-contiguous
    const auto prof = profile(in < 128 ? "grouped_linear_dx_narrow" : "grouped_linear_dx");
    check_operands("grouped_linear_backward", {dx}, in, out);
    const GemmArgs p{dy.as<bf16>(), out, w.as<bf16>(), in,  out * in, dx->data,     offsets.as<int32_t>(),
                     int(E),        M,   in,           out, alpha,    accumulate_dx};
    launch_rows<false>(p, stream_, sm90_);
  }
  if (dw) {  // dw[e] [out, in] += dy_eᵀ · x_e: A = dyᵀ (out-contiguous), B = x (in-contiguous), k = the rows
    const auto prof = profile("grouped_linear_dw");
    SOLTRAIN_CHECK(cuda::aligned16(dw->data), "grouped_linear_backward: dw 16-byte aligned");
    const GemmArgs p{dy.as<bf16>(), out, x.as<bf16>(), in, 0,     dw->data, offsets.as<int32_t>(),
                     int(E),        out, in,           0,  alpha, true};
    launch_reduction(p, stream_);
  }
}

}  // namespace soltrain
