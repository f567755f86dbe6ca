// ModelConfig: what a Hugging Face config.json says about a Llama / Qwen2 / Qwen3 / Qwen2-MoE / Qwen3-MoE
// decoder, checked.
#pragma once
#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace soltrain {

// One supported architecture, in one row of a table (config.cpp): its names in config.json, which options of the
// shared decoder layer it uses, and its MLP blocks (dense, or Mixture-of-Experts with transformers' defaults for
// the fields a config.json leaves out). A new family is a new row, and a new block kind where it needs one.
struct ModelSpec {
  const char* architecture;  // config.json's architectures[0], written back on save
  const char* model_type;    // what identifies it when architectures is absent
  // Biases: attention_bias on q/k/v/o (Llama, Qwen3); always on q/k/v (Qwen2); qkv_bias on q/k/v, default true
  // (Qwen2-MoE); none (Mistral)
  enum class Bias { AttentionBiasKey, QkvAlways, QkvBiasKey, None } bias;
  bool mlp_bias_key;  // gate/up/down biases as mlp_bias says (Llama)
  bool qk_norm;       // per-head RMSNorm of q and k before RoPE (Qwen3)
  // Mixture-of-Experts layers (null: every MLP dense): transformers' defaults, and the block's variant.
  struct Moe {
    int experts, top_k, intermediate_size;
    int shared_intermediate_size;  // 0: no shared expert (Qwen3-MoE); else its default (Qwen2-MoE)
    bool lora_on_experts;          // MoeConfig::lora_on_experts
  };
  const Moe* moe;
  // Mistral: `sliding_window` (when not null) limits each token's attention to that many tokens back
  bool sliding_window_key = false;
  // A vision-language model whose language model is trained on text (Qwen3-VL): config.json's text_config holds
  // the decoder's fields, and its tensors sit under this prefix in the checkpoint (PEFT's names too) instead of
  // "model."; the vision tower is neither loaded nor trained, and saves carry it over unchanged. Null: a causal LM.
  const char* language_model = nullptr;
};

struct RopeConfig {
  std::string type = "default";  // default | linear | llama3
  double theta = 10000.0;
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  double original_max_position_embeddings = 8192;        // llama3
};

// Mixture-of-Experts (Qwen2-MoE, Qwen3-MoE): which layers send each token to top_k of num_experts SwiGLU
// experts (the others keep the dense MLP), how the router weighs them, and Qwen2-MoE's shared expert.
struct MoeConfig {
  int num_experts = 0;        // 0: no MoE layer
  int top_k = 0;              // num_experts_per_tok
  int intermediate_size = 0;  // moe_intermediate_size: each expert's
  bool norm_topk = false;     // norm_topk_prob: the chosen experts' probabilities renormalised to sum 1
  // transformers adds router_aux_loss_coef × its load-balancing loss only when output_router_logits is true
  // (Qwen3-30B-A3B's config.json says false): 0 unless both say so, as there.
  float aux_loss_coef = 0;
  std::vector<bool> sparse;  // per layer: an MoE block (decoder_sparse_step, mlp_only_layers)
  // Qwen2-MoE: a dense SwiGLU expert every token also goes through, scaled by sigmoid(shared_expert_gate(h));
  // 0: none (Qwen3-MoE)
  int shared_intermediate_size = 0;
  // Where PEFT 0.21 on transformers 5 puts LoRA targets gate_proj / up_proj / down_proj: on the experts' stacked
  // parameters (Qwen3-MoE: target_parameters, dense-MLP layers then not adapted), or on nn.Linear modules of
  // those names (Qwen2-MoE: its shared expert and dense-MLP layers; the experts not adapted).
  bool lora_on_experts = false;
  // Not from config.json: expert parallelism over a frozen base (model/expert_parallel.h) holds only the base
  // weights of experts [held_first, held_first + held_count) in this process (0: every expert).
  int held_first = 0, held_count = 0;
  int held_end() const { return held_count ? held_first + held_count : num_experts; }
};

struct ModelConfig {
  const ModelSpec* spec = nullptr;  // the family (parse_model_config sets it)
  std::string architecture;         // e.g. "Qwen3ForCausalLM", written back on save
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
  // Tied in the checkpoint but untied for this run: LoRA's modules_to_save trains the embedding and / or the LM head
  // beside the adapters as two copies, as PEFT does (its lm_head starts as the stored embedding).
  bool lm_head_from_embedding = false;
  bool qkv_bias = false;  // q/k/v projections carry biases
  bool o_bias = false;    // o_proj carries a bias
  bool mlp_bias = false;  // gate/up/down carry biases
  // Mistral's sliding window: a token attends to the last `sliding_window` tokens only (0: all before it). Not
  // built into the attention kernels: a document (or generation) longer than it is refused (Transformer::upload,
  // KvDecoder), so every run that goes ahead computes what the window would.
  int sliding_window = 0;
  bool qk_norm = false;  // per-head RMSNorm of q and k before RoPE (Qwen3)
  RopeConfig rope;
  MoeConfig moe;
  // transformers' <Family>ForSequenceClassification (a reward model: 1): a score head [num_labels, hidden] (no bias)
  // over the final hidden states in place of the LM head; a sequence's output is its last non-pad token's. 0: a
  // causal LM.
  int num_labels = 0;
  // <Family>ForTokenClassification (a process reward model: num_labels 2): the score head carries a bias and labels
  // every token; it trains as the LM head does (cross-entropy over num_labels classes, the label at its own token).
  bool token_classifier = false;
  int pad_token_id = -1;  // the classifier's: which trailing tokens are not the sequence's (config.json's)
  // config.json's pad_token_id as the model is built from it: transformers makes it the embedding's padding_idx,
  // whose row torch never trains (-1: none). A reward run's pad id set later (as TRL sets it) leaves it.
  int padding_idx = -1;
  double initializer_range = 0.02;  // std of a new head's normal initialisation (transformers' _init_weights)
  // The rows the checkpoint's embedding (and untied LM head) hold when the run resized them to vocab_size
  // (resize_vocabulary); 0: as stored.
  int stored_vocab_size = 0;
  bool mean_resizing = true;  // new rows: the mean of the stored ones (transformers' default), else normal(0, range)
  nlohmann::json raw;         // the file as read, for writing it back unchanged

  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
  bool is_moe_layer(int l) const { return !moe.sparse.empty() && moe.sparse[size_t(l)]; }
  int moe_layers() const { return int(std::count(moe.sparse.begin(), moe.sparse.end(), true)); }
  int dense_mlp_layers() const { return num_layers - moe_layers(); }
  // A sequence classifier: one score per sequence (the reward objective reads it), not per-token cross-entropy.
  bool sequence_classifier() const { return num_labels > 0 && !token_classifier; }
  // What the head outputs per token: the vocabulary's logits, or a classifier's labels.
  int head_outputs() const { return num_labels > 0 ? num_labels : vocab_size; }
  // Layer l's index among the MoE layers / among the dense-MLP layers (their activations are numbered so).
  int moe_index(int l) const {
    return moe.sparse.empty() ? 0 : int(std::count(moe.sparse.begin(), moe.sparse.begin() + l, true));
  }
  int dense_mlp_index(int l) const { return l - moe_index(l); }
};

// Parses and validates; anything unsupported is a UserError naming the field and value.
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& where = "config.json");
// The family's sequence classifier with `num_labels` outputs (a causal LM's config turned into what transformers'
// AutoModelForSequenceClassification makes of it, raw included: architectures, id2label / label2id and
// pad_token_id as saves must say them). A classifier's config is kept, its pad_token_id set.
void make_sequence_classifier(ModelConfig& c, int num_labels, int pad_token_id);
// The family's token classifier with `num_labels` outputs (AutoModelForTokenClassification: architectures and
// id2label / label2id as saves must say them). A token classifier's config must already have that many labels.
void make_token_classifier(ModelConfig& c, int num_labels);
// transformers' resize_token_embeddings(rows, mean_resizing): vocab_size (raw's too, as saves say it) becomes rows,
// the checkpoint's rows are remembered for loading (load_weights fills or drops the difference).
void resize_vocabulary(ModelConfig& c, int rows, bool mean_resizing);
// A classifier folder read where a causal LM is expected: the one line that says so (UserError).
[[noreturn]] void refuse_classifier(const std::filesystem::path& dir, const ModelConfig& c);
ModelConfig load_model_config(const std::filesystem::path& model_dir);

// soltrain names the decoder's tensors as a causal LM's ("model.layers.0...", PEFT's "base_model.model.model....");
// a vision-language checkpoint keeps them under its language model (ModelSpec::language_model). The name a tensor
// has in the checkpoint or the adapter file:
std::string checkpoint_name(const ModelConfig& c, const std::string& name);
// and back: a model checkpoint's name as soltrain's, or empty for a tensor outside the language model (the vision
// tower). (Adapter files are read and written through checkpoint_name.)
std::string model_tensor_name(const ModelConfig& c, const std::string& stored);

// RoPE inverse frequencies (head_dim / 2 of them) in fp32, computed as transformers does.
std::vector<float> rope_inv_freq(const RopeConfig& rope, int head_dim);

}  // namespace soltrain
