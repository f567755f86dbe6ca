// CUDA preference loss (DPO, IPO, hinge, SimPO, ORPO, KTO), the reward model's loss and segment_broadcast. The pairs of
// a micro-batch are few (its answer pairs), so one block does the whole loss: each thread takes a fixed stride of pairs
// in order and a fixed tree adds the threads' sums, so the result is the same on every run (no float atomics).
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/preference_math.h"
#include "kernels/reward_math.h"

namespace soltrain {

namespace {

constexpr int kPairThreads = 256;

__global__ void preference_loss_kernel(float* w, double* stats, const float* nll, const float* ref,
                                       const int32_t* pairs, int P, int D, PreferenceParams p, bool accumulate) {
  __shared__ double s[kPairThreads];
  for (int d = threadIdx.x; d < D; d += blockDim.x) w[d] = 0.0f;
  double acc[kPreferenceStats] = {};
  const bool kto = p.loss == PreferenceLoss::Kto;
  double kl = 0;
  if (kto) {  // the call's KL estimate: a mean over the pairs' KL documents, floored at 0 (fixed tree order)
    double part = 0;
    for (int i = threadIdx.x; i < P; i += blockDim.x) {
      const int k = pairs[kPairFields * i + 1];
      part += double(ref[k]) - double(nll[k]);
    }
    s[threadIdx.x] = part;
    __syncthreads();
    for (int half = kPairThreads / 2; half > 0; half >>= 1) {
      if (int(threadIdx.x) < half) s[threadIdx.x] += s[threadIdx.x + half];
      __syncthreads();
    }
    kl = P > 0 && p.kto_kl ? fmax(s[0] / double(P), 0.0) : 0.0;
  }
  __syncthreads();  // a pair's weights are written after every document's zero (and s is read before reuse)
  for (int i = threadIdx.x; i < P; i += blockDim.x) {
    const int32_t* f = pairs + kPairFields * i;
    const int c = f[0], r = f[1], prompt = f[4];
    if (kto) {
      apply_kto(p, kto_example(p, nll[c], ref[c], kl, f[5] != 0), f[5] != 0, c, r, w, acc);
      continue;
    }
    const PairResult q = preference_pair(p, nll[c], nll[r], ref[c], ref[r], f[2], f[3]);
    apply_pair(p, q, nll[c], prompt >= 0 ? nll[prompt] : 0.0, c, r, prompt, w, acc);
  }
  if (kto && threadIdx.x == 0 && P > 0) acc[kPrefKl] = kl, acc[kPrefKlCalls] = 1;
  for (int k = 0; k < kPreferenceStats; ++k) {
    s[threadIdx.x] = acc[k];
    __syncthreads();
    for (int half = kPairThreads / 2; half > 0; half >>= 1) {
      if (int(threadIdx.x) < half) s[threadIdx.x] += s[threadIdx.x + half];
      __syncthreads();
    }
    if (threadIdx.x == 0) stats[k] = accumulate ? stats[k] + s[0] : s[0];
    __syncthreads();  // s is reused by the next statistic
  }
}

// The reward model's pairs: one thread in pair order (a micro-batch holds a few pairs; the min / max and sums then
// equal the CPU's exactly).
__global__ void reward_loss_kernel(float* w, double* stats, const float* r, const int32_t* pairs, const float* margins,
                                   int P, RewardParams p, bool accumulate) {
  double acc[kRewardStats];
  reward_stats_init(acc);
  for (int i = 0; i < P; ++i) {
    const int c = pairs[2 * i], j = pairs[2 * i + 1];
    const double m = margins ? double(margins[i]) : 0.0;
    apply_reward_pair(p, reward_pair(p, r[c], r[j], m), r[c], r[j], c, j, w, acc);
  }
  reward_stats_store(stats, acc, accumulate);
}

// One block per document.
__global__ void segment_broadcast_kernel(float* out, const float* x, const int32_t* cu) {
  const int d = blockIdx.x;
  const float v = x[d];
  for (int i = cu[d] + int(threadIdx.x); i < cu[d + 1]; i += blockDim.x) out[i] = v;
}

}  // namespace

void CudaOps::preference_loss(Tensor doc_weight, Tensor stats, const Tensor& doc_nll, const Tensor& ref_doc_nll,
                              const Tensor& pairs, const PreferenceParams& p, bool accumulate) {
  const auto prof = profile("preference_loss");
  SOLTRAIN_CHECK(stats.dtype == DType::F64 && stats.numel() == kPreferenceStats, "preference_loss: stats shape");
  SOLTRAIN_CHECK(pairs.numel() % kPairFields == 0 && doc_weight.numel() == doc_nll.numel() &&
                     ref_doc_nll.numel() == doc_nll.numel(),
                 "preference_loss: shapes");
  preference_loss_kernel<<<1, kPairThreads, 0, stream_>>>(
      doc_weight.f32(), stats.as<double>(), doc_nll.f32(), ref_doc_nll.f32(), pairs.i32(),
      int(pairs.numel() / kPairFields), int(doc_nll.numel()), p, accumulate);
  CUDA_CHECK_LAUNCH();
}

void CudaOps::reward_loss(Tensor weight, Tensor stats, const Tensor& scores, const Tensor& pairs, const Tensor& margins,
                          const RewardParams& p, bool accumulate) {
  const auto prof = profile("reward_loss");
  SOLTRAIN_CHECK(stats.dtype == DType::F64 && stats.numel() == kRewardStats, "reward_loss: stats shape");
  SOLTRAIN_CHECK(pairs.numel() % 2 == 0 && weight.numel() == scores.numel() &&
                     (margins.numel() == 0 || margins.numel() == pairs.numel() / 2),
                 "reward_loss: shapes");
  reward_loss_kernel<<<1, 1, 0, stream_>>>(weight.f32(), stats.as<double>(), scores.f32(), pairs.i32(),
                                           margins.numel() ? margins.f32() : nullptr, int(pairs.numel() / 2), p,
                                           accumulate);
  CUDA_CHECK_LAUNCH();
}

void CudaOps::segment_broadcast(Tensor out, const Tensor& x, const Tensor& cu_seqlens) {
  const auto prof = profile("segment_broadcast");
  SOLTRAIN_CHECK(x.numel() == cu_seqlens.numel() - 1, "segment_broadcast: ", x.numel(), " values for ",
                 cu_seqlens.numel() - 1, " documents");
  if (x.numel() == 0) return;
  segment_broadcast_kernel<<<unsigned(x.numel()), 256, 0, stream_>>>(out.f32(), x.f32(), cu_seqlens.i32());
  CUDA_CHECK_LAUNCH();
}

}  // namespace soltrain
