// The CUDA preference loss and segment_broadcast against their CPU twins on fresh random data: more pairs
// than the kernel's threads (each thread then takes several), documents in no pair (their weight must be 0),
// chosen prompts' segments (ORPO's) on half the pairs, KTO's labels and KL estimate, every loss type, and the
// statistics accumulated across two calls.
#include <algorithm>
#include <numeric>

#include "gpu_test_util.h"

namespace soltrain::test {
namespace {

class CudaPreference : public CudaTest {};

TEST_F(CudaPreference, LossWeightsAndStatsMatchTheCpu) {
  const int P = 300, D = 3 * P + 50;
  std::vector<int32_t> perm(D);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> pairs(kPairFields * P);
  std::uniform_int_distribution<int> len(1, 50);
  for (int i = 0; i < P; ++i) {
    int32_t* f = &pairs[size_t(kPairFields * i)];
    f[0] = perm[size_t(2 * i)];
    f[1] = perm[size_t(2 * i + 1)];
    f[2] = len(rng);
    f[3] = len(rng);
    f[4] = i % 2 == 0 ? perm[size_t(2 * P + i)] : -1;
    f[5] = int32_t(rng() % 3 != 0);  // KTO's label (the other losses ignore it)
  }
  std::uniform_real_distribution<float> u(1.0f, 30.0f);
  std::vector<float> nll(D), ref(D);
  for (int d = 0; d < D; ++d) nll[size_t(d)] = u(rng), ref[size_t(d)] = nll[size_t(d)] + u(rng) - 15.5f;
  const Tensor gnll = upload(nll, {D}, DType::F32), gref = upload(ref, {D}, DType::F32);
  buffers.push_back(gpu->alloc(pairs.size() * 4));
  const Tensor gpairs{buffers.back().data(), DType::I32, {P, kPairFields}, Device::CUDA};
  gpu->copy(gpairs, Tensor{pairs.data(), DType::I32, {P, kPairFields}});
  Buffer stats = gpu->alloc(kPreferenceStats * sizeof(double));
  const Tensor gstats{stats.data(), DType::F64, {kPreferenceStats}, Device::CUDA};
  for (PreferenceLoss l : {PreferenceLoss::Sigmoid, PreferenceLoss::Ipo, PreferenceLoss::Hinge, PreferenceLoss::Simpo,
                           PreferenceLoss::Orpo, PreferenceLoss::Kto}) {
    SCOPED_TRACE(int(l));
    PreferenceParams p;
    p.loss = l;
    p.beta = 0.2f;
    p.label_smoothing = l == PreferenceLoss::Sigmoid || l == PreferenceLoss::Simpo ? 0.1f : 0.0f;
    p.nll_alpha = 0.5f;
    p.simpo_gamma = 0.3f;
    p.desirable_weight = 1.3f;
    p.undesirable_weight = 0.7f;
    p.pair_scale = 1.0f / P;
    p.nll_scale = 1.0f / 1000;
    std::vector<float> want_w(D);
    std::vector<double> want_s(kPreferenceStats);
    std::vector<double> got_s(kPreferenceStats);
    for (bool accumulate : {false, true}) {
      Tensor gw = poisoned({D}, DType::F32);
      gpu->preference_loss(gw, gstats, gnll, gref, gpairs, p, accumulate);
      cpu->preference_loss(host(want_w, {D}), Tensor{want_s.data(), DType::F64, {kPreferenceStats}}, host(nll, {D}),
                           host(ref, {D}), Tensor{pairs.data(), DType::I32, {P, kPairFields}}, p, accumulate);
      EXPECT_TRUE(all_close(download(gw), want_w, 1e-9, 1e-6));
      gpu->copy(Tensor{got_s.data(), DType::F64, {kPreferenceStats}, Device::CPU}, gstats);
      for (int k = 0; k < kPreferenceStats; ++k)
        EXPECT_NEAR(got_s[size_t(k)], want_s[size_t(k)], 1e-9 * (1 + std::fabs(want_s[size_t(k)]))) << k;
    }
    EXPECT_EQ(got_s[kPrefPairs], 2.0 * P);
  }
}

TEST_F(CudaPreference, RewardLossWeightsAndStatsMatchTheCpu) {
  const int P = 200, N = 3 * P + 17;
  std::vector<int32_t> perm(N);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> pairs(perm.begin(), perm.begin() + 2 * P);
  const std::vector<float> scores = randn(size_t(N), 3.0f), margins = randn(size_t(P), 0.5f);
  const Tensor gscores = upload(scores, {N}, DType::F32), gmargins = upload(margins, {P}, DType::F32);
  const Tensor gpairs = upload_i32(pairs).view({P, 2});
  Buffer stats = gpu->alloc(kRewardStats * sizeof(double));
  const Tensor gstats{stats.data(), DType::F64, {kRewardStats}, Device::CUDA};
  for (bool with_margin : {false, true}) {
    RewardParams p{0.05f, 1.0f / P};
    std::vector<float> want_w(N, 0.0f), sc = scores, mg = margins;
    std::vector<double> want_s(kRewardStats), got_s(kRewardStats);
    const Tensor no_margin{nullptr, DType::F32, {0}, Device::CUDA};
    for (bool accumulate : {false, true}) {
      Tensor gw = upload(std::vector<float>(size_t(N), 0.0f), {N}, DType::F32);
      gpu->reward_loss(gw, gstats, gscores, gpairs, with_margin ? gmargins : no_margin, p, accumulate);
      cpu->reward_loss(host(want_w, {N}), Tensor{want_s.data(), DType::F64, {kRewardStats}}, host(sc, {N}),
                       Tensor{pairs.data(), DType::I32, {P, 2}},
                       with_margin ? host(mg, {P}) : Tensor{nullptr, DType::F32, {0}}, p, accumulate);
      EXPECT_TRUE(all_close(download(gw), want_w, 1e-9, 1e-6));
      gpu->copy(Tensor{got_s.data(), DType::F64, {kRewardStats}, Device::CPU}, gstats);
      for (int k = 0; k < kRewardStats; ++k)
        EXPECT_NEAR(got_s[size_t(k)], want_s[size_t(k)], 1e-9 * (1 + std::fabs(want_s[size_t(k)]))) << k;
    }
    EXPECT_EQ(got_s[kRewPairs], 2.0 * P);
  }
}

TEST_F(CudaPreference, SegmentBroadcastSpreadsEachDocumentsValue) {
  const int64_t n = 10000;
  std::vector<int32_t> cu = {0, 1};
  while (cu.back() < n) cu.push_back(std::min<int32_t>(int32_t(n), cu.back() + 1 + int32_t(rng() % 700)));
  const int64_t docs = int64_t(cu.size()) - 1;
  const std::vector<float> x = randn(size_t(docs));
  Tensor out = poisoned({n}, DType::F32);
  gpu->segment_broadcast(out, upload(x, {docs}, DType::F32), upload_i32(cu));
  std::vector<float> want(static_cast<size_t>(n));
  std::vector<float> xs = x;
  cpu->segment_broadcast(host(want, {n}), host(xs, {docs}), host_i32(cu));
  EXPECT_EQ(download(out), want);
}

}  // namespace
}  // namespace soltrain::test
