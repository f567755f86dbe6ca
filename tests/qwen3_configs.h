// Real models' config.json for tests that plan a run from the config alone (no weights).
#pragma once
#include <nlohmann/json.hpp>

#include "model/config.h"

namespace soltrain::test {

// Qwen/Qwen3-8B's config.json (the fields a plan reads).
inline ModelConfig qwen3_8b_config() {
  return parse_model_config(nlohmann::json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096,
    "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "max_position_embeddings": 40960, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
    "tie_word_embeddings": false, "attention_bias": false, "hidden_act": "silu"})"));
}

}  // namespace soltrain::test
