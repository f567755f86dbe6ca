// What token sampling must draw, from its definition rather than the code under test: transformers' generate
// processors in its order (GenerationMixin._get_logits_processor: RepetitionPenaltyLogitsProcessor, then the
// Temperature, TopK, TopP and MinP warpers), and a chi-square check of draws against it.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/sampling.h"

namespace soltrain::test {

// The probability of each token (0 outside the kept set) for one row of logits whose row already holds `seen`.
inline std::vector<double> expected_distribution(std::vector<float> logits, const SamplingParams& p,
                                                 const std::vector<int>& seen = {}) {
  for (int id : seen) {
    float& l = logits[size_t(id)];
    l = l < 0 ? l * p.repetition_penalty : l / p.repetition_penalty;
  }
  const size_t V = logits.size();
  const double mx = *std::max_element(logits.begin(), logits.end());
  std::vector<double> pr(V);
  for (size_t i = 0; i < V; ++i) pr[i] = std::exp((double(logits[i]) - mx) / p.temperature);
  std::vector<size_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return pr[a] > pr[b]; });
  size_t keep = p.top_k > 0 ? std::min(V, size_t(p.top_k)) : V;
  double mass = 0;
  for (size_t n = 0; n < keep; ++n) mass += pr[order[n]];
  if (p.top_p < 1) {
    double cum = 0;
    size_t n = 0;
    while (n < keep && cum < double(p.top_p) * mass) cum += pr[order[n++]];
    keep = n;
  }
  const double top = pr[order[0]];
  std::vector<double> want(V, 0.0);
  double kept = 0;
  for (size_t n = 0; n < keep; ++n)
    if (n == 0 || pr[order[n]] >= double(p.min_p) * top) kept += (want[order[n]] = pr[order[n]]);
  for (double& w : want) w /= kept;
  return want;
}

// Draws (token ids) against `want`: no token outside the kept set, and chi-square below its p = 0.001 critical
// value (tokens expected fewer than 5 times pooled into one bin).
inline void expect_draws_follow(const std::vector<int32_t>& draws, const std::vector<double>& want) {
  std::vector<int64_t> got(want.size(), 0);
  for (int32_t id : draws) {
    ASSERT_TRUE(id >= 0 && size_t(id) < want.size()) << id;
    ++got[size_t(id)];
  }
  const double n = double(draws.size());
  double chi2 = 0, pooled_e = 0, pooled_o = 0;
  int bins = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] == 0) {
      EXPECT_EQ(got[i], 0) << "token " << i << " is outside the kept set";
      continue;
    }
    const double e = want[i] * n;
    if (e < 5) {
      pooled_e += e, pooled_o += double(got[i]);
      continue;
    }
    chi2 += (double(got[i]) - e) * (double(got[i]) - e) / e;
    ++bins;
  }
  if (pooled_e > 0) chi2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e, ++bins;
  const int df = bins - 1;
  ASSERT_GE(df, 1);
  // The chi-square critical value at p = 0.001 (Wilson-Hilferty for df > 6).
  const double table[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46};
  const double z = 3.090232;
  const double critical = df <= 6 ? table[df] : df * std::pow(1 - 2.0 / (9 * df) + z * std::sqrt(2.0 / (9 * df)), 3);
  EXPECT_LT(chi2, critical) << df << " degrees of freedom";
}

}  // namespace soltrain::test
