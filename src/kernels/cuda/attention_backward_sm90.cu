// CUDA sm_90a: flash attention backward on warpgroup MMA, in one of three forms (AttentionBackward):
// - split (the default, bitwise repeatable like the portable kernels in attention_backward.cu, no float
//   atomics): one kernel owns 128 keys (64 per consumer warpgroup) and accumulates dK, dV over the query
//   tiles of every query head in its GQA group; another owns 128 queries and accumulates dQ over key tiles.
//   Both recompute P from the saved log-sum-exp: seven products where the algorithm needs five.
// - atomic (head dim 128): the dK/dV kernel also computes dQ's share of its keys, dQ += dS K, from a dSᵀ
//   tile the two warpgroups write to shared memory. Each warpgroup stages its half of the item's dQ (fp32)
//   in shared memory and a dQ warp (the copy warpgroup's second) adds the tile into an fp32 accumulator
//   with one bulk reduction (cp.reduce.async.bulk, performed at L2), so the MMA warpgroups never wait on
//   global memory; a last pass scales the sums into dq. Five products, FA3's scheme; not bitwise
//   repeatable (the adds land in any order).
// - ordered: atomic's kernel, with each (query head, query tile)'s adds taken in a fixed order (key block
//   by key block, latest keys first: the launch order, so a block only ever waits for one that started
//   earlier) through a counter per tile that the dQ warp waits on and releases. Bitwise repeatable. It
//   relies on blocks being dispatched in linear-id order (undocumented, as FA3's deterministic mode
//   does); a wait past ~10 s traps.
// Each block is laid out like the forward (attention_forward_sm90.cu): a copy warpgroup streams tiles by
// TMA through a two-stage ring (a third stage measured no faster: bench/NOTES.md run 13),
// and two consumer warpgroups work on them. Score-shaped products (Sᵀ = K Qᵀ, dPᵀ = V dOᵀ, S = Q Kᵀ,
// dP = dO Vᵀ) read both operands from shared memory; gradient products (dV += Pᵀ dO, dK += dSᵀ Q,
// dQ += dS K) take P or dS from registers and the other operand transposed from the same tile (the fused
// dQ reads both from shared memory, transposed). Each product batch is its own wgmma group, so the
// elementwise work on one batch's result runs while the next batch is still on the tensor cores.
#include <cfloat>

#include "kernels/cuda/attention_sm90.cuh"
#include "kernels/cuda/attention_sm90.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/tensor_map.h"

namespace soltrain::cuda {

using namespace attn;
using namespace attn::sm90;

namespace {

constexpr int kThreads = 3 * kWarpgroup;
[[maybe_unused]] constexpr int kConsumerWarps = 8;            // arrivals that release a stage
constexpr int kKeys = 128, kQueryTile = 64, kDkDvStages = 2;  // dK/dV kernel: keys per block, queries per item
// (a third Q/dO stage measured no faster, with the statistics loaded an item ahead: bench/NOTES.md run 55)
constexpr int kQueries = 128, kKeyTile = 128, kDqStages = 2;  // dQ kernel: queries per block, keys per tile

// Shared memory: two resident tiles of kResident rows, then kStages stages of two kStream-row tiles, then
// per-stage statistics (log-sum-exp and delta of kStream queries; dK/dV kernel only), then mbarriers:
// resident full, stage full [kStages], stage free [kStages].
template <int D, int kResident, int kStream, int kStages>
struct BackwardSmem {
  static constexpr int kB = kResident * D, kStage = 2 * kResident * D, kStats = kStage + kStages * 2 * kStream * D;
  static constexpr int kBars = kStats + kStages * 2 * kStream * 2;  // bf16 offsets (stats: 2 fp32 per query)
  static constexpr size_t bytes() { return size_t(kBars) * sizeof(bf16) + (1 + 2 * kStages) * sizeof(uint64_t) + 1024; }
  static_assert(kB > 0 && kStats > kStage);  // (also keeps the host pass from calling them unused)
};

// The dK/dV kernel's: BackwardSmem's, and with dQ fused two dSᵀ tiles (kKeys x kQueryTile, one per item
// parity, so one warpgroup's next store never meets the other's reads) and the item's dQ staged in fp32
// (kQueryTile x D, in accumulator-fragment order: DqTile) before the statistics.
template <int D, bool kFused>
struct DkDvSmem : BackwardSmem<D, kKeys, kQueryTile, kDkDvStages> {
  using Base = BackwardSmem<D, kKeys, kQueryTile, kDkDvStages>;
  static constexpr int kDs = Base::kStats, kDsTile = kKeys * kQueryTile;  // bf16 offsets, 1024-byte aligned
  static constexpr int kDqStage = kDs + 2 * kDsTile;                      // kQueryTile * D fp32
  static constexpr int kStats = Base::kStats + (kFused ? 2 * kDsTile + 2 * kQueryTile * D : 0);
  static constexpr int kBars = Base::kBars + (kStats - Base::kStats);
  static constexpr size_t bytes() {
    return size_t(kBars) * sizeof(bf16) + (1 + 2 * kDkDvStages) * sizeof(uint64_t) + 1024;
  }
  static_assert(kDs * sizeof(bf16) % 1024 == 0 && kDsTile * sizeof(bf16) % 1024 == 0);
};

// The fused forms' fp32 dQ sums: one 64 x 128 tile per (document, query tile, head), 32 KB each, laid out as
// the consumer threads hold it (so staging it is conflict-free 16-byte stores and the bulk reduction one
// contiguous copy): warpgroup cw's 64 columns, then accumulator register quad, then thread, then the quad.
// A document's tiles are numbered start / 64 + tile + doc: distinct across documents whatever their starts,
// and fewer than tokens / 64 + documents + 1; rows past a document's end are padding of its own last tile.
struct DqTile {
  static constexpr int kFloats = kQueryTile * 128, kHalf = kFloats / 2;
  __host__ __device__ static int64_t slot(int start, int q0, int doc) {
    return start / kQueryTile + q0 / kQueryTile + doc;
  }
  __host__ __device__ static int64_t slots(int64_t tokens, int64_t docs) { return tokens / kQueryTile + docs + 1; }
  // Within a tile: where row `row`, even column `col` (and col + 1 next to it) of the 64 x 128 tile lies.
  __host__ __device__ static int offset(int row, int col) {
    const int cw = col / 64, cc = col % 64, j = cc / 8, t = cc % 8 / 2, warp = row / 16, g = row % 8;
    const int e = 2 * (row % 16 / 8), i = 4 * j + e, tid = warp * 32 + g * 4 + t;
    return cw * kHalf + i / 4 * (4 * kWarpgroup) + tid * 4 + i % 4;
  }
};

#ifdef SOLTRAIN_SM90_DEVICE
// The streamed ring's barriers: step i uses stage i % kStages; the n-th use of a stage is phase n.
template <int kStages>
struct Ring {
  uint64_t* bars;  // resident full, then full [kStages], then free [kStages]
  __device__ uint64_t* resident() const { return bars; }
  __device__ uint64_t* full(int i) const { return bars + 1 + i % kStages; }
  __device__ uint64_t* free(int i) const { return bars + 1 + kStages + i % kStages; }
  __device__ void wait_full(int i) const { mbar_wait(full(i), i / kStages % 2); }
  // Before step i refills its stage: the consumers have released step i - kStages.
  __device__ void wait_free(int i) const {
    if (i >= kStages) mbar_wait(free(i), (i / kStages - 1) % 2);
  }
  // Stage-full barriers count `full_arrivals` (the TMA issuer's expect_tx plus any plain arrivals).
  __device__ void init(int full_arrivals) const {
    if (threadIdx.x == 0) {
      mbar_init(resident(), 1);
      for (int s = 0; s < kStages; ++s) {
        mbar_init(full(s), full_arrivals);
        mbar_init(free(s), kConsumerWarps);
      }
      mbar_init_fence();
    }
    __syncthreads();
  }
};

// Issued by one thread: both resident tiles once.
template <class L, int D, int kResident, int kStages>
__device__ __forceinline__ void load_resident(bf16* tiles, const Ring<kStages>& ring, const CUtensorMap* a,
                                              const CUtensorMap* b, int head, int token) {
  mbar_expect_tx(ring.resident(), 2 * kResident * D * sizeof(bf16));
  for (int j = 0; j < D / 64; ++j) {
    tma_load(tiles + j * kResident * 64, a, j * 64, head, token, ring.resident());
    tma_load(tiles + L::kB + j * kResident * 64, b, j * 64, head, token, ring.resident());
  }
}
// Issued by one thread: streamed step i's two tiles into its stage, once the consumers have freed it.
template <class L, int D, int kStream, int kStages>
__device__ __forceinline__ void load_step(bf16* tiles, const Ring<kStages>& ring, const CUtensorMap* a,
                                          const CUtensorMap* b, int i, int head, int token) {
  ring.wait_free(i);
  mbar_expect_tx(ring.full(i), 2 * kStream * D * sizeof(bf16));
  bf16* dst = tiles + L::kStage + i % kStages * 2 * kStream * D;
  for (int j = 0; j < D / 64; ++j) {
    tma_load(dst + j * kStream * 64, a, j * 64, head, token, ring.full(i));
    tma_load(dst + kStream * D + j * kStream * 64, b, j * 64, head, token, ring.full(i));
  }
}

// The two score-shaped products of a step over the head dim, each committed as its own wgmma group (so
// the first can be waited for alone): p = A Bᵀ, ds = A2 B2ᵀ, with A, A2 rows [row0, row0 + 64) of
// kRowsA-row tiles and B, B2 whole kN-row tiles.
template <int D, int kRowsA, int kN>
__device__ __forceinline__ void score_products(float (&p)[kN / 2], float (&ds)[kN / 2], const bf16* a, const bf16* b,
                                               const bf16* a2, const bf16* b2, int row0) {
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) wgmma_ss<kN>(p, k_major<kRowsA>(a, row0, ks), k_major<kN>(b, 0, ks), ks > 0);
  wgmma_commit();
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) wgmma_ss<kN>(ds, k_major<kRowsA>(a2, row0, ks), k_major<kN>(b2, 0, ks), ks > 0);
  wgmma_commit();
}
// A gradient product, committed as one wgmma group: acc += X B, with X (64 x kK, in the accumulator
// layout) rounded to bf16 fragments and B a kK-row tile read transposed.
template <int D, int kK>
__device__ __forceinline__ void gradient_product(float (&acc)[D / 2], float (&x)[kK / 2], const bf16* b) {
  uint32_t frag[kK / 16][4];
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) c_to_a(frag[kk], &x[8 * kk], &x[8 * kk + 4]);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) wgmma_rs<D>(acc, frag[kk], mn_major<kK>(b, kk), 1);
  wgmma_commit();
}
// A warp's 16 rows [row0, row0 + 16) of a dSᵀ tile (kKeys rows x kQueryTile query columns, sw128) from its
// dSᵀ A fragments, by stmatrix: frag[kk][j] is the 8 x 8 block of rows row0 + 8 (j % 2) and queries
// 16 kk + 8 (j / 2) in the mma C layout stmatrix takes, so each kk is one instruction; lane l names row
// l % 8 of block l / 8 (16 bytes: one sw128 chunk), and each block's 8 rows land in 8 distinct chunks.
__device__ __forceinline__ void store_ds_rows(bf16* tile, const uint32_t (&frag)[kQueryTile / 16][4], int row0) {
  const int lane = threadIdx.x % 32, block = lane / 8, r = row0 + 8 * (block % 2) + lane % 8;
  unsigned char* const row = reinterpret_cast<unsigned char*>(tile) + r * 128;
#pragma unroll
  for (int kk = 0; kk < kQueryTile / 16; ++kk) {
    const int chunk = 2 * kk + block / 2;
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                     smem_addr(row + (chunk ^ (r % 8)) * 16)),
                 "r"(frag[kk][0]), "r"(frag[kk][1]), "r"(frag[kk][2]), "r"(frag[kk][3])
                 : "memory");
  }
}
// A dK/dV block's items in order, item i = (query head first_head + i / q_tiles, query tile i % q_tiles), walked
// by counting: a runtime division per item cost ~2% of the kernel's issue slots (Nsight Compute, run 54).
struct ItemWalk {
  int head, q0, k0, last_q0;
  __device__ ItemWalk(int first_head, int k0_, int q_tiles)
      : head(first_head), q0(k0_), k0(k0_), last_q0(k0_ + (q_tiles - 1) * kQueryTile) {}
  __device__ void next() {
    if (q0 == last_q0) {
      q0 = k0;
      ++head;
    } else {
      q0 += kQueryTile;
    }
  }
};
// Spins until *turn == rank; past ~10 s it traps, so a wrong turn fails the launch instead of hanging it.
__device__ __forceinline__ void wait_turn(const int* turn, int rank) {
  for (int spins = 0; load_acquire(turn) != rank; ++spins) {
    __nanosleep(64);
    if (spins > (1 << 24)) __trap();
  }
}
// Named barriers of the dK/dV kernel besides __syncthreads' 0: both consumer warpgroups' dSᵀ rows are stored;
// consumer warpgroup cw's dQ half is staged (kDqStaged + cw); the dQ warp has read the staging tile, so
// warpgroup cw may write it again (kDqFree + cw).
constexpr int kDsStored = 1, kDqStaged = 2, kDqFree = 4;

// The dQ warp of the fused forms: for each item, once both consumer warpgroups have staged their halves,
// lane 0 adds the 32 KB tile into its slot of the fp32 sums with one bulk reduction, then the staging tile
// is freed as soon as the copy engine has read it. Ordered, lane 0 first waits for the tile's turn and
// passes it on once the adds are performed.
template <bool kOrdered>
__device__ __forceinline__ void reduce_dq(const float* stage, float* sums, int* turns, int items, ItemWalk it,
                                          int start, int doc, int k0, int H, int q_tiles_max) {
  const int lane = threadIdx.x % 32;
  for (int cw = 0; cw < 2; ++cw) named_barrier_arrive(kDqFree + cw, kWarpgroup + 32);  // free for item 0
  for (int i = 0; i < items; ++i, it.next()) {
    const int h = it.head, q0 = it.q0;
    named_barrier(kDqStaged, kWarpgroup + 32);
    named_barrier(kDqStaged + 1, kWarpgroup + 32);
    if (lane == 0) {
      int* const turn = turns + (int64_t(doc) * H + h) * q_tiles_max + q0 / kQueryTile;
      if constexpr (kOrdered) {
        wait_turn(turn, q0 / kKeys - k0 / kKeys);
        fence_global_async();  // the previous adder's sums are in place before the copy engine adds to them
      }
      bulk_reduce_add(sums + (DqTile::slot(start, q0, doc) * H + h) * DqTile::kFloats, stage,
                      DqTile::kFloats * sizeof(float));
      if constexpr (kOrdered) {  // the adds performed, then the turn released
        bulk_wait_done();
        fence_global_async();
        __threadfence();
        atomicAdd(turn, 1);
      } else {
        bulk_wait_read();
      }
    }
    __syncwarp();
    if (i + 1 < items)  // (no arrival past the last item: none would wait for it)
      for (int cw = 0; cw < 2; ++cw) named_barrier_arrive(kDqFree + cw, kWarpgroup + 32);
  }
  if (lane == 0) bulk_wait_done();  // the block's last adds performed before it exits
}

template <int R>
__device__ __forceinline__ void fence_fragments(uint32_t (&frag)[R][4]) {
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(frag[i][j])::"memory");
}
#endif

// The (document, KV head, first key) a dK/dV block works on. Two launch orders (blocks start roughly in
// linear-id order):
// - shortest first (ordered always; split at head dim 64, not measured the other way): a 3-D grid (key
//   blocks, KV heads, documents) with the last key block at blockIdx.x = 0. The ordered form's turns depend
//   on it: a tile's adders go latest keys first, so a block only ever waits on one that started earlier
//   (FA3's deterministic order).
// - longest first (atomic's default, and split's at head dim 128: bench/NOTES.md run 62 measured split 1-13%
//   faster this way at every T from 2k to 64k, after run 55's copy-warp fix): a 1-D grid, key blocks
//   ascending (the first see the most queries) with the
//   (document, KV head) pairs fastest, in sections of kSection pairs whose Q and dO stay in L2. A helper's
//   simulation of greedy dispatch on 132 SMs at the benchmark shapes: ~0.98 of the SMs busy against
//   ~0.87 shortest first (FA3's longest-processing-time scheduler does the same).
constexpr int kSection = 8;
struct KeyBlock {
  int doc, kh, k0;
};
#ifdef SOLTRAIN_SM90_DEVICE
template <bool kLongestFirst>
__device__ __forceinline__ KeyBlock key_block(int Hkv, int docs) {
  if constexpr (!kLongestFirst) return {int(blockIdx.z), int(blockIdx.y), int(gridDim.x - 1 - blockIdx.x) * kKeys};
  const int pairs = docs * Hkv, key_blocks = int(gridDim.x) / pairs, span = kSection * key_blocks;
  const int b = int(blockIdx.x), section = b / span, r = b - section * span;
  const int width = min(kSection, pairs - section * kSection), pair = section * kSection + r % width;
  return {pair / Hkv, pair % Hkv, r / width * kKeys};
}
#endif

template <int D, bool kFused, bool kOrdered, bool kLongestFirst>
__global__ void __launch_bounds__(kThreads, 1)
    dkdv_kernel(const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map,
                const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap do_map, bf16* dk,
                bf16* dv, float* dq_sum, int* dq_turn, const float* lse, const float* delta, const int32_t* cu,
                int docs, int64_t N, int H, int Hkv, int q_tiles_max, float scale) {
#ifdef SOLTRAIN_SM90_DEVICE
  static_assert(!kFused || D == 128, "the fused dQ splits head dim 128 between the two warpgroups");
  using L = DkDvSmem<D, kFused>;
  extern __shared__ unsigned char smem_raw[];
  bf16* const tiles = align1024(smem_raw);
  float* const stats = reinterpret_cast<float*>(tiles + L::kStats);  // stage s: lse at 2s, delta at 2s + 1
  const Ring<kDkDvStages> ring{reinterpret_cast<uint64_t*>(tiles + L::kBars)};

  static_assert(!(kOrdered && kLongestFirst), "the ordered form's turns need the shortest-first launch order");
  const KeyBlock kb = key_block<kLongestFirst>(Hkv, docs);
  const int group = H / Hkv, doc = kb.doc, k0 = kb.k0;
  // The KV head is read back from shared memory in the loop (held in a register across it, ptxas spilled in
  // the longest-first order, where it is no longer blockIdx.y); ring.init's barrier orders the write first.
  __shared__ int kh_shared;
  if (threadIdx.x == 0) kh_shared = kb.kh;
  const volatile int& kh = kh_shared;
  const int start = cu[doc], len = cu[doc + 1] - cu[doc];
  if (k0 >= len) return;
  const int q_tiles = (len - k0 + kQueryTile - 1) / kQueryTile;  // causal: query tiles from this key block on
  const int items = group * q_tiles;
  ring.init(32);
  // (after ring.init's barrier: kh is written)
  const ItemWalk first_item(kh * group, k0, q_tiles);

  const int wg = threadIdx.x / kWarpgroup;
  if (wg == 0) {  // warp 0 of the copy warpgroup: lane 0 issues the TMA, every lane copies statistics
    // (24 x 128 + 240 x 256 is exactly the 168 x 384 the block launched with: the dQ warp's loop spills a
    // few loop-invariant words at 24, once per item, against the consumers' 240)
    release_registers<24>();
    if constexpr (kFused)
      if (threadIdx.x / 32 == 1) {  // warp 1: the dQ warp
        reduce_dq<kOrdered>(reinterpret_cast<const float*>(tiles + L::kDqStage), dq_sum, dq_turn, items, first_item,
                            start, doc, k0, H, q_tiles_max);
        return;
      }
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    if (lane == 0) load_resident<L, D, kKeys>(tiles, ring, &k_map, &v_map, kh, start + k0);
    // Each lane's statistics of one item (log-sum-exp and delta of queries lane and lane + 32), loaded from
    // global memory one item ahead, so their latency passes while the loop waits for the next stage (loaded
    // after the wait, the item's loads and stores in a row left the consumers waiting on their stage for
    // ~13% of the kernel: Nsight Compute, run 54).
    static_assert(kQueryTile == 64);
    float v[4];
    auto fetch = [&](const ItemWalk& it) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int c = lane + 32 * j;
        const bool ok = it.q0 + c < len;
        const int64_t at = int64_t(it.head) * N + start + it.q0 + c;
        v[2 * j] = ok ? lse[at] : 0.f;
        v[2 * j + 1] = ok ? delta[at] : 0.f;
      }
    };
    ItemWalk it = first_item;
    fetch(it);
    for (int i = 0; i < items; ++i) {
      // Every lane stores its statistics into the freed stage before it arrives on the stage's full barrier
      // (lane 0 by its expect_tx, in load_step), so each arrival releases that lane's stores to the consumers.
      ring.wait_free(i);
      float* const st = stats + 2 * (i % kDkDvStages) * kQueryTile;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        st[lane + 32 * j] = v[2 * j] * kLog2e;
        st[kQueryTile + lane + 32 * j] = v[2 * j + 1];
      }
      if (lane == 0)
        load_step<L, D, kQueryTile>(tiles, ring, &q_map, &do_map, i, it.head, start + it.q0);
      else
        mbar_arrive(ring.full(i));
      it.next();
      if (i + 1 < items) fetch(it);
    }
    return;
  }
  claim_registers<240>();

  const int cw = wg - 1, tid = threadIdx.x % kWarpgroup, warp = tid / 32, g = tid % 32 / 4, t = tid % 4;
  const bool leader = tid % 32 == 0;
  const float scale_log2 = scale * kLog2e;
  const int wk0 = k0 + cw * 64;  // this warpgroup's first key
  const int key[2] = {wk0 + warp * 16 + g, wk0 + warp * 16 + g + 8};
  const bf16* Ks = tiles;
  const bf16* Vs = tiles + L::kB;

  float dk_acc[D / 2], dv_acc[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk_acc[i] = dv_acc[i] = 0.f;
  float p[kQueryTile / 2], ds[kQueryTile / 2];  // Sᵀ then Pᵀ; dPᵀ then dSᵀ (keys x queries)
  uint32_t ds_frag[kQueryTile / 16][4];         // dSᵀ in bf16: dK's A operand, and (fused) the shared dSᵀ tile
  float dq[32];                                 // fused: this warpgroup's half of the item's dQ (64 x 64)

  // One item is four product batches, each committed as its own wgmma group so that the elementwise work
  // between them overlaps the batch still running (groups complete in order):
  //   [Sᵀ = K Qᵀ] [dPᵀ = V dOᵀ] | wait Sᵀ: Pᵀ | [dV += Pᵀ dO] | wait dPᵀ: dSᵀ | [dK += dSᵀ Q] | wait all
  // Fused, a fifth after both warpgroups have stored their dSᵀ rows: [dQ = dS K] (this warpgroup's 64 of
  // the head dim, over both warpgroups' keys), then its reductions into dq_sum.
  // Overlapping across items instead would keep P and dS live twice over next to 128 accumulator
  // registers (past 240); the two groups also overlap each other.
  mbar_wait(ring.resident(), 0);
  ItemWalk it = first_item;
  for (int i = 0; i < items; ++i, it.next()) {
    const int q0 = it.q0;
    // The upper warpgroup's keys all follow the tile's queries (or the document): it has nothing to add.
    const bool upper_idle = q0 + kQueryTile - 1 < k0 + 64 || k0 + 64 >= len;
    const bool idle = cw == 1 && upper_idle;  // (the lower one always has: k0 <= q0 < len)
    const bf16* Qs = tiles + L::kStage + i % kDkDvStages * 2 * kQueryTile * D;
    const bf16* dOs = Qs + kQueryTile * D;
    const float* lse_s = stats + 2 * (i % kDkDvStages) * kQueryTile;
    const float* delta_s = lse_s + kQueryTile;
    const bool masked = q0 < wk0 + 63 || q0 + kQueryTile > len || wk0 + 64 > len;
    bf16* const ds_tile = tiles + L::kDs + i % 2 * L::kDsTile;

    ring.wait_full(i);  // (idle, waiting first keeps this warpgroup's release in the stage's own phase)
    if (!idle) {
      score_products<D, kKeys, kQueryTile>(p, ds, Ks, Qs, Vs, dOs, cw * 64);
      wgmma_wait<1>();
      fence_accumulators(p);
#pragma unroll
      for (int e = 0; e < kQueryTile / 2; ++e) {
        const int qc = e / 4 * 8 + 2 * t + e % 2;
        p[e] = fast_exp2(fmaf(p[e], scale_log2, -lse_s[qc]));
      }
      // Masking only where the item crosses the diagonal or a document's end (uniform across the warpgroup):
      // most items branch past it (as a select on every item, ptxas computed all 32 conditions ahead of the
      // products' issue, ~6% of the kernel's samples: Nsight Compute, run 54). kr <= query < len holds kr < len.
      if (masked) {
#pragma unroll
        for (int e = 0; e < kQueryTile / 2; ++e) {
          const int query = q0 + e / 4 * 8 + 2 * t + e % 2, kr = key[e / 2 % 2];
          if (!(kr <= query && query < len)) p[e] = 0.f;
        }
      }
      gradient_product<D, kQueryTile>(dv_acc, p, dOs);

      wgmma_wait<1>();
      fence_accumulators(ds);
#pragma unroll
      for (int e = 0; e < kQueryTile / 2; ++e) {
        const int qc = e / 4 * 8 + 2 * t + e % 2;
        ds[e] = p[e] * (ds[e] - delta_s[qc]);
      }
#pragma unroll
      for (int kk = 0; kk < kQueryTile / 16; ++kk) c_to_a(ds_frag[kk], &ds[8 * kk], &ds[8 * kk + 4]);
      if constexpr (kFused) store_ds_rows(ds_tile, ds_frag, cw * 64 + warp * 16);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kQueryTile / 16; ++kk) wgmma_rs<D>(dk_acc, ds_frag[kk], mn_major<kQueryTile>(Qs, kk), 1);
      wgmma_commit();
    }
    if constexpr (kFused) {
      fence_shared_to_async();
      named_barrier(kDsStored, 2 * kWarpgroup);  // both warpgroups' dSᵀ rows are in the tile
      // dQ[:, 64 cw, +64) = dS K over the block's keys (the lower 64 alone when the upper warpgroup idles):
      // dS from the dSᵀ tile and K's column block cw, both read transposed.
      wgmma_fence();
      const bf16* const Kc = Ks + cw * kKeys * 64;
      if (upper_idle) {  // (two unrolled loops: a condition inside one could make ptxas serialise the batch)
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          wgmma_ss_n64<1>(dq, mn_major<kKeys>(ds_tile, kk), mn_major<kKeys>(Kc, kk), kk > 0);
      } else {
#pragma unroll
        for (int kk = 0; kk < kKeys / 16; ++kk)
          wgmma_ss_n64<1>(dq, mn_major<kKeys>(ds_tile, kk), mn_major<kKeys>(Kc, kk), kk > 0);
      }
      wgmma_commit();
    }
    wgmma_wait<0>();
    fence_accumulators(dv_acc);
    fence_accumulators(dk_acc);
    fence_fragments(ds_frag);  // (read by dK's product until here)
    if (leader) mbar_arrive(ring.free(i));
    if constexpr (kFused) {  // this warpgroup's half of the item's dQ to the staging tile, for the dQ warp
      fence_accumulators(dq);
      named_barrier(kDqFree + cw, kWarpgroup + 32);  // the dQ warp has read the previous item's
      float4* const half =
          reinterpret_cast<float4*>(reinterpret_cast<float*>(tiles + L::kDqStage) + cw * DqTile::kHalf);
#pragma unroll
      for (int j = 0; j < 8; ++j)
        half[j * kWarpgroup + tid] = make_float4(dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
      fence_shared_to_async();
      named_barrier_arrive(kDqStaged + cw, kWarpgroup + 32);
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= len) continue;
    const int64_t base = ((int64_t(start) + key[r]) * Hkv + kh) * int64_t(D);
    store_row<D>(dk + base, dk_acc, r, scale);
    store_row<D>(dv + base, dv_acc, r, 1.f);
  }
#endif
}

template <int D>
__global__ void __launch_bounds__(kThreads, 1)
    dq_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap do_map,
              const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map, bf16* dq,
              const float* lse, const float* delta, const int32_t* cu, int64_t N, int H, int Hkv, float scale) {
#ifdef SOLTRAIN_SM90_DEVICE
  using L = BackwardSmem<D, kQueries, kKeyTile, kDqStages>;
  extern __shared__ unsigned char smem_raw[];
  bf16* const tiles = align1024(smem_raw);
  const Ring<kDqStages> ring{reinterpret_cast<uint64_t*>(tiles + L::kBars)};

  const int h = blockIdx.y, kh = h / (H / Hkv), doc = blockIdx.z;
  const int start = cu[doc], len = cu[doc + 1] - cu[doc];
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kQueries;  // late queries see the most keys: start them first
  if (q0 >= len) return;
  const int key_tiles = min(q0 + kQueries, len) / kKeyTile + (min(q0 + kQueries, len) % kKeyTile != 0);
  ring.init(1);

  const int wg = threadIdx.x / kWarpgroup;
  if (wg == 0) {  // the copy warpgroup: one thread issues every TMA
    release_registers<24>();
    if (threadIdx.x == 0) {
      load_resident<L, D, kQueries>(tiles, ring, &q_map, &do_map, h, start + q0);
      for (int i = 0; i < key_tiles; ++i)
        load_step<L, D, kKeyTile>(tiles, ring, &k_map, &v_map, i, kh, start + i * kKeyTile);
    }
    return;
  }
  claim_registers<240>();

  const int cw = wg - 1, tid = threadIdx.x % kWarpgroup, warp = tid / 32, g = tid % 32 / 4, t = tid % 4;
  const bool leader = tid % 32 == 0;
  const float scale_log2 = scale * kLog2e;
  const int wq0 = q0 + cw * 64;
  const int row[2] = {wq0 + warp * 16 + g, wq0 + warp * 16 + g + 8};
  const bf16* Qs = tiles;
  const bf16* dOs = tiles + L::kB;
  float lse2[2], dl[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool ok = row[r] < len;
    lse2[r] = ok ? lse[int64_t(h) * N + start + row[r]] * kLog2e : 0.f;
    dl[r] = ok ? delta[int64_t(h) * N + start + row[r]] : 0.f;
  }

  float acc[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) acc[i] = 0.f;
  float p[kKeyTile / 2], ds[kKeyTile / 2];  // S then P; dP then dS (queries x keys)

  // One key tile is three product batches, each its own wgmma group, with the elementwise work between
  // them overlapping the batch still running (128-key tiles leave no registers to overlap across tiles;
  // the two groups also overlap each other):
  //   [S = Q Kᵀ] [dP = dO Vᵀ] | wait S: P | wait dP: dS | [dQ += dS K] | wait
  mbar_wait(ring.resident(), 0);
  for (int i = 0; i < key_tiles; ++i) {
    if (i * kKeyTile > wq0 + 63) {  // every key follows this group's queries: nothing to add
      ring.wait_full(i);            // (waiting first keeps this arrival in the stage's own phase)
      if (leader) mbar_arrive(ring.free(i));
      continue;
    }
    const bf16* Ks = tiles + L::kStage + i % kDqStages * 2 * kKeyTile * D;
    const bf16* Vs = Ks + kKeyTile * D;
    const int k0 = i * kKeyTile;
    const bool masked = k0 + kKeyTile - 1 > wq0 || k0 + kKeyTile > len || wq0 + 64 > len;

    ring.wait_full(i);
    score_products<D, kQueries, kKeyTile>(p, ds, Qs, Ks, dOs, Vs, cw * 64);

    wgmma_wait<1>();
    fence_accumulators(p);
#pragma unroll
    for (int e = 0; e < kKeyTile / 2; ++e) p[e] = fast_exp2(fmaf(p[e], scale_log2, -lse2[e / 2 % 2]));
    if (masked) {  // (a branch, as in the dK/dV kernel: most tiles skip it)
#pragma unroll
      for (int e = 0; e < kKeyTile / 2; ++e) {
        const int r = e / 2 % 2, kc = k0 + e / 4 * 8 + 2 * t + e % 2;
        if (!(kc <= row[r] && row[r] < len)) p[e] = 0.f;
      }
    }
    wgmma_wait<0>();
    fence_accumulators(ds);
#pragma unroll
    for (int e = 0; e < kKeyTile / 2; ++e) ds[e] = p[e] * (ds[e] - dl[e / 2 % 2]);
    gradient_product<D, kKeyTile>(acc, ds, Ks);
    wgmma_wait<0>();
    fence_accumulators(acc);
    if (leader) mbar_arrive(ring.free(i));
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= len) continue;
    store_row<D>(dq + ((int64_t(start) + row[r]) * H + h) * int64_t(D), acc, r, scale);
  }
#endif
}

// dq = scale * the fused kernels' fp32 sums (DqTile's layout), two adjacent columns of one token and head a
// thread; tokens past the last document get zeros.
__global__ void dq_from_tiles(bf16* dq, const float* sums, const int32_t* cu, int docs, int64_t N, int H, float scale) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // (token, head, column pair)
  if (i >= N * H * 64) return;
  const int col = int(i % 64) * 2, h = int(i / 64 % H);
  const int64_t n = i / 64 / H;
  int lo = 0, hi = docs;  // the document holding token n: the last with cu[doc] <= n
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (cu[mid] <= n ? lo : hi) = mid;
  }
  float2 v = make_float2(0.f, 0.f);
  if (n < cu[docs]) {
    const int start = cu[lo], p = int(n - start);
    const int64_t tile = (DqTile::slot(start, p / kQueryTile * kQueryTile, lo) * H + h) * DqTile::kFloats;
    v = *reinterpret_cast<const float2*>(sums + tile + DqTile::offset(p % kQueryTile, col));
  }
  *reinterpret_cast<uint32_t*>(dq + (n * H + h) * 128 + col) = pack(v.x * scale, v.y * scale);
}

// The fused forms serve head dim 128 (the two warpgroups take 64 columns of dQ each); others run split.
bool fused(AttentionBackward form, const Tensor& q) {
  return form != AttentionBackward::Split && q.dim(2) == 128;
}
int64_t q_tiles_max(const SeqLayout& seq) {
  return (seq.max_seqlen + kQueryTile - 1) / kQueryTile;
}
size_t sums_bytes(const Tensor& q, const SeqLayout& seq) {
  const int64_t tiles = DqTile::slots(q.dim(0), seq.cu_seqlens.numel() - 1) * q.dim(1);
  return size_t(tiles) * DqTile::kFloats * sizeof(float);  // (a multiple of 256)
}

template <int D, bool kFused, bool kOrdered, bool kLongestFirst>
void launch_dkdv(const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                 const Tensor& v, const Tensor& lse, const float* delta, const SeqLayout& seq, float scale,
                 float* dq_sums, int* dq_turns, cudaStream_t s) {
  using L = DkDvSmem<D, kFused>;
  static bool configured = false;
  if (!configured) {
    CUDA_CHECK(cudaFuncSetAttribute(dkdv_kernel<D, kFused, kOrdered, kLongestFirst>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, int(L::bytes())));
    configured = true;
  }
  const int H = int(q.dim(1)), Hkv = int(k.dim(1));
  const unsigned docs = unsigned(seq.cu_seqlens.numel() - 1),
                 key_blocks = unsigned((seq.max_seqlen + kKeys - 1) / kKeys);
  // key_block()'s two launch orders: a 3-D grid shortest first, or one dimension longest first
  const dim3 grid = kLongestFirst ? dim3(key_blocks * unsigned(Hkv) * docs) : dim3(key_blocks, unsigned(Hkv), docs);
  dkdv_kernel<D, kFused, kOrdered, kLongestFirst><<<grid, kThreads, L::bytes(), s>>>(
      head_tile_map(k, kKeys), head_tile_map(v, kKeys), head_tile_map(q, kQueryTile), head_tile_map(dout, kQueryTile),
      dk.as<bf16>(), dv.as<bf16>(), dq_sums, dq_turns, lse.f32(), delta, seq.cu_seqlens.i32(), int(docs), q.dim(0), H,
      Hkv, int(q_tiles_max(seq)), scale);
  CUDA_CHECK_LAUNCH();
}

template <int D>
void launch_split(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                  const Tensor& k, const Tensor& v, const Tensor& lse, const float* delta, const SeqLayout& seq,
                  float scale, bool longest_first, cudaStream_t s) {
  using Dq = BackwardSmem<D, kQueries, kKeyTile, kDqStages>;
  static bool configured = false;
  if (!configured) {
    CUDA_CHECK(cudaFuncSetAttribute(dq_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Dq::bytes())));
    configured = true;
  }
  const int H = int(q.dim(1)), Hkv = int(k.dim(1));
  const int64_t N = q.dim(0);
  const unsigned docs = unsigned(seq.cu_seqlens.numel() - 1);
  if (longest_first)
    launch_dkdv<D, false, false, true>(dk, dv, dout, q, k, v, lse, delta, seq, scale, nullptr, nullptr, s);
  else
    launch_dkdv<D, false, false, false>(dk, dv, dout, q, k, v, lse, delta, seq, scale, nullptr, nullptr, s);
  dq_kernel<D>
      <<<dim3(unsigned((seq.max_seqlen + kQueries - 1) / kQueries), unsigned(H), docs), kThreads, Dq::bytes(), s>>>(
          head_tile_map(q, kQueries), head_tile_map(dout, kQueries), head_tile_map(k, kKeyTile),
          head_tile_map(v, kKeyTile), dq.as<bf16>(), lse.f32(), delta, seq.cu_seqlens.i32(), N, H, Hkv, scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

size_t flash_backward_sm90_scratch(AttentionBackward form, const Tensor& q, const SeqLayout& seq) {
  if (!fused(form, q)) return 0;
  static_assert(DqTile::kFloats == 64 * 128);  // (the tile attention_backward_scratch_bytes counts)
  return attention_backward_scratch_bytes(form, q.dim(0), seq.cu_seqlens.numel() - 1, seq.max_seqlen, q.dim(1),
                                          q.dim(2));
}

void flash_backward_sm90(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                         const Tensor& k, const Tensor& v, const Tensor& lse, const float* delta, const SeqLayout& seq,
                         float scale, AttentionBackward form, LaunchOrder order, void* scratch, cudaStream_t s) {
  // Longest first where asked, and by default at head dim 128 (atomic, and split: run 62); ordered is always
  // shortest first (its turns).
  const bool longest = form != AttentionBackward::Ordered &&
                       (order == LaunchOrder::LongestFirst || (order == LaunchOrder::Default && q.dim(2) == 128));
  if (!fused(form, q)) {
    if (q.dim(2) == 64)
      launch_split<64>(dq, dk, dv, dout, q, k, v, lse, delta, seq, scale, longest, s);
    else
      launch_split<128>(dq, dk, dv, dout, q, k, v, lse, delta, seq, scale, longest, s);
    return;
  }
  float* const sums = static_cast<float*>(scratch);
  int* const turns = reinterpret_cast<int*>(static_cast<unsigned char*>(scratch) + sums_bytes(q, seq));
  // (the kernels' own numbering against the shared formula the scratch was sized and planned by)
  const size_t used = sums_bytes(q, seq) + size_t((seq.cu_seqlens.numel() - 1) * q.dim(1) * q_tiles_max(seq)) * 4;
  if (used > flash_backward_sm90_scratch(form, q, seq))
    throw std::logic_error("attention backward: the dQ sums outgrow attention_backward_scratch_bytes");
  CUDA_CHECK(cudaMemsetAsync(scratch, 0, flash_backward_sm90_scratch(form, q, seq), s));
  if (form == AttentionBackward::Ordered)
    launch_dkdv<128, true, true, false>(dk, dv, dout, q, k, v, lse, delta, seq, scale, sums, turns, s);
  else if (longest)
    launch_dkdv<128, true, false, true>(dk, dv, dout, q, k, v, lse, delta, seq, scale, sums, turns, s);
  else
    launch_dkdv<128, true, false, false>(dk, dv, dout, q, k, v, lse, delta, seq, scale, sums, turns, s);
  const int64_t pairs = q.dim(0) * q.dim(1) * 64;
  dq_from_tiles<<<unsigned((pairs + 255) / 256), 256, 0, s>>>(
      dq.as<bf16>(), sums, seq.cu_seqlens.i32(), int(seq.cu_seqlens.numel() - 1), q.dim(0), int(q.dim(1)), scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace soltrain::cuda
