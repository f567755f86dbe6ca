// Choosing the next token from logits, the definitions every backend shares: the settings (transformers'
// generate keys, applied in its order: repetition_penalty on the raw logits, temperature, top_k, top_p, min_p),
// the counter-based uniform each row draws (so the CPU and the GPU draw the same number for the same row and
// step, with no generator state to carry), and the host reference of the kept set the tests and the CPU
// backend use.
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#ifdef __CUDACC__
#define SOLTRAIN_SAMPLING_HD __host__ __device__
#else
#define SOLTRAIN_SAMPLING_HD
#endif

namespace soltrain {

struct SamplingParams {
  float temperature = 0;         // 0: greedy (argmax)
  int top_k = 0;                 // 0: no limit
  float top_p = 1;               // 1: no limit
  uint64_t seed = 0;             // row b of a batch draws with seed + b
  float min_p = 0;               // 0: off; else drop tokens below min_p × the likeliest token's probability
  float repetition_penalty = 1;  // 1: off; else a logit of a token already in the sequence is ÷ it (× if < 0)
  // temperature ≥ 0, top_k ≥ 0, 0 < top_p ≤ 1, 0 ≤ min_p ≤ 1, repetition_penalty > 0; a UserError names the
  // setting.
  void validate() const;
  bool greedy() const { return temperature == 0; }
};

// splitmix64's finaliser: a bijection of 64-bit words whose outputs pass as independent for adjacent inputs.
SOLTRAIN_SAMPLING_HD inline uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// The uniform in [0, 1) a row seeded `seed` draws for its `step`-th token (53 bits).
SOLTRAIN_SAMPLING_HD inline double sample_uniform(uint64_t seed, uint64_t step) {
  return double(mix64(mix64(seed) ^ (step * 0xd1b54a32d192ed03ull)) >> 11) * 0x1.0p-53;
}
// transformers' RepetitionPenaltyLogitsProcessor on one logit of a token the sequence already holds.
SOLTRAIN_SAMPLING_HD inline float repetition_penalised(float logit, float penalty) {
  return logit < 0 ? logit * penalty : logit / penalty;
}

// The first index of the largest logit (torch.argmax's tie rule).
int32_t argmax(std::span<const float> logits);

// The tokens sampling may pick and their probabilities (renormalised over the kept set), most likely first
// (equal probabilities in token order): softmax(logits / temperature), the top_k most likely, then the smallest
// prefix whose mass reaches top_p, then those at least min_p × the likeliest. The logits are taken as already
// repetition-penalised. In double: the reference the backends are tested against.
std::vector<std::pair<int32_t, double>> sampling_candidates(std::span<const float> logits, const SamplingParams& p);

// The draw every backend makes from a kept set: the first token, in token order, at which the running sum of the
// kept probabilities exceeds u·(their total). `candidates` as sampling_candidates returns them.
int32_t pick_in_token_order(std::vector<std::pair<int32_t, double>> candidates, double u);

}  // namespace soltrain
