// CPU preference loss (DPO, IPO, hinge, SimPO, ORPO, KTO), the reward model's loss and the per-document weights' spread
// onto tokens: the reference the CUDA kernels are tested against.
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/preference_math.h"
#include "kernels/reward_math.h"

namespace soltrain {

void CpuOps::segment_broadcast(Tensor out, const Tensor& x, const Tensor& cu_seqlens) {
  const int32_t* cu = cu_seqlens.i32();
  SOLTRAIN_CHECK(x.numel() == cu_seqlens.numel() - 1, "segment_broadcast: ", x.numel(), " values for ",
                 cu_seqlens.numel() - 1, " documents");
  SOLTRAIN_CHECK(x.numel() == 0 || cu[x.numel()] <= out.numel(), "segment_broadcast: documents past the output");
  for (int64_t d = 0; d < x.numel(); ++d)
    for (int32_t i = cu[d]; i < cu[d + 1]; ++i) out.f32()[i] = x.f32()[d];
}

void CpuOps::preference_loss(Tensor doc_weight, Tensor stats, const Tensor& doc_nll, const Tensor& ref_doc_nll,
                             const Tensor& pairs, const PreferenceParams& p, bool accumulate) {
  SOLTRAIN_CHECK(stats.dtype == DType::F64 && stats.numel() == kPreferenceStats, "preference_loss: stats shape");
  SOLTRAIN_CHECK(pairs.numel() % kPairFields == 0 && doc_weight.numel() == doc_nll.numel() &&
                     ref_doc_nll.numel() == doc_nll.numel(),
                 "preference_loss: shapes");
  const int64_t P = pairs.numel() / kPairFields, D = doc_nll.numel();
  const int32_t* pr = pairs.i32();
  const float *nll = doc_nll.f32(), *ref = ref_doc_nll.f32();
  float* w = doc_weight.f32();
  for (int64_t d = 0; d < D; ++d) w[d] = 0;
  double acc[kPreferenceStats] = {};
  if (p.loss == PreferenceLoss::Kto) {
    // the call's KL estimate first (a mean over its KL documents, floored at 0), then each example
    double kl_sum = 0;
    for (int64_t i = 0; i < P; ++i) {
      const int32_t k = pr[kPairFields * i + 1];
      SOLTRAIN_CHECK(k >= 0 && k < D, "preference_loss: pair ", i, " names document ", k, " of ", D);
      kl_sum += double(ref[k]) - double(nll[k]);
    }
    const double kl = P > 0 && p.kto_kl ? std::fmax(kl_sum / double(P), 0.0) : 0.0;
    for (int64_t i = 0; i < P; ++i) {
      const int32_t* f = pr + kPairFields * i;
      SOLTRAIN_CHECK(f[0] >= 0 && f[0] < D && f[0] != f[1], "preference_loss: pair ", i, " names document ", f[0]);
      const PairResult q = kto_example(p, nll[f[0]], ref[f[0]], kl, f[5] != 0);
      apply_kto(p, q, f[5] != 0, f[0], f[1], w, acc);
    }
    if (P > 0) acc[kPrefKl] = kl, acc[kPrefKlCalls] = 1;
    double* s = stats.as<double>();
    for (int k = 0; k < kPreferenceStats; ++k) s[k] = accumulate ? s[k] + acc[k] : acc[k];
    return;
  }
  for (int64_t i = 0; i < P; ++i) {
    const int32_t* f = pr + kPairFields * i;
    const int32_t c = f[0], r = f[1], prompt = f[4];
    SOLTRAIN_CHECK(
        c >= 0 && c < D && r >= 0 && r < D && c != r && prompt >= -1 && prompt < D && prompt != c && prompt != r,
        "preference_loss: pair ", i, " names documents ", c, ", ", r, ", ", prompt, " of ", D);
    const PairResult q = preference_pair(p, nll[c], nll[r], ref[c], ref[r], f[2], f[3]);
    apply_pair(p, q, nll[c], prompt >= 0 ? nll[prompt] : 0.0, c, r, prompt, w, acc);
  }
  double* s = stats.as<double>();
  for (int k = 0; k < kPreferenceStats; ++k) s[k] = accumulate ? s[k] + acc[k] : acc[k];
}

void CpuOps::reward_loss(Tensor weight, Tensor stats, const Tensor& scores, const Tensor& pairs, const Tensor& margins,
                         const RewardParams& p, bool accumulate) {
  SOLTRAIN_CHECK(stats.dtype == DType::F64 && stats.numel() == kRewardStats, "reward_loss: stats shape");
  SOLTRAIN_CHECK(pairs.numel() % 2 == 0 && weight.numel() == scores.numel() &&
                     (margins.numel() == 0 || margins.numel() == pairs.numel() / 2),
                 "reward_loss: shapes");
  const int64_t P = pairs.numel() / 2, N = scores.numel();
  const int32_t* pr = pairs.i32();
  const float* r = scores.f32();
  double acc[kRewardStats];
  reward_stats_init(acc);
  for (int64_t i = 0; i < P; ++i) {
    const int32_t c = pr[2 * i], j = pr[2 * i + 1];
    SOLTRAIN_CHECK(c >= 0 && c < N && j >= 0 && j < N && c != j, "reward_loss: pair ", i, " names tokens ", c, ", ", j,
                   " of ", N);
    const double m = margins.numel() ? double(margins.f32()[i]) : 0.0;
    apply_reward_pair(p, reward_pair(p, r[c], r[j], m), r[c], r[j], c, j, weight.f32(), acc);
  }
  reward_stats_store(stats.as<double>(), acc, accumulate);
}

}  // namespace soltrain
