// CUDA token sampling (kernels/sampling.h), one block per row, a few passes over its logits:
// - the repetition penalty, in place, on the tokens the row's `seen` flags;
// - the largest logit (greedy stops here: its first index);
// - top_k and top_p as thresholds on the logits' order keys, found by radix selection 8 bits a pass (4 passes
//   each): counts for top_k, masses for top_p. A probability is held as an integer, its weight relative to
//   the likeliest token (e^((l − max)/T) ≤ 1) times 2^40, so sums are exact and the result does not depend on
//   the order atomics land in: the same seed gives the same tokens. Ties at a threshold are taken in token
//   order, as the host reference does;
// - min_p as a weight threshold;
// - the draw: each thread sums the kept weights of a contiguous share of the row, a block-wide scan places
//   the uniform, and the one thread whose share holds it walks to the token (token order, as on the host).
// Logits below 2^-40 of the likeliest weigh 0 here and are never drawn (the host reference would draw them
// with that probability).
// Without top_k and top_p (transformers' and TRL's defaults) a row is split over blocks of kSplitChunk tokens
// instead (sample_split): a decode step's few rows would otherwise each stream the whole vocabulary through one SM
// (64 rows of Qwen3's 152k logits: 64 of 132 SMs, 0.15 ms a step). The same integer weights summed in another
// grouping, the same walk in token order: the same tokens as the one-block form, bit for bit.
// SOLTRAIN_SAMPLE_SPLIT=0 keeps the one-block form (its comparison in the GPU tests and the decode benchmark).
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "core/error.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/sampling.h"

namespace soltrain {

namespace {

constexpr int kThreads = 1024;
constexpr double kOne = 1099511627776.0;  // 2^40: the likeliest token's weight

// Larger logit, larger key (IEEE order as unsigned integers).
__device__ __forceinline__ uint32_t order_key(float x) {
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

struct Best {
  float v;
  int i;
};
struct BestOp {  // the larger logit, the smaller index on ties (torch.argmax)
  __device__ Best operator()(const Best& a, const Best& b) const {
    if (a.v > b.v || (a.v == b.v && a.i < b.i)) return a;
    return b;
  }
};

// Which tokens are still in: key above `key`, or equal to it at an index up to `last` (ties in token order).
struct Cut {
  uint32_t key = 0;
  int last = INT_MAX;
  __device__ bool keeps(uint32_t k, int i) const { return k > key || (k == key && i <= last); }
};

struct Row {
  const float* logits;
  int V;
  float max, inv_t;
  Cut top_k, top_p;
  uint64_t min_weight;  // min_p × 2^40
  __device__ uint64_t weight(float l) const { return uint64_t(double(expf((l - max) * inv_t)) * kOne); }
  __device__ bool kept(int i, uint32_t k, float l) const {
    return top_k.keeps(k, i) && top_p.keeps(k, i) && (min_weight == 0 || weight(l) >= min_weight);
  }
};

using Scan = cub::BlockScan<unsigned long long, kThreads>;

// min_p as a floor on the fixed-point weights (0: off).
__device__ __forceinline__ uint64_t min_weight_of(const SamplingParams& p) {
  return p.min_p > 0 ? uint64_t(double(p.min_p) * kOne) : 0;
}
// A row drawn from without top_k / top_p cuts (the split form's): weights at p's temperature, min_p's floor.
__device__ __forceinline__ Row uncut_row(const float* l, int V, float max, const SamplingParams& p) {
  return Row{l, V, max, 1.f / p.temperature, Cut{}, Cut{}, min_weight_of(p)};
}

// log p of the drawn token (logit l) under what it was drawn from: (l − max) / T less the log of the kept weights'
// sum (in units of the likeliest's, 2^40; the likeliest is always kept, so the sum is at least 2^40 and its
// truncated tails cost under V·2^-40 of it). Greedy: T = 1 over the whole row. NaN where the row has no finite
// largest logit.
__device__ __forceinline__ float drawn_logprob(float l, float max, const SamplingParams& p,
                                               unsigned long long kept_total) {
  if (!isfinite(max) || kept_total == 0) return NAN;
  const double t = p.temperature > 0 ? double(p.temperature) : 1.0;
  return float((double(l) - double(max)) / t - log(double(kept_total) / kOne));
}

struct Shared {
  unsigned long long hist[256];
  typename Scan::TempStorage scan;
  typename cub::BlockReduce<Best, kThreads>::TempStorage reduce;
  uint32_t prefix;
  unsigned long long remaining, ties, total;
  int found;
};

// This thread's contiguous share of the row, [begin, end).
__device__ __forceinline__ void share(int V, int& begin, int& end) {
  const int per = (V + kThreads - 1) / kThreads;
  begin = min(V, int(threadIdx.x) * per);
  end = min(V, begin + per);
}

// The index of the n-th (1-based) token in token order for which pred(i, key, logit) holds.
template <class Pred>
__device__ int nth_in_order(Shared& s, const float* l, int V, unsigned long long n, Pred pred) {
  int begin, end;
  share(V, begin, end);
  unsigned long long mine = 0, before = 0;
  for (int i = begin; i < end; ++i) mine += pred(i, order_key(l[i]), l[i]) ? 1 : 0;
  Scan(s.scan).ExclusiveSum(mine, before);
  if (threadIdx.x == 0) s.found = INT_MAX;
  __syncthreads();
  if (before < n && n <= before + mine) {
    unsigned long long c = before;
    for (int i = begin; i < end; ++i)
      if (pred(i, order_key(l[i]), l[i]) && ++c == n) {
        s.found = i;
        break;
      }
  }
  __syncthreads();
  return s.found;
}

// Radix selection over the tokens `in` keeps: the key at which the running total, counted from the largest key
// down, first reaches `target` (counts: weigh = 1; masses: the token's fixed-point weight). Returns the cut that
// keeps exactly what reaches it, ties at the key taken in token order. target 0 means "the whole mass × top_p"
// (`fraction`), known after the first pass.
template <class In, class Weigh>
__device__ Cut radix_cut(Shared& s, const Row& r, unsigned long long target, double fraction, In in, Weigh weigh) {
  const float* l = r.logits;
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    for (int d = threadIdx.x; d < 256; d += kThreads) s.hist[d] = 0;
    __syncthreads();
    const uint32_t prefix = pass ? s.prefix : 0;
    // A model's logits crowd into a few bins (a flat row: nearly all in one), so the lanes of a warp that share a
    // bin first sum their weights (exactly: two 21-bit halves, a weight being at most 2^40) and one of them adds
    // the sum: one shared-memory atomic per bin per warp instead of one per token. Every lane runs the same trips.
    for (int base = 0; base < r.V; base += kThreads) {
      const int i = base + int(threadIdx.x);
      uint32_t bin = 256u;  // none
      unsigned long long w = 0;
      if (i < r.V) {
        const float x = l[i];
        const uint32_t k = order_key(x);
        if ((pass == 0 || (k >> (shift + 8)) == prefix) && in(i, k, x)) {
          bin = (k >> shift) & 255u;
          w = (unsigned long long)weigh(x);
        }
      }
      const unsigned peers = __match_any_sync(0xffffffffu, bin);
      if (bin < 256u) {
        const unsigned lo = __reduce_add_sync(peers, unsigned(w & 0x1fffffull));
        const unsigned hi = __reduce_add_sync(peers, unsigned(w >> 21));
        if (int(threadIdx.x & 31u) == __ffs(peers) - 1)
          atomicAdd(&s.hist[bin], ((unsigned long long)hi << 21) + (unsigned long long)lo);
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      if (pass == 0) {
        unsigned long long total = 0;
        for (int d = 0; d < 256; ++d) total += s.hist[d];
        if (target == 0) {
          target = (unsigned long long)ceil(double(total) * fraction);
          target = target < 1 ? 1 : (target > total ? total : target);
        }
        s.remaining = target;
      }
      unsigned long long above = 0;
      int d = 255;
      for (; d > 0; --d) {
        if (above + s.hist[d] >= s.remaining) break;
        above += s.hist[d];
      }
      s.remaining -= above;
      s.prefix = (prefix << 8) | uint32_t(d);
      s.ties = s.hist[d];  // the last pass: the total at the selected key
    }
    __syncthreads();
  }
  Cut c;
  c.key = s.prefix;
  const unsigned long long w = weigh(key_value(c.key));  // every tie weighs the same
  const unsigned long long need = w ? (s.remaining + w - 1) / w : 0, have = w ? s.ties / w : 0;
  __syncthreads();
  if (need >= 1 && need < have)  // only some of the ties: the need-th in token order is the last kept
    c.last = nth_in_order(s, l, r.V, need, [&](int i, uint32_t k, float x) { return k == c.key && in(i, k, x); });
  return c;
}

__global__ void __launch_bounds__(kThreads)
    sample_kernel(int32_t* ids, float* logits, uint8_t* seen, int V, SamplingParams p, uint64_t step, float* logprobs) {
  __shared__ Shared s;
  const int b = blockIdx.x;
  float* l = logits + int64_t(b) * V;
  uint8_t* flags = seen ? seen + int64_t(b) * V : nullptr;
  if (flags && p.repetition_penalty != 1.f) {
    for (int i = threadIdx.x; i < V; i += kThreads)
      if (flags[i]) l[i] = repetition_penalised(l[i], p.repetition_penalty);
    __syncthreads();
  }
  Best mine{-INFINITY, INT_MAX};
  for (int i = threadIdx.x; i < V; i += kThreads) mine = BestOp()(mine, Best{l[i], i});
  const Best best = cub::BlockReduce<Best, kThreads>(s.reduce).Reduce(mine, BestOp());
  if (threadIdx.x == 0) s.found = best.i == INT_MAX ? 0 : best.i, s.total = 0;
  __syncthreads();
  int pick = s.found;
  const float max = l[pick];
  if (p.temperature > 0 && isfinite(max)) {
    Row r{l, V, max, 1.f / p.temperature, Cut{}, Cut{}, 0};
    if (p.top_k > 0 && p.top_k < V)
      r.top_k = radix_cut(
          s, r, (unsigned long long)p.top_k, 0.0, [](int, uint32_t, float) { return true; },
          [](float) { return 1ull; });
    if (p.top_p < 1.f)
      r.top_p = radix_cut(
          s, r, 0ull, double(p.top_p), [&](int i, uint32_t k, float) { return r.top_k.keeps(k, i); },
          [&](float x) { return (unsigned long long)r.weight(x); });
    r.min_weight = min_weight_of(p);
    // The draw: the first kept token, in token order, where the running weight exceeds u × the kept total.
    int begin, end;
    share(V, begin, end);
    unsigned long long own = 0, before = 0, total = 0;
    for (int i = begin; i < end; ++i)
      if (r.kept(i, order_key(l[i]), l[i])) own += r.weight(l[i]);
    if (threadIdx.x == 0) s.found = pick;  // (nth_in_order may have used it)
    __syncthreads();
    Scan(s.scan).ExclusiveSum(own, before, total);
    const unsigned long long at = (unsigned long long)(sample_uniform(p.seed + uint64_t(b), step) * double(total));
    if (before <= at && at < before + own) {
      unsigned long long cum = before;
      for (int i = begin; i < end; ++i)
        if (r.kept(i, order_key(l[i]), l[i]) && (cum += r.weight(l[i])) > at) {
          s.found = i;
          break;
        }
    }
    __syncthreads();
    pick = s.found;  // (unchanged, the likeliest, if rounding left u·total past every share)
    if (threadIdx.x == 0) s.total = total;
  } else if (logprobs && isfinite(max)) {  // greedy: the kept set is the whole row at temperature 1
    const Row r{l, V, max, 1.f, Cut{}, Cut{}, 0};
    unsigned long long own = 0, before = 0, total = 0;
    for (int i = threadIdx.x; i < V; i += kThreads) own += r.weight(l[i]);
    Scan(s.scan).ExclusiveSum(own, before, total);
    if (threadIdx.x == 0) s.total = total;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    ids[b] = pick;
    if (flags) flags[pick] = 1;
    if (logprobs) logprobs[b] = drawn_logprob(l[pick], max, p, s.total);
  }
}

// The split form: three launches. Each chunk's largest logit (after the repetition penalty, written in place);
// each chunk's kept weight under its row's largest; then a block per row finds the chunk where the uniform lands
// and the token in it.
constexpr int kSplitThreads = 256;
constexpr int kSplitChunk = 8192;
constexpr int kSplitPer = kSplitChunk / kSplitThreads;  // a thread's contiguous share in the draw

struct SplitPart {
  Best best;
  unsigned long long kept;
};

// The row's largest logit (first index on ties) from its chunks' (in chunk order: the same as one block's).
__device__ int split_pick(const SplitPart* parts, int C) {
  Best r = parts[0].best;
  for (int c = 1; c < C; ++c) r = BestOp()(r, parts[c].best);
  return r.i == INT_MAX ? 0 : r.i;
}

__global__ void __launch_bounds__(kSplitThreads)
    split_max_kernel(float* logits, const uint8_t* flags, int V, int C, float penalty, SplitPart* parts) {
  using Reduce = cub::BlockReduce<Best, kSplitThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const int b = blockIdx.y, c = blockIdx.x;
  float* l = logits + int64_t(b) * V;
  const uint8_t* f = flags ? flags + int64_t(b) * V : nullptr;
  const int end = min(V, (c + 1) * kSplitChunk);
  Best mine{-INFINITY, INT_MAX};
  for (int i = c * kSplitChunk + int(threadIdx.x); i < end; i += kSplitThreads) {
    float x = l[i];
    if (f && f[i]) l[i] = x = repetition_penalised(x, penalty);
    mine = BestOp()(mine, Best{x, i});
  }
  const Best best = Reduce(tmp).Reduce(mine, BestOp());
  if (threadIdx.x == 0) parts[int64_t(b) * C + c].best = best;
}

__global__ void __launch_bounds__(kSplitThreads)
    split_weight_kernel(const float* logits, int V, int C, SamplingParams p, SplitPart* parts) {
  using Reduce = cub::BlockReduce<unsigned long long, kSplitThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ float max;
  const int b = blockIdx.y, c = blockIdx.x;
  const float* l = logits + int64_t(b) * V;
  SplitPart* row = parts + int64_t(b) * C;
  if (threadIdx.x == 0) max = l[split_pick(row, C)];
  __syncthreads();
  // (the draw's weights, computed as the draw and the one-block form compute them)
  const Row r = uncut_row(l, V, max, p);
  const int end = min(V, (c + 1) * kSplitChunk);
  unsigned long long own = 0;
  if (isfinite(max))
    for (int i = c * kSplitChunk + int(threadIdx.x); i < end; i += kSplitThreads)
      if (r.kept(i, order_key(l[i]), l[i])) own += r.weight(l[i]);
  const unsigned long long kept = Reduce(tmp).Sum(own);
  if (threadIdx.x == 0) row[c].kept = kept;
}

__global__ void __launch_bounds__(kSplitThreads)
    split_draw_kernel(int32_t* ids, const float* logits, uint8_t* seen, int V, int C, SamplingParams p, uint64_t step,
                      const SplitPart* parts, float* logprobs) {
  using SplitScan = cub::BlockScan<unsigned long long, kSplitThreads>;
  __shared__ typename SplitScan::TempStorage scan;
  __shared__ int found, chunk;
  __shared__ float max;
  __shared__ unsigned long long at, chunk_before, total;
  const int b = blockIdx.x;
  const float* l = logits + int64_t(b) * V;
  const SplitPart* row = parts + int64_t(b) * C;
  if (threadIdx.x == 0) {
    found = split_pick(row, C);
    max = l[found];
    chunk = -1;
    total = 0;
    if (isfinite(max) && (p.temperature > 0 || logprobs))
      for (int c = 0; c < C; ++c) total += row[c].kept;
    if (p.temperature > 0 && isfinite(max)) {
      at = (unsigned long long)(sample_uniform(p.seed + uint64_t(b), step) * double(total));
      unsigned long long before = 0;
      for (int c = 0; c < C && chunk < 0; before += row[c].kept, ++c)
        if (at < before + row[c].kept) chunk = c, chunk_before = before;
    }
  }
  __syncthreads();
  if (chunk >= 0) {  // (none: greedy, or rounding left u·total past every token: the likeliest, as one block does)
    const Row r = uncut_row(l, V, max, p);
    const int begin = min(V, chunk * kSplitChunk + int(threadIdx.x) * kSplitPer), end = min(V, begin + kSplitPer);
    unsigned long long own = 0, before = 0;
    for (int i = begin; i < end; ++i)
      if (r.kept(i, order_key(l[i]), l[i])) own += r.weight(l[i]);
    SplitScan(scan).ExclusiveSum(own, before);
    before += chunk_before;
    if (before <= at && at < before + own) {
      unsigned long long cum = before;
      for (int i = begin; i < end; ++i)
        if (r.kept(i, order_key(l[i]), l[i]) && (cum += r.weight(l[i])) > at) {
          found = i;
          break;
        }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    ids[b] = found;
    if (seen) seen[int64_t(b) * V + found] = 1;
    if (logprobs) logprobs[b] = drawn_logprob(l[found], max, p, total);
  }
}

__global__ void flag_kernel(uint8_t* seen, const int32_t* ids, int64_t N, int T, int64_t V) {
  for (int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; n < N; n += int64_t(gridDim.x) * blockDim.x)
    seen[(n / T) * V + ids[n]] = 1;
}

}  // namespace

void CudaOps::sample_tokens(Tensor ids, Tensor logits, Tensor seen, const SamplingParams& p, uint64_t step,
                            Tensor logprobs) {
  const auto prof = profile("sample_tokens");
  const int64_t B = logits.dim(0), V = logits.dim(1);
  SOLTRAIN_CHECK(logits.dtype == DType::F32 && ids.numel() == B && V > 0 && V < INT_MAX &&
                     (!seen.defined() || (seen.dtype == DType::U8 && seen.numel() == B * V)) &&
                     (!logprobs.defined() || (logprobs.dtype == DType::F32 && logprobs.numel() == B)),
                 "sample_tokens: shapes");
  if (B == 0) return;
  const bool cuts = (p.top_k > 0 && p.top_k < V) || p.top_p < 1.f;
  const char* split_env = std::getenv("SOLTRAIN_SAMPLE_SPLIT");
  if (!cuts && !(split_env && std::strcmp(split_env, "0") == 0)) {
    const int C = int((V + kSplitChunk - 1) / kSplitChunk);
    SOLTRAIN_CHECK(B <= 65535, "sample_tokens: at most 65535 rows");
    auto* parts = static_cast<SplitPart*>(scratch(size_t(B) * size_t(C) * sizeof(SplitPart)));
    uint8_t* flags = seen.defined() ? seen.as<uint8_t>() : nullptr;
    const dim3 grid{unsigned(C), unsigned(B)};
    split_max_kernel<<<grid, kSplitThreads, 0, stream_>>>(logits.f32(), p.repetition_penalty != 1.f ? flags : nullptr,
                                                          int(V), C, p.repetition_penalty, parts);
    CUDA_CHECK_LAUNCH();
    float* lp = logprobs.defined() ? logprobs.f32() : nullptr;
    if (p.temperature > 0 || lp) {
      SamplingParams w = p;  // greedy's log-probs: the weights of the whole row at temperature 1
      if (p.greedy()) w.temperature = 1, w.min_p = 0;
      split_weight_kernel<<<grid, kSplitThreads, 0, stream_>>>(logits.f32(), int(V), C, w, parts);
      CUDA_CHECK_LAUNCH();
    }
    split_draw_kernel<<<unsigned(B), kSplitThreads, 0, stream_>>>(ids.i32(), logits.f32(), flags, int(V), C, p, step,
                                                                  parts, lp);
    CUDA_CHECK_LAUNCH();
    return;
  }
  sample_kernel<<<unsigned(B), kThreads, 0, stream_>>>(ids.i32(), logits.f32(),
                                                       seen.defined() ? seen.as<uint8_t>() : nullptr, int(V), p, step,
                                                       logprobs.defined() ? logprobs.f32() : nullptr);
  CUDA_CHECK_LAUNCH();
}

void CudaOps::flag_tokens(Tensor seen, const Tensor& ids) {
  const int64_t B = seen.dim(0), V = seen.dim(1), N = ids.numel();
  SOLTRAIN_CHECK(seen.dtype == DType::U8 && B > 0 && N % B == 0, "flag_tokens: shapes");
  if (N == 0) return;
  flag_kernel<<<cuda::blocks_for(N, 256), 256, 0, stream_>>>(seen.as<uint8_t>(), ids.i32(), N, int(N / B), V);
  CUDA_CHECK_LAUNCH();
}

}  // namespace soltrain
