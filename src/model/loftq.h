// LoftQ initialisation (PEFT's init_lora_weights="loftq", Axolotl's `peft: {loftq_config: {loftq_bits: 4}}`): each
// adapted projection's base W becomes its NF4 round trip Q (bitsandbytes' quantize_4bit, blocksize 64, no double
// quantisation, as PEFT's loftq_init asks for it), and the adapter starts at the rank-r SVD of what that loses,
// W - Q: B = U·sqrt(S), A = sqrt(S)·Vᵀ (PEFT's _low_rank_decomposition; lora scaling is not divided out, as there).
// With loftq_iter > 1 the quantisation is repeated on W - B·A. The model then trains over Q, in full precision.
#pragma once
#include <cstdint>
#include <vector>

#include "model/transformer.h"

namespace soltrain {

// In place on a loaded model with LoRA on dense projections: every adapted projection's base and adapter.
void loftq_initialise(Transformer& model, int iterations);

// One weight [out, in] (row-major fp32): Q (out) and the adapter's A [r, in] and B [out, r].
struct LoftqWeights {
  std::vector<float> q, a, b;
};
LoftqWeights loftq_decompose(const std::vector<float>& w, int64_t out, int64_t in, int rank, int iterations);

}  // namespace soltrain
