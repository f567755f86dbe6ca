// LR schedules against values worked out by hand from transformers' formulas (optimization.py).
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "core/error.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "train/mfu.h"
#include "train/schedule.h"

namespace soltrain {
namespace {

TEST(Schedule, LinearWithWarmup) {
  const ScheduleConfig s{ScheduleType::kLinear, 10, 2};
  // warmup k/2, then (10 - k) / 8
  EXPECT_DOUBLE_EQ(lr_factor(s, 0), 0.0);
  EXPECT_DOUBLE_EQ(lr_factor(s, 1), 0.5);
  EXPECT_DOUBLE_EQ(lr_factor(s, 2), 1.0);
  EXPECT_DOUBLE_EQ(lr_factor(s, 3), 7.0 / 8.0);
  EXPECT_DOUBLE_EQ(lr_factor(s, 6), 0.5);
  EXPECT_DOUBLE_EQ(lr_factor(s, 9), 1.0 / 8.0);
  EXPECT_DOUBLE_EQ(lr_factor(s, 10), 0.0);
  EXPECT_DOUBLE_EQ(lr_factor(s, 12), 0.0);  // clamped, never negative
}

TEST(Schedule, CosineWithWarmup) {
  const ScheduleConfig s{ScheduleType::kCosine, 12, 4};
  EXPECT_DOUBLE_EQ(lr_factor(s, 2), 0.5);
  EXPECT_DOUBLE_EQ(lr_factor(s, 4), 1.0);
  // progress (k-4)/8: k=6 → 0.25 → 0.5(1+cos(π/4)); k=8 → 0.5; k=10 → 0.5(1+cos(3π/4))
  EXPECT_NEAR(lr_factor(s, 6), 0.5 * (1 + std::sqrt(0.5)), 1e-15);
  EXPECT_NEAR(lr_factor(s, 8), 0.5, 1e-15);
  EXPECT_NEAR(lr_factor(s, 10), 0.5 * (1 - std::sqrt(0.5)), 1e-15);
  EXPECT_NEAR(lr_factor(s, 12), 0.0, 1e-15);
}

TEST(Schedule, ConstantAndConstantWithWarmup) {
  EXPECT_DOUBLE_EQ(lr_factor({ScheduleType::kConstant, 10, 5}, 0), 1.0);  // HF's "constant" has no warmup
  const ScheduleConfig w{ScheduleType::kConstantWithWarmup, 10, 4};
  EXPECT_DOUBLE_EQ(lr_factor(w, 1), 0.25);
  EXPECT_DOUBLE_EQ(lr_factor(w, 4), 1.0);
  EXPECT_DOUBLE_EQ(lr_factor(w, 9), 1.0);
}

TEST(Schedule, WarmupStableDecay) {
  // 20 steps, warmup 2, decay ceil(20 × 0.25) = 5, stable 13: steps 2..14 at 1, 15..19 cosine down.
  const ScheduleConfig s{ScheduleType::kWsd, 20, 2, 0.25};
  EXPECT_DOUBLE_EQ(lr_factor(s, 1), 0.5);
  EXPECT_DOUBLE_EQ(lr_factor(s, 2), 1.0);
  EXPECT_DOUBLE_EQ(lr_factor(s, 14), 1.0);
  EXPECT_DOUBLE_EQ(lr_factor(s, 15), 1.0);  // progress 0
  EXPECT_NEAR(lr_factor(s, 16), 0.5 * (1 + std::cos(std::numbers::pi * 0.2)), 1e-15);
  EXPECT_NEAR(lr_factor(s, 19), 0.5 * (1 + std::cos(std::numbers::pi * 0.8)), 1e-15);
  EXPECT_DOUBLE_EQ(lr_factor(s, 20), 0.0);
}

TEST(Schedule, WarmupRatioRoundsUpAndNamesParse) {
  EXPECT_EQ(warmup_from_ratio(100, 0.03), 3);
  EXPECT_EQ(warmup_from_ratio(10, 0.05), 1);  // ceil(0.5)
  EXPECT_EQ(parse_schedule_type("cosine"), ScheduleType::kCosine);
  EXPECT_EQ(parse_schedule_type("warmup_stable_decay"), ScheduleType::kWsd);
  EXPECT_THROW(parse_schedule_type("cosine_with_restarts"), UserError);
}

}  // namespace
}  // namespace soltrain

namespace soltrain {
namespace {

// PERFORMANCE.md's FLOP count for Qwen3-0.6B: N = 28 layers x 15,728,640 + 151,936 x 1,024 (the tied LM
// head) = 595,984,384 matmul parameters (the 596,049,920 parameters less the 65,536 of the norms).
TEST(Mfu, FlopsPerTokenFollowThePalmConvention) {
  ModelConfig c;
  c.vocab_size = 151936, c.hidden_size = 1024, c.intermediate_size = 3072, c.num_layers = 28, c.num_heads = 16,
  c.num_kv_heads = 8, c.head_dim = 128;
  const double N = 595984384.0, attention = 12.0 * 28 * 16 * 128 * 2048;
  EXPECT_DOUBLE_EQ(model_flops_per_token(c, 2048, false), 6 * N + attention);
  EXPECT_DOUBLE_EQ(model_flops_per_token(c, 2048, true), 4 * N + attention);
}

TEST(Mfu, MeasuresAPositiveMatmulRateOnTheCpu) {
  auto ops = make_cpu_ops();
  const double t = measure_matmul_tflops(*ops);
  EXPECT_GT(t, 1e-4);  // 2 cores of fp32 BLAS: well above 0.1 GFLOP/s,
  EXPECT_LT(t, 10.0);  // and far below any GPU's rate
}

// Axolotl's cosine_min_lr_ratio (get_cosine_schedule_with_min_lr): (1 - r) * cosine + r after the warmup.
TEST(Schedule, CosineWithAFloor) {
  ScheduleConfig s{ScheduleType::kCosine, 10, 2, 0.1, 0.1};
  EXPECT_DOUBLE_EQ(lr_factor(s, 1), 0.5);                // warmup is unchanged
  EXPECT_DOUBLE_EQ(lr_factor(s, 2), 1.0);                // progress 0
  EXPECT_NEAR(lr_factor(s, 6), 0.9 * 0.5 + 0.1, 1e-15);  // progress 1/2: the cosine at 0.5
  EXPECT_NEAR(lr_factor(s, 10), 0.1, 1e-15);             // the floor at the end
  s.min_lr_ratio = 1.0;                                  // a floor at the base lr: constant after the warmup
  EXPECT_DOUBLE_EQ(lr_factor(s, 7), 1.0);
  s.min_lr_ratio = 0;
  EXPECT_NEAR(lr_factor(s, 10), 0.0, 1e-15);
}

// Axolotl's lr_quadratic_warmup (get_cosine_schedule_with_quadratic_warmup, src/axolotl/utils/schedulers.py): the
// warmup (k / w)², then the plain cosine to 0 (a min_lr_ratio given too is not applied, as Axolotl picks the quadratic
// schedule over its min-lr one); other schedules keep their linear warmup.
TEST(Schedule, CosineWithQuadraticWarmup) {
  ScheduleConfig s{ScheduleType::kCosine, 12, 4, 0.1, 0.0, true};
  EXPECT_DOUBLE_EQ(lr_factor(s, 0), 0.0);
  EXPECT_DOUBLE_EQ(lr_factor(s, 1), 1.0 / 16.0);
  EXPECT_DOUBLE_EQ(lr_factor(s, 2), 0.25);
  EXPECT_DOUBLE_EQ(lr_factor(s, 3), 9.0 / 16.0);
  EXPECT_DOUBLE_EQ(lr_factor(s, 4), 1.0);
  EXPECT_NEAR(lr_factor(s, 6), 0.5 * (1 + std::sqrt(0.5)), 1e-15);  // the cosine as without it
  s.min_lr_ratio = 0.1;
  EXPECT_NEAR(lr_factor(s, 12), 0.0, 1e-15);
  EXPECT_DOUBLE_EQ(lr_factor(s, 2), 0.25);
  s.type = ScheduleType::kLinear;
  EXPECT_DOUBLE_EQ(lr_factor(s, 2), 0.5);
}

}  // namespace
}  // namespace soltrain
