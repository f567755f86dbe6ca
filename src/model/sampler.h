// Choosing the next token from fp32 logits on the host: greedy, or sampling with temperature, top-k and
// top-p (nucleus) from a seeded std::mt19937_64, applied in transformers' order (temperature, top-k, top-p).
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace soltrain {

struct SamplingParams {
  float temperature = 0;  // 0: greedy (argmax)
  int top_k = 0;          // 0: no limit
  float top_p = 1;        // 1: no limit
  uint64_t seed = 0;
  // temperature ≥ 0, top_k ≥ 0, 0 < top_p ≤ 1; a UserError names the flag.
  void validate() const;
};

// The first index of the largest logit (torch.argmax's tie rule).
int32_t argmax(std::span<const float> logits);

// The tokens sampling may pick and their probabilities (renormalised over the kept set), most likely first:
// softmax(logits / temperature), the top_k most likely, then the smallest prefix whose mass reaches top_p.
std::vector<std::pair<int32_t, double>> sampling_candidates(std::span<const float> logits, const SamplingParams& p);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}
  int32_t next(std::span<const float> logits);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
};

}  // namespace soltrain
