// GRPO's policy loss (kernels/policy_math.h) on the device: one block, each thread taking whole completions
// (a micro-batch holds tens of them) and the block reducing their sums in a fixed order, so the result does not
// depend on timing. The per-completion arithmetic is the CPU backend's function.
#include <cmath>

#include "core/error.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/policy_math.h"

namespace soltrain {

namespace {

constexpr int kPolicyThreads = 128;
constexpr int kPolicySums = 7;  // loss, kl, low, high, region, tokens, docs; low_min and high_max apart

__global__ void policy_loss_kernel(float* w, double* stats, const float* nll, const int32_t* targets, const float* old,
                                   const float* ref, const float* keep, const float* adv, const float* scale,
                                   const int32_t* cu, int D, PolicyLossParams p, bool accumulate) {
  __shared__ double s[kPolicyThreads];
  double acc[kPolicySums] = {};
  double low_min = NAN, high_max = NAN;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    const PolicyDocument doc = policy_document(p, cu[d], cu[d + 1], nll, targets, old, ref, keep, adv[d], scale[d], w);
    if (scale[d] == 0) continue;
    acc[0] += doc.loss;
    acc[1] += doc.kl;
    acc[2] += doc.low;
    acc[3] += doc.high;
    acc[4] += doc.region;
    acc[5] += doc.tokens;
    acc[6] += 1;
    if (!isnan(doc.low_mean)) low_min = isnan(low_min) ? doc.low_mean : fmin(low_min, doc.low_mean);
    if (!isnan(doc.high_mean)) high_max = isnan(high_max) ? doc.high_mean : fmax(high_max, doc.high_mean);
  }
  double total[kPolicySums];
  for (int k = 0; k < kPolicySums + 2; ++k) {
    const int op = k < kPolicySums ? 0 : k - kPolicySums + 1;  // 0 sum, 1 min, 2 max
    s[threadIdx.x] = op == 0 ? acc[k] : (op == 1 ? low_min : high_max);
    __syncthreads();
    for (int half = kPolicyThreads / 2; half > 0; half >>= 1) {
      if (int(threadIdx.x) < half) {
        const double a = s[threadIdx.x], b = s[threadIdx.x + half];
        if (op == 0)
          s[threadIdx.x] = a + b;
        else if (isnan(a) || isnan(b))
          s[threadIdx.x] = isnan(a) ? b : a;
        else
          s[threadIdx.x] = op == 1 ? fmin(a, b) : fmax(a, b);
      }
      __syncthreads();
    }
    if (k < kPolicySums)
      total[k] = s[0];
    else if (op == 1)
      low_min = s[0];
    else
      high_max = s[0];
    __syncthreads();  // s is reused by the next value
  }
  if (threadIdx.x != 0) return;
  PolicyDocument sum;
  sum.loss = total[0];
  sum.kl = total[1];
  sum.low = total[2];
  sum.high = total[3];
  sum.region = total[4];
  sum.tokens = total[5];
  double v[kPolicyStats];
  policy_stats(p, sum, low_min, high_max, total[6], v);
  for (int k = 0; k < kPolicyStats; ++k) stats[k] = accumulate ? stats[k] + v[k] : v[k];
}

}  // namespace

void CudaOps::policy_loss(Tensor weight, Tensor stats, const Tensor& token_nll, const Tensor& targets,
                          const Tensor& old_nll, const Tensor& ref_nll, const Tensor& keep, const Tensor& doc_advantage,
                          const Tensor& doc_scale, const Tensor& cu_seqlens, const PolicyLossParams& p,
                          bool accumulate) {
  const auto prof = profile("policy_loss");
  const int64_t D = cu_seqlens.numel() - 1, N = token_nll.numel();
  SOLTRAIN_CHECK(stats.dtype == DType::F64 && stats.numel() == kPolicyStats, "policy_loss: stats shape");
  SOLTRAIN_CHECK(D >= 0 && doc_advantage.numel() == D && doc_scale.numel() == D && weight.numel() == N &&
                     targets.numel() == N && (!old_nll.defined() || old_nll.numel() == N) &&
                     (!keep.defined() || keep.numel() == N) && (p.beta == 0 || ref_nll.numel() == N),
                 "policy_loss: shapes");
  policy_loss_kernel<<<1, kPolicyThreads, 0, stream_>>>(
      weight.f32(), stats.as<double>(), token_nll.f32(), targets.i32(), old_nll.defined() ? old_nll.f32() : nullptr,
      p.beta != 0 ? ref_nll.f32() : nullptr, keep.defined() ? keep.f32() : nullptr, doc_advantage.f32(),
      doc_scale.f32(), cu_seqlens.i32(), int(D), p, accumulate);
  CUDA_CHECK_LAUNCH();
}

}  // namespace soltrain
