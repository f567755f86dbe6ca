// Text generation by token ids: the prompt through the KV-cache decoder, then one token at a time chosen by
// the sampler until an end-of-sequence id or the token budget. Tokenizing and printing are the caller's.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <vector>

#include "kernels/sampling.h"
#include "model/decoder.h"

namespace soltrain {

struct GenerationOptions {
  int max_new_tokens = 256;
  SamplingParams sampling;
  std::vector<int32_t> eos_ids;  // generation stops after producing any of these
  // A row's tokens so far, the newest last: true ends the row after that token (stop strings,
  // tokenizer/stop_strings.h). Not set: EOS ids and the budget alone end rows.
  std::function<bool(std::span<const int32_t>)> stop_after;
  // generate_groups: each token's log-probability under the distribution it was drawn from into Rollout::logprobs
  // (GRPO's importance-sampling correction reads them).
  bool logprobs = false;
};

// Generates after `prompt` with a batch-1 decoder (reset first; built for a repetition_penalty when one is
// set). Tokens are drawn on the device (KvDecoder::sample, draw i of row 0 with step i). `on_token` sees each new token
// as it is chosen. Returns the new tokens, the stopping EOS (or the token completing a stop string) included.
std::vector<int32_t> generate(KvDecoder& decoder, std::span<const int32_t> prompt, const GenerationOptions& opts,
                              const std::function<void(int32_t)>& on_token = {});

// `decoder.batch()` continuations of one prompt generated together (an API's n choices): the prompt fed once
// and its cache copied to every row, then one token per row per step; row r samples with seed + r (row 0 is what
// generate() gives).
// A row that produced an EOS is done (later tokens of its slot are not kept). Returns each row's new tokens.
std::vector<std::vector<int32_t>> generate_batch(KvDecoder& decoder, std::span<const int32_t> prompt,
                                                 const GenerationOptions& opts);

// GRPO's rollouts: `group` completions of each prompt, returned in prompt order (prompt p's at p·group ..). Each
// prompt is fed once into `group` rows and its cache copied to the rest of them; then every row takes one token
// per step at its own position, row r sampling with seed + r. A completion ends at an EOS or a completed stop
// string (kept, `terminated`) or at max_new_tokens. The decoder holds prompts.size() × group rows, or fewer (a
// multiple of group, each row sized for a prompt plus max_new_tokens): then the prompts stream through them
// (continuous batching), a group's rows taking the next prompt as soon as all of them have ended (greedy decoding
// gives what all rows at once give; sampled draws depend on the row and step a completion got, repeatably).
struct Rollout {
  std::vector<int32_t> tokens;
  bool terminated = false;      // ended by an EOS or a stop string rather than the length limit
  bool stop_string = false;     // ... by a stop string
  std::vector<float> logprobs;  // per token, with GenerationOptions::logprobs (Ops::sample_tokens' definition)
};
std::vector<Rollout> generate_groups(KvDecoder& decoder, const std::vector<std::vector<int32_t>>& prompts, int group,
                                     const GenerationOptions& opts);

// Each of `prompts` (non-empty, lengths free) continued as one row of a batch built here for them: a decoder of
// prompts.size() rows sized for the longest prompt plus max_new_tokens, then generate_groups with groups of one
// (prompt i samples with seed + i). The callers check the prompts and the context first.
std::vector<std::vector<int32_t>> generate_each(Transformer& model, const std::vector<std::vector<int32_t>>& prompts,
                                                const GenerationOptions& opts);

// eos_token_id of a model folder's generation_config.json (an int or a list); empty when absent.
std::vector<int32_t> read_generation_eos(const std::filesystem::path& model_dir);

}  // namespace soltrain
