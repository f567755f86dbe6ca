// CPU GRPO policy loss (kernels/policy_math.h): the reference the CUDA kernel is tested against.
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/policy_math.h"

namespace soltrain {

void CpuOps::policy_loss(Tensor weight, Tensor stats, const Tensor& token_nll, const Tensor& targets,
                         const Tensor& old_nll, const Tensor& ref_nll, const Tensor& keep, const Tensor& doc_advantage,
                         const Tensor& doc_scale, const Tensor& cu_seqlens, const PolicyLossParams& p,
                         bool accumulate) {
  const int64_t D = cu_seqlens.numel() - 1, N = token_nll.numel();
  SOLTRAIN_CHECK(stats.dtype == DType::F64 && stats.numel() == kPolicyStats, "policy_loss: stats shape");
  SOLTRAIN_CHECK(D >= 0 && doc_advantage.numel() == D && doc_scale.numel() == D && weight.numel() == N &&
                     targets.numel() == N && (!old_nll.defined() || old_nll.numel() == N) &&
                     (!keep.defined() || keep.numel() == N) && (p.beta == 0 || ref_nll.numel() == N),
                 "policy_loss: shapes");
  const int32_t* cu = cu_seqlens.i32();
  SOLTRAIN_CHECK(D == 0 || (cu[0] == 0 && cu[D] <= N), "policy_loss: documents past the tokens");
  const float* old = old_nll.defined() ? old_nll.f32() : nullptr;
  const float* ref = p.beta != 0 ? ref_nll.f32() : nullptr;
  PolicyDocument sum;
  double low_min = NAN, high_max = NAN, docs = 0;
  for (int64_t d = 0; d < D; ++d) {
    const double scale = doc_scale.f32()[d];
    const PolicyDocument doc =
        policy_document(p, cu[d], cu[d + 1], token_nll.f32(), targets.i32(), old, ref,
                        keep.defined() ? keep.f32() : nullptr, doc_advantage.f32()[d], scale, weight.f32());
    if (scale == 0) continue;  // padding: its tokens count nothing (their weights are 0 by their targets)
    docs += 1;
    sum.loss += doc.loss;
    sum.kl += doc.kl;
    sum.low += doc.low;
    sum.high += doc.high;
    sum.region += doc.region;
    sum.tokens += doc.tokens;
    if (!std::isnan(doc.low_mean)) low_min = std::isnan(low_min) ? doc.low_mean : std::fmin(low_min, doc.low_mean);
    if (!std::isnan(doc.high_mean))
      high_max = std::isnan(high_max) ? doc.high_mean : std::fmax(high_max, doc.high_mean);
  }
  double v[kPolicyStats];
  policy_stats(p, sum, low_min, high_max, docs, v);
  double* s = stats.as<double>();
  for (int k = 0; k < kPolicyStats; ++k) s[k] = accumulate ? s[k] + v[k] : v[k];
}

}  // namespace soltrain
