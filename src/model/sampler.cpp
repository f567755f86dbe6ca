#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace soltrain {

void SamplingParams::validate() const {
  if (!(temperature >= 0) || !std::isfinite(temperature))
    user_error("--temperature ", temperature, ": expected a number >= 0 (0 = greedy)");
  if (top_k < 0) user_error("--top-k ", top_k, ": expected >= 0 (0 = no limit)");
  if (!(top_p > 0 && top_p <= 1)) user_error("--top-p ", top_p, ": expected a number in (0, 1]");
}

int32_t argmax(std::span<const float> logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

std::vector<std::pair<int32_t, double>> sampling_candidates(std::span<const float> logits, const SamplingParams& p) {
  const size_t V = logits.size();
  SOLTRAIN_CHECK(V > 0 && p.temperature > 0, "sampling needs logits and a temperature > 0");
  // Softmax in double: the tail masses top-p sums over are tiny, and ties must not depend on rounding.
  const double mx = *std::max_element(logits.begin(), logits.end());
  std::vector<std::pair<int32_t, double>> c(V);
  for (size_t i = 0; i < V; ++i) {
    const double e = std::exp((double(logits[i]) - mx) / p.temperature);
    c[i] = {int32_t(i), e};
  }
  // Most likely first; equal probabilities keep index order so the result is deterministic.
  auto more_likely = [](const auto& a, const auto& b) {
    return a.second > b.second || (a.second == b.second && a.first < b.first);
  };
  size_t keep = V;
  if (p.top_k > 0 && size_t(p.top_k) < V) {
    keep = size_t(p.top_k);
    std::partial_sort(c.begin(), c.begin() + ptrdiff_t(keep), c.end(), more_likely);
    c.resize(keep);
  } else if (p.top_p < 1) {
    // A nucleus is usually a handful of a 150k vocabulary: sorting all 151936 candidates took 10.4 ms a token
    // here, nth_element + sorting the kHead most likely (the sorted order's prefix) 1.2 ms. The rest is
    // sorted only when the head does not reach top_p.
    constexpr size_t kHead = 1024;
    const auto mid = c.begin() + ptrdiff_t(std::min(V, kHead));
    if (mid != c.end()) std::nth_element(c.begin(), mid, c.end(), more_likely);
    std::sort(c.begin(), mid, more_likely);
    double head = 0, tail = 0;
    for (auto it = c.begin(); it != c.end(); ++it) (it < mid ? head : tail) += it->second;
    if (head < double(p.top_p) * (head + tail)) std::sort(mid, c.end(), more_likely);
  }
  double kept_mass = 0;
  for (const auto& e : c) kept_mass += e.second;
  if (p.top_p < 1) {  // the smallest prefix whose (renormalised) mass reaches top_p, at least one token
    double cum = 0;
    size_t n = 0;
    while (n < c.size()) {
      cum += c[n++].second / kept_mass;
      if (cum >= double(p.top_p)) break;
    }
    c.resize(n);
    kept_mass = 0;
    for (const auto& e : c) kept_mass += e.second;
  }
  for (auto& e : c) e.second /= kept_mass;
  return c;
}

int32_t Sampler::next(std::span<const float> logits) {
  if (p_.temperature == 0) return argmax(logits);
  const auto c = sampling_candidates(logits, p_);
  // A uniform double in [0, 1) from the top 53 bits: the same stream on every platform, unlike
  // std::uniform_real_distribution whose algorithm is the library's choice.
  const double u = double(rng_() >> 11) * 0x1.0p-53;
  double cum = 0;
  for (const auto& [id, prob] : c) {
    cum += prob;
    if (u < cum) return id;
  }
  return c.back().first;  // u within rounding of 1
}

}  // namespace soltrain
