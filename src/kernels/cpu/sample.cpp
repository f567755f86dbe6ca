// Token sampling on the host (kernels/sampling.h): the double-precision reference of the kept set, and the CPU
// backend's sample_tokens, which the CUDA kernel is tested against.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/sampling.h"

namespace soltrain {

void SamplingParams::validate() const {
  if (!(temperature >= 0) || !std::isfinite(temperature))
    user_error("--temperature ", temperature, ": expected a number >= 0 (0 = greedy)");
  if (top_k < 0) user_error("--top-k ", top_k, ": expected >= 0 (0 = no limit)");
  if (!(top_p > 0 && top_p <= 1)) user_error("--top-p ", top_p, ": expected a number in (0, 1]");
  if (!(min_p >= 0 && min_p <= 1)) user_error("--min-p ", min_p, ": expected a number in [0, 1] (0 = off)");
  if (!(repetition_penalty > 0) || !std::isfinite(repetition_penalty))
    user_error("--repetition-penalty ", repetition_penalty, ": expected a number > 0 (1 = off)");
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
  } else if (p.top_p < 1 || p.min_p > 0) {
    // A nucleus is usually a handful of a 150k vocabulary: sorting all 151936 candidates took 10.4 ms a token
    // here, nth_element + sorting the kHead most likely (the sorted order's prefix) 1.2 ms. The rest is
    // sorted only when the head does not reach top_p.
    constexpr size_t kHead = 1024;
    const auto mid = c.begin() + ptrdiff_t(std::min(V, kHead));
    if (mid != c.end()) std::nth_element(c.begin(), mid, c.end(), more_likely);
    std::sort(c.begin(), mid, more_likely);
    double head = 0, tail = 0;
    for (auto it = c.begin(); it != c.end(); ++it) (it < mid ? head : tail) += it->second;
    if (head < double(p.top_p) * (head + tail) || p.min_p > 0) std::sort(mid, c.end(), more_likely);
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
  }
  if (p.min_p > 0) {  // the likeliest token's weight is e^0 = 1: keep those of at least min_p (and the first)
    size_t n = 1;
    while (n < c.size() && c[n].second >= double(p.min_p)) ++n;
    c.resize(n);
  }
  kept_mass = 0;
  for (const auto& e : c) kept_mass += e.second;
  for (auto& e : c) e.second /= kept_mass;
  return c;
}

int32_t pick_in_token_order(std::vector<std::pair<int32_t, double>> c, double u) {
  SOLTRAIN_CHECK(!c.empty(), "pick_in_token_order: nothing kept");
  std::sort(c.begin(), c.end());
  double total = 0;
  for (const auto& e : c) total += e.second;
  double cum = 0;
  for (const auto& [id, prob] : c) {
    cum += prob;
    if (cum > u * total) return id;
  }
  return c.back().first;  // u within rounding of 1
}

// log softmax(logits)[id], in double.
double log_softmax_at(std::span<const float> logits, int32_t id) {
  const double mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(double(l) - mx);
  return double(logits[size_t(id)]) - mx - std::log(sum);
}

void CpuOps::sample_tokens(Tensor ids, Tensor logits, Tensor seen, const SamplingParams& p, uint64_t step,
                           Tensor logprobs) {
  const int64_t B = logits.dim(0), V = logits.dim(1);
  SOLTRAIN_CHECK(ids.numel() == B && (!seen.defined() || (seen.dtype == DType::U8 && seen.numel() == B * V)) &&
                     (!logprobs.defined() || (logprobs.dtype == DType::F32 && logprobs.numel() == B)),
                 "sample_tokens: shapes");
  const bool penalise = p.repetition_penalty != 1 && seen.defined();
  for (int64_t b = 0; b < B; ++b) {
    float* row = logits.f32() + b * V;
    uint8_t* flags = seen.defined() ? seen.as<uint8_t>() + b * V : nullptr;
    if (penalise)
      for (int64_t i = 0; i < V; ++i)
        if (flags[i]) row[i] = repetition_penalised(row[i], p.repetition_penalty);
    const std::span<const float> r(row, size_t(V));
    int32_t id;
    if (p.greedy()) {
      id = argmax(r);
      if (logprobs.defined()) logprobs.f32()[b] = float(log_softmax_at(r, id));
    } else {
      const std::vector<std::pair<int32_t, double>> c = sampling_candidates(r, p);
      id = pick_in_token_order(c, sample_uniform(p.seed + uint64_t(b), step));
      if (logprobs.defined())
        for (const auto& [k, prob] : c)
          if (k == id) logprobs.f32()[b] = float(std::log(prob));
    }
    ids.i32()[b] = id;
    if (flags) flags[id] = 1;
  }
}

void CpuOps::flag_tokens(Tensor seen, const Tensor& ids) {
  const int64_t B = seen.dim(0), V = seen.dim(1), N = ids.numel();
  SOLTRAIN_CHECK(seen.dtype == DType::U8 && B > 0 && N % B == 0, "flag_tokens: shapes");
  const int64_t T = N / B;
  for (int64_t n = 0; n < N; ++n) {
    const int32_t id = ids.i32()[n];
    SOLTRAIN_CHECK(id >= 0 && id < V, "flag_tokens: id ", id);
    seen.as<uint8_t>()[(n / T) * V + id] = 1;
  }
}

}  // namespace soltrain
