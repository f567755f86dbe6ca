// bf16_stochastic_round: the trained weights kept in bf16 only, each AdamW update computed in fp32 and rounded
// stochastically (kernels/stochastic_round.h, torchao's bf16_stochastic_round). The rounding is unbiased exactly
// (over the 2^16 values of the random bits, the mean of the rounded values is x), an update lands on one of the
// two bf16 neighbours of what the fp32 update computes, updates far below a bf16 ulp still move a weight on
// average (round to nearest would drop them), and the bits depend only on (step, the element's flat offset):
// resident, offloaded and in-backward updates are one, and a run resumes onto its own trajectory. A tiny model
// trained so tracks the fp32-master run.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "kernels/blockwise8.h"
#include "kernels/stochastic_round.h"
#include "update_run_util.h"

namespace soltrain {
namespace {

namespace fs = std::filesystem;

TEST(Bf16StochasticRound, UnbiasedOverEveryRandomValue) {
  const uint32_t seed = test::test_seed(20261207u);
  SCOPED_TRACE(test::seed_message(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int t = 0; t < 200; ++t) {
    const float x = nd(rng) * std::pow(2.0f, float(int(rng() % 40) - 20));
    uint32_t u;
    std::memcpy(&u, &x, 4);
    const uint16_t lo = uint16_t(u >> 16);  // truncation: the neighbour towards zero
    double sum = 0;
    int up = 0;
    for (uint32_t r = 0; r < 65536; ++r) {
      const uint16_t b = bf16_round_stochastic(x, r);
      ASSERT_TRUE(b == lo || b == uint16_t(lo + 1)) << x;
      up += b != lo;
      sum += double(bf16_to_f32(b));
    }
    EXPECT_EQ(up, int(u & 0xffffu)) << x;  // rounds away from zero with probability (distance to lo) / ulp
    EXPECT_NEAR(sum / 65536.0, double(x), 1e-12 * std::fabs(double(x))) << x;
  }
  // exact bf16 values never move; NaN stays NaN, infinities stay
  for (float x : {1.0f, -0.375f, 0.0f}) EXPECT_EQ(bf16_to_f32(bf16_round_stochastic(x, 0xffff)), x);
  EXPECT_TRUE(std::isnan(bf16_to_f32(bf16_round_stochastic(NAN, 0x1234))));
  EXPECT_EQ(bf16_to_f32(bf16_round_stochastic(INFINITY, 0xffff)), INFINITY);
  // the hashed bits are spread: 1/3 of the way between neighbours rounds up about a third of the time
  const float third = 1.0f + 0.0078125f / 3.0f;  // (1 and its upper neighbour 1 + 2^-7)
  int up = 0;
  for (uint64_t i = 0; i < 30000; ++i) up += bf16_round_stochastic(third, stochastic_bits(77, i)) != 0x3f80;
  EXPECT_NEAR(up / 30000.0, 1.0 / 3.0, 0.015);
}

// One AdamW update on a bf16 master: each element is one of the two bf16 neighbours of the fp32 update from the
// same values (fp32 and 8-bit moments), the moments are the fp32 run's, the fp32 compute copy is the rounded value,
// and a slice updated on its own with the seed moved by its offset draws what the whole draws.
TEST(Bf16StochasticRound, UpdateLandsNextToTheFp32Update) {
  const uint32_t seed = test::test_seed(20261208u);
  SCOPED_TRACE(test::seed_message(seed));
  std::mt19937 rng(seed);
  auto ops = make_cpu_ops();
  const int64_t n = 3 * 256 + 77;
  std::vector<uint16_t> wb(static_cast<size_t>(n));
  const std::vector<float> start = test::random_vec(size_t(n), rng, 1.0f), g = test::random_vec(size_t(n), rng, 1e-2f);
  for (int64_t i = 0; i < n; ++i) wb[size_t(i)] = f32_to_bf16(start[size_t(i)]);
  AdamWParams p{1e-2f, 0.9, 0.999, 1e-8f, 0.1f, 3, 1.0f};
  p.sr_seed = stochastic_seed_at(stochastic_step_seed(3), 1000);
  for (const bool eight : {false, true}) {
    SCOPED_TRACE(eight ? "8-bit moments" : "fp32 moments");
    std::vector<float> wf(static_cast<size_t>(n)), mf = test::random_vec(static_cast<size_t>(n), rng, 1e-3f),
                                                   vf(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      wf[size_t(i)] = bf16_to_f32(wb[size_t(i)]), vf[size_t(i)] = 1e-5f * float(i % 7 + 1);
    std::vector<uint16_t> b = wb;
    std::vector<float> copy(size_t(n), NAN);
    std::vector<float> m2 = mf, v2 = vf;
    Tensor master{b.data(), DType::BF16, {n}}, copy_t{copy.data(), DType::F32, {n}};
    std::array<float, 256> maps[2] = {dynamic_quant_map(true), dynamic_quant_map(false)};
    const int64_t blocks = (n + 255) / 256;
    std::vector<uint8_t> codes[2][2];
    std::vector<float> absmax[2][2];
    auto state = [&](int run, int k) {
      codes[run][k].assign(size_t(n), 0);
      absmax[run][k].assign(size_t(blocks), 0);
      return Blockwise8{Tensor{codes[run][k].data(), DType::U8, {n}},
                        Tensor{absmax[run][k].data(), DType::F32, {blocks}}, Tensor{maps[k].data(), DType::F32, {256}}};
    };
    if (eight) {
      const Blockwise8 bm = state(0, 0), bv = state(0, 1), fm = state(1, 0), fv = state(1, 1);
      ops->adamw_8bit(master, Tensor{const_cast<float*>(g.data()), DType::F32, {n}}, bm, bv, p, &copy_t);
      ops->adamw_8bit(Tensor{wf.data(), DType::F32, {n}}, Tensor{const_cast<float*>(g.data()), DType::F32, {n}}, fm, fv,
                      p, nullptr);
      EXPECT_EQ(codes[0][0], codes[1][0]);
      EXPECT_EQ(codes[0][1], codes[1][1]);
    } else {
      ops->adamw(master, Tensor{const_cast<float*>(g.data()), DType::F32, {n}}, Tensor{mf.data(), DType::F32, {n}},
                 Tensor{vf.data(), DType::F32, {n}}, p, &copy_t);
      ops->adamw(Tensor{wf.data(), DType::F32, {n}}, Tensor{const_cast<float*>(g.data()), DType::F32, {n}},
                 Tensor{m2.data(), DType::F32, {n}}, Tensor{v2.data(), DType::F32, {n}}, p, nullptr);
      EXPECT_EQ(mf, m2);
      EXPECT_EQ(vf, v2);
    }
    int moved = 0, up = 0;
    for (int64_t i = 0; i < n; ++i) {
      uint32_t u;
      std::memcpy(&u, &wf[size_t(i)], 4);
      const uint16_t lo = uint16_t(u >> 16);
      const uint16_t got = b[size_t(i)];
      ASSERT_TRUE(got == lo || (got == uint16_t(lo + 1) && (u & 0xffffu)))
          << i << ": " << bf16_to_f32(got) << " for " << wf[size_t(i)];
      EXPECT_EQ(copy[size_t(i)], bf16_to_f32(got)) << i;
      moved += got != wb[size_t(i)];
      up += got != lo;
    }
    EXPECT_GT(moved, n / 4);    // the update moved weights
    EXPECT_GT(up, n / 10);      // and rounded away from zero often,
    EXPECT_LT(up, 9 * n / 10);  // but not always
    // the last 300 elements alone, their seed moved by their offset: the same bits
    if (!eight) {
      std::vector<uint16_t> tail(wb.end() - 300, wb.end());
      std::vector<float> m3 = test::random_vec(300, rng, 0.0f), v3(300, 0.0f);
      std::vector<uint16_t> whole = wb;
      std::vector<float> mw(size_t(n), 0.0f), vw(size_t(n), 0.0f);
      ops->adamw(Tensor{whole.data(), DType::BF16, {n}}, Tensor{const_cast<float*>(g.data()), DType::F32, {n}},
                 Tensor{mw.data(), DType::F32, {n}}, Tensor{vw.data(), DType::F32, {n}}, p, nullptr);
      AdamWParams q = p;
      q.sr_seed = stochastic_seed_at(p.sr_seed, uint64_t(n - 300));
      ops->adamw(Tensor{tail.data(), DType::BF16, {300}},
                 Tensor{const_cast<float*>(g.data()) + (n - 300), DType::F32, {300}},
                 Tensor{m3.data(), DType::F32, {300}}, Tensor{v3.data(), DType::F32, {300}}, q, nullptr);
      EXPECT_TRUE(std::equal(tail.begin(), tail.end(), whole.end() - 300));
    }
  }
}

// Updates of a tenth of a bf16 ulp: round to nearest never moves the weights, stochastic rounding moves them as
// far as the fp32 run on average.
TEST(Bf16StochasticRound, UpdatesBelowAnUlpStillTrain) {
  auto ops = make_cpu_ops();
  const int64_t n = 4096;
  std::vector<uint16_t> b(size_t(n), f32_to_bf16(1.0f));
  std::vector<float> f(size_t(n), 1.0f), m(size_t(n), 0), v(size_t(n), 0), m2 = m, v2 = v, g(size_t(n), 0.5f);
  for (int step = 1; step <= 200; ++step) {
    AdamWParams p{1e-4f, 0.9, 0.999, 1e-8f, 0.0f, step, 1.0f};  // (Adam's step ~ lr: 1/78 of the ulp at 1.0)
    p.sr_seed = stochastic_seed_at(stochastic_step_seed(step), 0);
    ops->adamw(Tensor{b.data(), DType::BF16, {n}}, Tensor{g.data(), DType::F32, {n}}, Tensor{m.data(), DType::F32, {n}},
               Tensor{v.data(), DType::F32, {n}}, p, nullptr);
    ops->adamw(Tensor{f.data(), DType::F32, {n}}, Tensor{g.data(), DType::F32, {n}}, Tensor{m2.data(), DType::F32, {n}},
               Tensor{v2.data(), DType::F32, {n}}, p, nullptr);
  }
  double mean = 0;
  for (uint16_t x : b) mean += double(bf16_to_f32(x));
  mean /= double(n);
  EXPECT_NEAR(f[0], 0.98f, 1e-3f);                          // the fp32 run moved by 200 · lr
  EXPECT_NEAR(mean, double(f[0]), 1e-3);                    // the bf16 weights as far, on average
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f - 1e-4f)), 1.0f);  // (where round to nearest would stay)
}

constexpr const char* kSr = "bf16_stochastic_round: true\n";
using SrRun = test::UpdateRunSetup;

TEST(Bf16StochasticRound, TrainsLikeFp32MastersAndIsOneRunEveryWay) {
  SrRun s;
  s.train("fp32", "");
  const std::string log = s.train("sr", kSr);
  EXPECT_NE(log.find("bf16_stochastic_round: the trained weights are kept in bf16 only"), std::string::npos) << log;
  const std::vector<double> a = s.losses("fp32"), b = s.losses("sr");
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  EXPECT_LT(b.back(), 0.9 * b.front());  // it trains (5.85 -> 5.02 in 8 steps)
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 0.03 * a[i]) << "step " << i + 1;
  EXPECT_NE(a, b);  // (the weights are bf16: not the fp32 run's bits)
  // in backward, with 8-bit moments offloaded, and resumed: the same bits (each element's draw is its own)
  s.train("sr_in_backward", std::string(kSr) + "optimizer_in_backward: true\n");
  EXPECT_EQ(s.losses("sr_in_backward"), b);
  EXPECT_EQ(s.file("sr", "model/model.safetensors"), s.file("sr_in_backward", "model/model.safetensors"));
  const std::string eight = std::string(kSr) + "optimizer: adamw_8bit\n";
  s.train("sr8", eight);
  s.train("sr8_off", eight + "offload_optimizer: true\noptimizer_in_backward: true\n");
  EXPECT_EQ(s.losses("sr8"), s.losses("sr8_off"));
  EXPECT_EQ(s.file("sr8", "model/model.safetensors"), s.file("sr8_off", "model/model.safetensors"));
  EXPECT_NE(s.file("sr8", "model/model.safetensors"), s.file("sr", "model/model.safetensors"));
  s.train("resumed", kSr);
  fs::remove_all(s.t.path / "resumed" / "checkpoint-8");
  fs::remove_all(s.t.path / "resumed" / "model");
  EXPECT_NE(s.train("resumed", kSr, {"resume_from_checkpoint=true"}).find("checkpoint-4 at step 4"), std::string::npos);
  EXPECT_EQ(s.losses("resumed"), b);
  EXPECT_EQ(s.file("sr", "model/model.safetensors"), s.file("resumed", "model/model.safetensors"));
}

TEST(Bf16StochasticRound, RefusedWhereFp32MastersAreAssumed) {
  SrRun s;
  const std::pair<const char*, const char*> cases[] = {
      {"optimizer: muon\n", "bf16_stochastic_round with optimizer: muon is not built yet"},
      {"optimizer: adamw_torch_4bit\n", "with optimizer: adamw_torch_4bit is not built yet"},
      {"offload_master: true\n", "with offload_master"},
      {"zero_stage: 2\ngpus: 2\n", "with zero_stage 2"},
  };
  for (const auto& [extra, expected] : cases) {
    SCOPED_TRACE(extra);
    try {
      load_train_config(s.config("r", std::string(kSr) + extra), {}, TrainMode::kSft);
      ADD_FAILURE() << "accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(fs::exists(s.t.path / "r"));
}

}  // namespace
}  // namespace soltrain
