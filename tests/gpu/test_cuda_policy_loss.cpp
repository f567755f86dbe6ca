// The CUDA GRPO policy loss against its CPU twin on fresh random data: more completions than the kernel's threads,
// uncounted tokens inside and after completions, padding completions (scale 0), ratios on both sides of the
// clip, token- and sequence-level weights, the KL term with and without the ratio, and stats accumulated.
#include <cmath>

#include "gpu_test_util.h"

namespace soltrain::test {
namespace {

class CudaPolicyLoss : public CudaTest {};

TEST_F(CudaPolicyLoss, WeightsAndStatsMatchTheCpu) {
  const int D = 300;
  std::vector<int32_t> cu = {0};
  for (int d = 0; d < D; ++d) cu.push_back(cu.back() + 1 + int32_t(rng() % 60));
  const int64_t N = cu.back();
  std::vector<int32_t> targets(static_cast<size_t>(N));
  for (auto& t : targets) t = rng() % 4 == 0 ? -100 : int32_t(rng() % 1000);
  std::uniform_real_distribution<float> u(0.0f, 6.0f), shift(-0.3f, 0.3f);
  std::vector<float> nll(static_cast<size_t>(N)), old(nll.size()), ref(nll.size()), adv = randn(size_t(D)),
                                                                                    scale(static_cast<size_t>(D));
  for (int64_t i = 0; i < N; ++i) {
    nll[size_t(i)] = u(rng);
    old[size_t(i)] = nll[size_t(i)] + shift(rng);
    ref[size_t(i)] = nll[size_t(i)] + shift(rng);
  }
  for (int d = 0; d < D; ++d) scale[size_t(d)] = d % 17 == 5 ? 0.0f : 1.0f / float(1 + rng() % 500);
  std::vector<float> keep(static_cast<size_t>(N));  // a top_entropy_quantile mask (cases 4 and 5)
  for (float& k : keep) k = rng() % 3 == 0 ? 0.0f : 1.0f;
  const Tensor gkeep = upload(keep, {N}, DType::F32);
  const Tensor gnll = upload(nll, {N}, DType::F32), gold = upload(old, {N}, DType::F32);
  const Tensor gref = upload(ref, {N}, DType::F32), gadv = upload(adv, {D}, DType::F32);
  const Tensor gscale = upload(scale, {D}, DType::F32), gcu = upload_i32(cu), gtargets = upload_i32(targets);
  Buffer stats = gpu->alloc(kPolicyStats * sizeof(double));
  const Tensor gstats{stats.data(), DType::F64, {kPolicyStats}, Device::CUDA};
  for (int c = 0; c < 6; ++c) {
    SCOPED_TRACE(c);
    PolicyLossParams p;
    p.epsilon_low = 0.1f;
    p.epsilon_high = 0.15f;
    p.sequence_level = c % 2 == 1;
    p.beta = c >= 2 ? 0.05f : 0.0f;
    p.kl_ratio = c != 4;
    p.delta = c == 5 ? 1.2f : 0.0f;
    const bool with_old = c != 2;
    std::vector<float> want_w(static_cast<size_t>(N));
    std::vector<double> want_s(kPolicyStats), got_s(kPolicyStats);
    for (bool accumulate : {false, true}) {
      Tensor gw = poisoned({N}, DType::F32);
      const bool masked = c >= 4;
      gpu->policy_loss(gw, gstats, gnll, gtargets, with_old ? gold : Tensor{}, gref, masked ? gkeep : Tensor{}, gadv,
                       gscale, gcu, p, accumulate);
      cpu->policy_loss(host(want_w, {N}), Tensor{want_s.data(), DType::F64, {kPolicyStats}}, host(nll, {N}),
                       host_i32(targets), with_old ? host(old, {N}) : Tensor{}, host(ref, {N}),
                       masked ? host(keep, {N}) : Tensor{}, host(adv, {D}), host(scale, {D}), host_i32(cu), p,
                       accumulate);
      EXPECT_TRUE(all_close(download(gw), want_w, 1e-9, 1e-6));
      gpu->copy(Tensor{got_s.data(), DType::F64, {kPolicyStats}, Device::CPU}, gstats);
      for (int k = 0; k < kPolicyStats; ++k)
        EXPECT_NEAR(got_s[size_t(k)], want_s[size_t(k)], 1e-9 * (1 + std::fabs(want_s[size_t(k)]))) << k;
    }
    if (with_old) EXPECT_GT(want_s[kPolicyClipRegion], 0.0);  // the shifts clipped some ratios
  }
}

}  // namespace
}  // namespace soltrain::test
