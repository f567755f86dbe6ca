// The offline demo's ingredients, made on the spot: a byte-level tokenizer with no merges (256 byte
// tokens + ChatML specials, so the model's vocabulary stays tiny and CPU training takes seconds), a
// randomly initialised small Qwen3 model using it, and a synthetic word-reversal task as conversations.
#pragma once
#include <cstdint>
#include <filesystem>

namespace soltrain {

struct DemoModelShape {
  int hidden = 128, layers = 4, heads = 4, kv_heads = 2, head_dim = 32, intermediate = 384;
  int vocab = 320;  // 256 bytes + 3 specials, padded to a multiple of 64 as real checkpoints are
  int max_positions = 4096;
  // experts > 0: a Qwen3-MoE (every layer routes to experts_per_tok of them, each moe_intermediate wide;
  // output_router_logits on, so the load-balancing loss trains too)
  int experts = 0, experts_per_tok = 2, moe_intermediate = 32;
};

// The shape with these sizes: head_dim = hidden / heads, kv_heads 0 meaning half the heads (at least 1).
// UserError when hidden is not a multiple of heads or heads of kv_heads.
DemoModelShape demo_model_shape(int hidden, int layers, int heads, int kv_heads, int intermediate);

// tokenizer.json + tokenizer_config.json (ChatML template, eos <|im_end|>) into `dir`.
void write_byte_tokenizer(const std::filesystem::path& dir);

// An HF folder: config.json, model.safetensors (N(0, 0.02) matrices, unit norms) and the byte tokenizer.
void write_random_model(const std::filesystem::path& dir, const DemoModelShape& shape, uint64_t seed);

// `n` conversations "word" → "drow" (3 to 6 random lowercase letters) as JSON lines, from `seed`. Chosen
// because the tiny model learns it in a few hundred CPU steps on separately drawn words (validation loss 5.8 →
// 0.02 in 300 steps), while two-digit addition plateaued near 1.3 in the same budget.
// With `label_noise` p > 0, each answer is, with probability p, a uniformly random word of the same length
// instead: no model can predict those, so the best achievable loss is known and far from 0 (the convergence
// benchmark, bench/convergence.sh, computes it from the file: bench/task_floor.py).
void write_reversal_dataset(const std::filesystem::path& file, int n, uint64_t seed, double label_noise = 0.0);

// The same task as `n` preference pairs for `soltrain dpo`: {"prompt": word (letters a..t), "chosen": the word
// reversed, "rejected": a near miss, the reversal with one letter replaced by one of u..z}: same length, all but
// one letter right, so preferring the chosen answer on separately drawn words is a learnt preference.
void write_reversal_preferences(const std::filesystem::path& file, int n, uint64_t seed);

}  // namespace soltrain
