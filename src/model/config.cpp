#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/format.h"
#include "io/json_file.h"

using nlohmann::json;

namespace soltrain {

namespace {

struct Reader {
  const json& j;
  std::string where;

  template <typename T>
  T get(const char* key, T fallback) const {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    return typed<T>(j[key], key);
  }
  template <typename T>
  T need(const char* key) const {
    if (!j.contains(key) || j[key].is_null()) user_error(where, ": missing required field \"", key, "\"");
    return typed<T>(j[key], key);
  }
  template <typename T>
  T typed(const json& v, const std::string& key) const {
    if constexpr (std::is_same_v<T, bool>) {
      if (!v.is_boolean()) user_error(where, ": \"", key, "\" must be true or false, got ", v.dump());
    } else if constexpr (std::is_integral_v<T>) {
      // Range-checked before conversion: 10^12 must not wrap around to a negative int.
      constexpr uint64_t max = uint64_t(std::numeric_limits<T>::max());
      const bool ok = v.is_number_unsigned()  ? v.get<uint64_t>() <= max
                      : v.is_number_integer() ? v.get<int64_t>() >= 0 && uint64_t(v.get<int64_t>()) <= max
                                              : false;
      if (!ok) user_error(where, ": \"", key, "\" must be an integer from 0 to ", max, ", got ", v.dump());
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!v.is_number()) user_error(where, ": \"", key, "\" must be a number, got ", v.dump());
    } else {
      if (!v.is_string()) user_error(where, ": \"", key, "\" must be a string, got ", v.dump());
    }
    return v.get<T>();
  }
};

RopeConfig parse_rope(const json& j, const std::string& where) {
  RopeConfig r;
  // transformers 5 writes rope_parameters {rope_type, rope_theta, ...}; 4.x wrote rope_theta at the top
  // level and an optional rope_scaling {type|rope_type, factor, ...}.
  const json* params = nullptr;
  std::string field;
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
    params = &j["rope_parameters"];
    field = "rope_parameters";
  } else if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    params = &j["rope_scaling"];
    field = "rope_scaling";
  }
  Reader top{j, where};
  r.theta = top.get<double>("rope_theta", 10000.0);
  if (!params) return r;
  if (!params->is_object()) user_error(where, ": \"", field, "\" must be an object");
  Reader p{*params, where + ": " + field};
  r.theta = p.get<double>("rope_theta", r.theta);
  r.type = p.get<std::string>("rope_type", p.get<std::string>("type", "default"));
  if (r.type == "default") return r;
  if (r.type == "linear") {
    r.factor = p.need<double>("factor");
  } else if (r.type == "llama3") {
    r.factor = p.need<double>("factor");
    r.low_freq_factor = p.need<double>("low_freq_factor");
    r.high_freq_factor = p.need<double>("high_freq_factor");
    r.original_max_position_embeddings = p.need<double>("original_max_position_embeddings");
    if (r.high_freq_factor <= r.low_freq_factor)
      user_error(where, ": ", field, ".high_freq_factor must exceed low_freq_factor");
  } else {
    user_error(where, ": ", field, ".rope_type \"", r.type, "\" is not supported (supported: default, linear, llama3)");
  }
  if (!(r.factor > 0)) user_error(where, ": ", field, ".factor must be positive");
  return r;
}

constexpr ModelSpec::Moe kQwen2MoeBlock{60, 4, 1408, 5632, false}, kQwen3MoeBlock{128, 8, 768, 0, true};
constexpr ModelSpec kSpecs[] = {
    {"LlamaForCausalLM", "llama", ModelSpec::Bias::AttentionBiasKey, true, false, nullptr},
    {"Qwen2ForCausalLM", "qwen2", ModelSpec::Bias::QkvAlways, false, false, nullptr},
    {"Qwen3ForCausalLM", "qwen3", ModelSpec::Bias::AttentionBiasKey, false, true, nullptr},
    {"Qwen2MoeForCausalLM", "qwen2_moe", ModelSpec::Bias::QkvBiasKey, false, false, &kQwen2MoeBlock},
    {"Qwen3MoeForCausalLM", "qwen3_moe", ModelSpec::Bias::AttentionBiasKey, false, true, &kQwen3MoeBlock},
    {"MistralForCausalLM", "mistral", ModelSpec::Bias::None, false, false, nullptr, true},
    // (its text decoder is Qwen3's; on text alone its interleaved multimodal RoPE is 1-D RoPE: the three position
    // ids of a text token are equal, so every frequency sees the token's position)
    {"Qwen3VLForConditionalGeneration", "qwen3_vl", ModelSpec::Bias::AttentionBiasKey, false, true, nullptr, false,
     "model.language_model."},
};

// The MoE fields, as transformers' Qwen3MoeConfig / Qwen2MoeConfig read them (their defaults where a field is
// absent).
MoeConfig parse_moe(const Reader& r, int layers, const ModelSpec::Moe& d) {
  MoeConfig m;
  // transformers 5 writes num_local_experts; the hub's configs say num_experts
  m.num_experts = r.get<int>("num_experts", r.get<int>("num_local_experts", d.experts));
  m.top_k = r.get<int>("num_experts_per_tok", d.top_k);
  m.intermediate_size = r.get<int>("moe_intermediate_size", d.intermediate_size);
  m.lora_on_experts = d.lora_on_experts;
  if (d.shared_intermediate_size) {
    m.shared_intermediate_size = r.get<int>("shared_expert_intermediate_size", d.shared_intermediate_size);
    if (m.shared_intermediate_size < 1) user_error(r.where, ": \"shared_expert_intermediate_size\" must be positive");
  }
  m.norm_topk = r.get<bool>("norm_topk_prob", false);
  const double coef = r.get<double>("router_aux_loss_coef", 0.001);
  if (!(coef >= 0) || !std::isfinite(coef))
    user_error(r.where, ": \"router_aux_loss_coef\" must be a non-negative number, got ", coef);
  m.aux_loss_coef = r.get<bool>("output_router_logits", false) ? float(coef) : 0.0f;
  const int step = r.get<int>("decoder_sparse_step", 1);
  if (m.num_experts > 0 && (m.top_k < 1 || m.top_k > m.num_experts))
    user_error(r.where, ": \"num_experts_per_tok\" must be from 1 to num_experts (", m.num_experts, "), got ", m.top_k);
  if (m.num_experts > 0 && m.intermediate_size < 1) user_error(r.where, ": \"moe_intermediate_size\" must be positive");
  if (step < 1) user_error(r.where, ": \"decoder_sparse_step\" must be at least 1, got ", step);
  std::vector<int> dense_only;
  if (r.j.contains("mlp_only_layers") && !r.j["mlp_only_layers"].is_null()) {
    if (!r.j["mlp_only_layers"].is_array())
      user_error(r.where, ": \"mlp_only_layers\" must be a list of layer indices");
    for (const auto& v : r.j["mlp_only_layers"]) dense_only.push_back(r.typed<int>(v, "mlp_only_layers[]"));
  }
  m.sparse.assign(size_t(layers), false);
  for (int l = 0; l < layers; ++l)
    m.sparse[size_t(l)] = m.num_experts > 0 && (l + 1) % step == 0 &&
                          std::find(dense_only.begin(), dense_only.end(), l) == dense_only.end();
  return m;
}

}  // namespace

ModelConfig parse_model_config(const json& top, const std::string& where) {
  if (!top.is_object()) user_error(where, ": expected a JSON object");
  Reader rt{top, where};
  ModelConfig c;
  c.raw = top;
  if (top.contains("architectures") && top["architectures"].is_array() && !top["architectures"].empty())
    c.architecture = rt.typed<std::string>(top["architectures"][0], "architectures[0]");
  const std::string model_type = rt.get<std::string>("model_type", "");
  // <Family>ForSequenceClassification / ForTokenClassification: the family's decoder under a score head
  // (ModelConfig::num_labels, token_classifier)
  const std::string_view kClassifier = "ForSequenceClassification", kTokenClassifier = "ForTokenClassification";
  std::string family = c.architecture, head_kind;
  for (std::string_view kind : {kClassifier, kTokenClassifier})
    if (family.ends_with(kind)) {
      family = family.substr(0, family.size() - kind.size()) + "ForCausalLM";
      head_kind = kind;
    }
  for (const ModelSpec& spec : kSpecs)
    if (family == spec.architecture || (c.architecture.empty() && model_type == spec.model_type)) c.spec = &spec;
  if (!c.spec) {
    std::string supported;
    for (const ModelSpec& spec : kSpecs) supported += cat(supported.empty() ? "" : ", ", spec.architecture);
    user_error(where, ": architecture \"", c.architecture.empty() ? model_type : c.architecture,
               "\" is not supported (supported: ", supported, ")");
  }
  c.architecture = c.spec->architecture;
  // A vision-language model's decoder fields are its text_config's (tie_word_embeddings at the top, where
  // transformers 5 keeps it, else there)
  if (c.spec->language_model && (!top.contains("text_config") || !top["text_config"].is_object()))
    user_error(where, ": ", c.architecture, " without a \"text_config\" object");
  const json& j = c.spec->language_model ? top["text_config"] : top;
  const Reader r{j, c.spec->language_model ? where + ": text_config" : where};
  c.initializer_range = r.get<double>("initializer_range", 0.02);
  if (const auto pad = j.find("pad_token_id"); pad != j.end() && pad->is_number_integer()) {
    const int64_t v = pad->get<int64_t>();
    if (v >= 0 && v < j.value("vocab_size", int64_t(0))) c.padding_idx = int(v);
  }
  if (!head_kind.empty()) {
    // transformers keeps num_labels as id2label's size (2 when neither is given)
    c.num_labels =
        j.contains("id2label") && j["id2label"].is_object() ? int(j["id2label"].size()) : r.get<int>("num_labels", 2);
    c.token_classifier = head_kind == kTokenClassifier;
    if (!c.token_classifier && c.num_labels != 1)
      user_error(where, ": a sequence classifier with ", c.num_labels,
                 " labels: soltrain trains reward models (one label) only");
    if (c.token_classifier && c.num_labels < 2)
      user_error(where, ": a token classifier with ", c.num_labels, " labels: at least 2 are needed");
    c.pad_token_id =
        j.contains("pad_token_id") && j["pad_token_id"].is_number_integer() ? j["pad_token_id"].get<int>() : -1;
    c.architecture = family.substr(0, family.size() - std::string_view("ForCausalLM").size()) + head_kind;
  }

  c.vocab_size = r.need<int>("vocab_size");
  c.hidden_size = r.need<int>("hidden_size");
  c.intermediate_size = r.need<int>("intermediate_size");
  c.num_layers = r.need<int>("num_hidden_layers");
  c.num_heads = r.need<int>("num_attention_heads");
  c.num_kv_heads = r.get<int>("num_key_value_heads", c.num_heads);
  c.max_position_embeddings = r.get<int>("max_position_embeddings", 4096);
  c.rms_norm_eps = r.get<double>("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = rt.get<bool>("tie_word_embeddings", r.get<bool>("tie_word_embeddings", false));
  for (auto [v, name] : {std::pair{c.vocab_size, "vocab_size"},
                         {c.hidden_size, "hidden_size"},
                         {c.intermediate_size, "intermediate_size"},
                         {c.num_layers, "num_hidden_layers"},
                         {c.num_heads, "num_attention_heads"},
                         {c.num_kv_heads, "num_key_value_heads"}})
    if (v <= 0) user_error(where, ": \"", name, "\" must be positive, got ", v);
  if (c.num_heads % c.num_kv_heads != 0)
    user_error(where, ": num_attention_heads (", c.num_heads, ") must be a multiple of num_key_value_heads (",
               c.num_kv_heads, ")");
  if (c.hidden_size % c.num_heads != 0 && !j.contains("head_dim"))
    user_error(where, ": hidden_size is not a multiple of num_attention_heads and no head_dim is given");
  c.head_dim = r.get<int>("head_dim", c.hidden_size / c.num_heads);
  if (c.head_dim <= 0 || c.head_dim % 2) user_error(where, ": head_dim must be positive and even, got ", c.head_dim);

  const std::string act = r.get<std::string>("hidden_act", "silu");
  if (act != "silu") user_error(where, ": hidden_act \"", act, "\" is not supported (only silu)");

  // Biases: Qwen2 always has q/k/v biases and none on o_proj (Qwen2-MoE: as its qkv_bias says, true unless
  // given); Llama and Qwen3 put attention_bias on all four projections; Llama's mlp_bias covers gate/up/down.
  switch (c.spec->bias) {
    case ModelSpec::Bias::QkvAlways: c.qkv_bias = true; break;
    case ModelSpec::Bias::QkvBiasKey: c.qkv_bias = r.get<bool>("qkv_bias", true); break;
    case ModelSpec::Bias::AttentionBiasKey: c.qkv_bias = c.o_bias = r.get<bool>("attention_bias", false); break;
    case ModelSpec::Bias::None: break;
  }
  if (c.spec->mlp_bias_key) c.mlp_bias = r.get<bool>("mlp_bias", false);
  c.qk_norm = c.spec->qk_norm;
  if (c.spec->moe) c.moe = parse_moe(r, c.num_layers, *c.spec->moe);

  if (r.get<int>("pretraining_tp", 1) != 1) user_error(where, ": pretraining_tp other than 1 is not supported");
  if (c.spec->sliding_window_key && j.contains("sliding_window") && !j["sliding_window"].is_null()) {
    c.sliding_window = r.get<int>("sliding_window", 0);
    if (c.sliding_window < 1) user_error(where, ": \"sliding_window\" must be a positive integer or null");
  }
  if (r.get<bool>("use_sliding_window", false))
    user_error(where, ": use_sliding_window is true: sliding-window attention is not supported");
  if (j.contains("layer_types") && j["layer_types"].is_array())
    for (const auto& t : j["layer_types"])
      if (t != "full_attention")
        user_error(where, ": layer_types contains ", t.dump(), ": only full_attention is supported");
  c.rope = parse_rope(j, where);
  return c;
}

namespace {
void refuse_vision_language_head(const ModelConfig& c, const char* what) {
  if (c.spec->language_model)
    user_error(c.architecture, ": ", what, " over a vision-language model's language model is not built");
}
}  // namespace

void make_sequence_classifier(ModelConfig& c, int num_labels, int pad_token_id) {
  SOLTRAIN_CHECK(num_labels == 1, "make_sequence_classifier: ", num_labels, " labels");
  refuse_vision_language_head(c, "a reward model (a sequence classifier)");
  if (c.token_classifier)
    user_error(c.architecture, " is a token classifier (a process reward model), not a sequence classifier");
  if (c.num_labels == 0) {
    const std::string family = c.spec->architecture;  // <Family>ForCausalLM
    c.architecture =
        family.substr(0, family.size() - std::string_view("ForCausalLM").size()) + "ForSequenceClassification";
    c.num_labels = num_labels;
    c.raw["architectures"] = nlohmann::json::array({c.architecture});
    c.raw["id2label"] = {{"0", "LABEL_0"}};
    c.raw["label2id"] = {{"LABEL_0", 0}};
  }
  // transformers pools each sequence at its last token that is not pad_token_id (TRL sets it from the tokenizer)
  c.pad_token_id = pad_token_id;
  c.raw["pad_token_id"] = pad_token_id;
}

void make_token_classifier(ModelConfig& c, int num_labels) {
  SOLTRAIN_CHECK(num_labels >= 2, "make_token_classifier: ", num_labels, " labels");
  refuse_vision_language_head(c, "a process reward model (a token classifier)");
  if (c.num_labels > 0 && !c.token_classifier)
    user_error(c.architecture, " is a sequence classifier (a reward model), not a token classifier");
  if (c.token_classifier) {
    if (c.num_labels != num_labels)
      user_error(c.architecture, " has ", c.num_labels, " labels, the run asks for ", num_labels, " (num_labels)");
    return;
  }
  const std::string family = c.spec->architecture;  // <Family>ForCausalLM
  c.architecture = family.substr(0, family.size() - std::string_view("ForCausalLM").size()) + "ForTokenClassification";
  c.num_labels = num_labels;
  c.token_classifier = true;
  c.raw["architectures"] = nlohmann::json::array({c.architecture});
  nlohmann::json id2label = nlohmann::json::object(), label2id = nlohmann::json::object();
  for (int i = 0; i < num_labels; ++i) {
    id2label[std::to_string(i)] = cat("LABEL_", i);
    label2id[cat("LABEL_", i)] = i;
  }
  c.raw["id2label"] = id2label;
  c.raw["label2id"] = label2id;
}

void resize_vocabulary(ModelConfig& c, int rows, bool mean_resizing) {
  SOLTRAIN_CHECK(rows > 0, "resize_vocabulary to ", rows);
  if (rows == c.vocab_size) return;
  if (c.stored_vocab_size == 0) c.stored_vocab_size = c.vocab_size;
  c.vocab_size = rows;
  c.mean_resizing = mean_resizing;
  (c.spec && c.spec->language_model ? c.raw["text_config"] : c.raw)["vocab_size"] = rows;
}

void refuse_classifier(const std::filesystem::path& dir, const ModelConfig& c) {
  user_error(dir.string(), ": ", c.architecture,
             c.token_classifier
                 ? " is a token classifier (a process reward model): train it with process_reward_model: "
                   "true"
                 : " is a sequence classifier (a reward model): train it with reward_model: true");
}

namespace {
// (`prefix` is where the decoder's names start: the model's own, or PEFT's over it)
std::string swap_prefix(const std::string& name, std::string_view from, std::string_view to) {
  for (std::string_view peft : {"", "base_model.model."}) {
    const std::string a = cat(peft, from);
    if (name.starts_with(a)) return cat(peft, to, std::string_view(name).substr(a.size()));
  }
  return name;
}
}  // namespace

std::string checkpoint_name(const ModelConfig& c, const std::string& name) {
  return c.spec && c.spec->language_model ? swap_prefix(name, "model.", c.spec->language_model) : name;
}

std::string model_tensor_name(const ModelConfig& c, const std::string& stored) {
  if (!c.spec || !c.spec->language_model) return stored;
  const std::string ours = swap_prefix(stored, c.spec->language_model, "model.");
  if (ours != stored) return ours;
  // the LM head is outside the language model in the checkpoint; everything else there is the vision tower's
  return stored == "lm_head.weight" ? stored : std::string();
}

ModelConfig load_model_config(const std::filesystem::path& model_dir) {
  const auto path = model_dir / "config.json";
  if (!std::filesystem::exists(path))
    user_error(model_dir.string(), ": no config.json (expected a Hugging Face model folder)");
  return parse_model_config(read_json_file(path), path.string());
}

std::vector<float> rope_inv_freq(const RopeConfig& rope, int head_dim) {
  std::vector<float> inv(size_t(head_dim / 2));
  for (int i = 0; i < head_dim / 2; ++i) {
    // torch: 1 / (base ** (arange(0, dim, 2).float() / dim)), all in fp32
    const float exponent = float(2 * i) / float(head_dim);
    inv[i] = 1.0f / std::pow(float(rope.theta), exponent);
  }
  if (rope.type == "linear") {
    for (float& f : inv) f = f / float(rope.factor);
  } else if (rope.type == "llama3") {
    const double low_wavelen = rope.original_max_position_embeddings / rope.low_freq_factor;
    const double high_wavelen = rope.original_max_position_embeddings / rope.high_freq_factor;
    for (float& f : inv) {
      const double wavelen = 2 * M_PI / f;
      if (wavelen > low_wavelen) {
        f = f / float(rope.factor);
      } else if (wavelen >= high_wavelen) {  // medium band: interpolate between scaled and unscaled
        const float smooth = float((rope.original_max_position_embeddings / wavelen - rope.low_freq_factor) /
                                   (rope.high_freq_factor - rope.low_freq_factor));
        f = (1 - smooth) * f / float(rope.factor) + smooth * f;
      }
    }
  }
  return inv;
}

}  // namespace soltrain
