// ModelConfig: what a Hugging Face config.json says about a Llama / Qwen2 / Qwen3 decoder, checked.
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace soltrain {

enum class Family { Llama, Qwen2, Qwen3 };

struct RopeConfig {
  std::string type = "default";  // default | linear | llama3
  double theta = 10000.0;
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  double original_max_position_embeddings = 8192;        // llama3
};

struct ModelConfig {
  Family family = Family::Llama;
  std::string architecture;  // e.g. "Qwen3ForCausalLM", written back on save
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // q/k/v projections carry biases
  bool o_bias = false;    // o_proj carries a bias
  bool mlp_bias = false;  // gate/up/down carry biases
  bool qk_norm = false;   // per-head RMSNorm of q and k before RoPE (Qwen3)
  RopeConfig rope;
  nlohmann::json raw;  // the file as read, for writing it back unchanged

  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
};

// Parses and validates; anything unsupported is a UserError naming the field and value.
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& where = "config.json");
ModelConfig load_model_config(const std::filesystem::path& model_dir);

// RoPE inverse frequencies (head_dim / 2 of them) in fp32, computed as transformers does.
std::vector<float> rope_inv_freq(const RopeConfig& rope, int head_dim);

}  // namespace soltrain
