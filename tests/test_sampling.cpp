// Token sampling on the CPU backend (Ops::sample_tokens, kernels/sampling.h): draws follow the distribution
// transformers' processors define (tests/sampling_test_util.h) for each setting, the same seed and step give
// the same tokens, the repetition penalty rewrites the logits and flags what is drawn, and the kept set of the
// host reference (top-p, min-p) on small and large vocabularies.
#include <set>

#include "kernels/ops.h"
#include "sampling_test_util.h"
#include "test_util.h"

namespace soltrain::test {
namespace {

// `rows` draws of one row of logits at `step` by the CPU backend: the logits repeated on every row, row b
// seeded seed + b; `seen` flags the tokens each row already holds.
std::vector<int32_t> draw(const std::vector<float>& logits, const SamplingParams& p, int rows, uint64_t step = 0,
                          const std::vector<int>& seen = {}) {
  const auto ops = make_cpu_ops();
  const int64_t V = int64_t(logits.size());
  std::vector<float> all;
  for (int b = 0; b < rows; ++b) all.insert(all.end(), logits.begin(), logits.end());
  std::vector<uint8_t> flags(p.repetition_penalty != 1 ? size_t(rows * V) : 0, 0);
  for (int b = 0; b < rows && !flags.empty(); ++b)
    for (int id : seen) flags[size_t(b * V + id)] = 1;
  std::vector<int32_t> ids(size_t(rows), -1);
  const Tensor seen_t = flags.empty() ? Tensor{} : Tensor{flags.data(), DType::U8, {rows, V}, Device::CPU};
  ops->sample_tokens(Tensor{ids.data(), DType::I32, {rows}, Device::CPU},
                     Tensor{all.data(), DType::F32, {rows, V}, Device::CPU}, seen_t, p, step);
  return ids;
}

TEST(Sampling, DrawsFollowTheirDistribution) {
  const std::vector<float> logits{1.3f, -0.4f, 2.1f, 0.2f, 0.9f, -1.5f, 1.8f};
  const std::vector<int> seen{2, 5};
  for (const SamplingParams& p :
       {SamplingParams{1.0f, 0, 1.0f, 3}, SamplingParams{0.6f, 0, 1.0f, 4}, SamplingParams{1.4f, 4, 1.0f, 5},
        SamplingParams{0.9f, 0, 0.8f, 6}, SamplingParams{1.2f, 5, 0.9f, 7}, SamplingParams{1.0f, 0, 1.0f, 8, 0.25f},
        SamplingParams{1.1f, 6, 0.95f, 9, 0.1f}, SamplingParams{1.0f, 0, 1.0f, 10, 0, 1.8f},
        SamplingParams{0.8f, 5, 0.9f, 11, 0.05f, 1.3f}}) {
    SCOPED_TRACE(testing::Message() << "T " << p.temperature << " top_k " << p.top_k << " top_p " << p.top_p
                                    << " min_p " << p.min_p << " repetition_penalty " << p.repetition_penalty);
    const auto want = expected_distribution(logits, p, p.repetition_penalty != 1 ? seen : std::vector<int>{});
    expect_draws_follow(draw(logits, p, 40000, 0, seen), want);
  }
}

TEST(Sampling, SeededDrawsRepeatAndTopKOneIsGreedy) {
  std::mt19937 rng(1);
  const auto logits = random_vec(50, rng, 2.0f);
  const SamplingParams p{1.0f, 0, 1.0f, 42};
  const auto a = draw(logits, p, 64), b = draw(logits, p, 64), c = draw(logits, SamplingParams{1.0f, 0, 1.0f, 43}, 64);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, draw(logits, p, 64, 1)) << "another step draws anew";
  // Rows are seeded seed + b: row 1 of seed 42 is row 0 of seed 43.
  EXPECT_EQ(std::vector<int32_t>(a.begin() + 1, a.end()), std::vector<int32_t>(c.begin(), c.end() - 1));
  EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), 5u) << "temperature 1 over 50 logits samples widely";
  for (int32_t id : draw(logits, SamplingParams{1.5f, 1, 1.0f, 7}, 16)) EXPECT_EQ(id, argmax(logits));
  for (int32_t id : draw(logits, SamplingParams{}, 4)) EXPECT_EQ(id, argmax(logits));
}

// Each drawn token's log-probability (what GRPO's importance-sampling correction reads, vLLM's processed_logprobs):
// the log of its probability under transformers' processors for that setting (sampling_test_util.h), and greedy's
// the log softmax of the penalised logits.
TEST(Sampling, DrawnLogProbsAreThoseOfTheDistributionDrawnFrom) {
  const auto ops = make_cpu_ops();
  std::mt19937 rng(3);
  const int64_t V = 40, rows = 64;
  const std::vector<float> row = random_vec(size_t(V), rng, 2.5f);
  const std::vector<int> seen{3, 17, 29};
  for (const SamplingParams& p :
       {SamplingParams{1.0f, 0, 1.0f, 3}, SamplingParams{0.7f, 5, 1.0f, 4}, SamplingParams{1.3f, 0, 0.8f, 5},
        SamplingParams{1.0f, 0, 1.0f, 6, 0.1f}, SamplingParams{0.9f, 8, 0.9f, 7, 0.05f, 1.4f},
        SamplingParams{0, 0, 1.0f, 0, 0, 1.2f}}) {
    SCOPED_TRACE(testing::Message() << "T " << p.temperature << " top_k " << p.top_k << " top_p " << p.top_p
                                    << " min_p " << p.min_p << " repetition_penalty " << p.repetition_penalty);
    const bool penalty = p.repetition_penalty != 1;
    std::vector<float> all;
    std::vector<uint8_t> flags(penalty ? size_t(rows * V) : 0, 0);
    for (int64_t b = 0; b < rows; ++b) {
      all.insert(all.end(), row.begin(), row.end());
      for (int id : seen)
        if (penalty) flags[size_t(b * V + id)] = 1;
    }
    std::vector<int32_t> ids(static_cast<size_t>(rows));
    std::vector<float> logp(static_cast<size_t>(rows), NAN);
    ops->sample_tokens(Tensor{ids.data(), DType::I32, {rows}, Device::CPU},
                       Tensor{all.data(), DType::F32, {rows, V}, Device::CPU},
                       penalty ? Tensor{flags.data(), DType::U8, {rows, V}, Device::CPU} : Tensor{}, p, 2,
                       Tensor{logp.data(), DType::F32, {rows}, Device::CPU});
    SamplingParams q = p;
    if (p.greedy()) q.temperature = 1;  // greedy's: the whole softmax of the (penalised) logits
    const std::vector<double> want = expected_distribution(row, q, penalty ? seen : std::vector<int>{});
    for (int64_t b = 0; b < rows; ++b) {
      ASSERT_GT(want[size_t(ids[size_t(b)])], 0.0) << "drawn outside the kept set";
      EXPECT_NEAR(logp[size_t(b)], std::log(want[size_t(ids[size_t(b)])]), 1e-5) << "row " << b;
    }
  }
}

TEST(Sampling, RepetitionPenaltyRewritesTheLogitsAndFlagsTheDraw) {
  const auto ops = make_cpu_ops();
  std::vector<float> logits{2.0f, -1.0f, 0.5f, 3.0f}, want{2.0f, -1.5f, 0.5f, 2.0f};
  std::vector<uint8_t> seen{0, 1, 0, 1};
  int32_t id = -1;
  SamplingParams p;  // greedy: the penalty still applies, as transformers applies processors before argmax
  p.repetition_penalty = 1.5f;
  ops->sample_tokens(Tensor{&id, DType::I32, {1}, Device::CPU}, Tensor{logits.data(), DType::F32, {1, 4}, Device::CPU},
                     Tensor{seen.data(), DType::U8, {1, 4}, Device::CPU}, p, 0);
  EXPECT_EQ(logits, want);
  EXPECT_EQ(id, 0) << "token 3's 3.0 became 2.0; token 0's 2.0 comes first";
  EXPECT_EQ(seen, (std::vector<uint8_t>{1, 1, 0, 1}));
  std::vector<int32_t> prompt{2, 2, 0, 1};  // two rows of two tokens
  std::vector<uint8_t> flags(8, 0);
  ops->flag_tokens(Tensor{flags.data(), DType::U8, {2, 4}, Device::CPU},
                   Tensor{prompt.data(), DType::I32, {4}, Device::CPU});
  EXPECT_EQ(flags, (std::vector<uint8_t>{0, 0, 1, 0, 1, 1, 0, 0}));
}

TEST(Sampling, KeptSetFollowsTopPAndMinP) {
  const std::vector<float> logits{std::log(0.15f), std::log(0.5f), std::log(0.05f), std::log(0.3f)};
  auto ids = [&](float top_p, int top_k = 0, float min_p = 0) {
    std::vector<int32_t> r;
    double mass = 0;
    for (auto [id, prob] : sampling_candidates(logits, SamplingParams{1.0f, top_k, top_p, 0, min_p})) {
      r.push_back(id);
      mass += prob;
    }
    EXPECT_NEAR(mass, 1.0, 1e-12) << "renormalised";
    return r;
  };
  EXPECT_EQ(ids(0.4f), (std::vector<int32_t>{1}));
  EXPECT_EQ(ids(0.75f), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(ids(0.9f), (std::vector<int32_t>{1, 3, 0}));
  EXPECT_EQ(ids(1.0f), (std::vector<int32_t>{0, 1, 2, 3}));  // no filter: index order
  EXPECT_EQ(ids(1.0f, 2), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(ids(0.6f, 2), (std::vector<int32_t>{1}));           // top-p over the renormalised top-k: 0.625 ≥ 0.6
  EXPECT_EQ(ids(1.0f, 0, 0.5f), (std::vector<int32_t>{1, 3}));  // ≥ 0.5 × 0.5
  EXPECT_EQ(ids(1.0f, 0, 0.29f), (std::vector<int32_t>{1, 3, 0}));
  EXPECT_EQ(ids(0.75f, 0, 0.7f), (std::vector<int32_t>{1}));  // min_p after top_p
  // top-p 0.75 draws only tokens 1 and 3, in proportion 0.5 : 0.3.
  int n1 = 0;
  for (int32_t id : draw(logits, SamplingParams{1.0f, 0, 0.75f, 5}, 20000)) {
    ASSERT_TRUE(id == 1 || id == 3) << id;
    n1 += id == 1;
  }
  EXPECT_NEAR(double(n1) / 20000, 0.625, 0.015);
}

TEST(Sampling, SettingsAreValidated) {
  EXPECT_THROW((SamplingParams{1.0f, 0, 0.0f, 0}.validate()), UserError);
  EXPECT_THROW((SamplingParams{-1.0f, 0, 1.0f, 0}.validate()), UserError);
  EXPECT_THROW((SamplingParams{1.0f, -2, 1.0f, 0}.validate()), UserError);
  EXPECT_THROW((SamplingParams{1.0f, 0, 1.0f, 0, 1.5f}.validate()), UserError);
  EXPECT_THROW((SamplingParams{1.0f, 0, 1.0f, 0, 0, 0.0f}.validate()), UserError);
  EXPECT_NO_THROW((SamplingParams{0.7f, 20, 0.9f, 0, 0.05f, 1.2f}.validate()));
}

TEST(Sampling, TopPOverALargeVocabularyEqualsAFullSort) {
  std::mt19937 rng(4);
  const auto logits = random_vec(5000, rng, 1.5f);
  std::vector<std::pair<double, int32_t>> order;  // (-probability, id): a full sort
  double z = 0;
  for (float l : logits) z += std::exp(double(l));
  for (size_t i = 0; i < logits.size(); ++i) order.push_back({-std::exp(double(logits[i])) / z, int32_t(i)});
  std::sort(order.begin(), order.end());
  for (float top_p : {0.2f, 0.9f, 0.999f}) {
    std::vector<int32_t> want;
    double cum = 0;
    for (auto [neg, id] : order) {
      want.push_back(id);
      if ((cum -= neg) >= double(top_p)) break;
    }
    std::vector<int32_t> got;
    for (auto [id, prob] : sampling_candidates(logits, SamplingParams{1.0f, 0, top_p, 0})) got.push_back(id);
    EXPECT_EQ(got, want) << "top_p " << top_p;
  }
}

}  // namespace
}  // namespace soltrain::test
