#include "model/peft_adapter.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "io/atomic_file.h"
#include "io/deferred_writes.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"

namespace fs = std::filesystem;

namespace soltrain {

namespace {
const char* kConfigFile = "adapter_config.json";
const char* kWeightsFile = "adapter_model.safetensors";

bool unset(const nlohmann::json& cfg, const char* key) {
  if (!cfg.contains(key)) return true;
  const auto& v = cfg[key];
  return v.is_null() || v == false || (v.is_object() || v.is_array() ? v.empty() : false);
}
}  // namespace

namespace {
// PEFT 0.21's adapters on transformers 5's stacked MoE experts: target_parameters gate_up_proj (gate_proj and
// up_proj fused, rank_pattern / alpha_pattern doubling r and alpha for it) and down_proj. Any other
// target_parameters, rank_pattern or alpha_pattern changes ranks or scales soltrain does not model: refused.
void read_expert_targets(const nlohmann::json& cfg, LoraConfig& lora, const std::string& src) {
  const auto params = unset(cfg, "target_parameters") ? std::vector<std::string>{}
                                                      : cfg.at("target_parameters").get<std::vector<std::string>>();
  bool gate_up = false;
  for (const std::string& p : params) {
    if (p == "gate_up_proj") {
      gate_up = true;
      lora.target_modules.insert(lora.target_modules.end(), {"gate_proj", "up_proj"});
    } else if (p == "down_proj") {
      lora.target_modules.push_back("down_proj");
    } else if (p == "gate.weight") {  // the router
      lora.router = true;
    } else {
      user_error(src, ": target_parameters entry '", p,
                 "' is not supported (soltrain reads gate_up_proj and down_proj, the MoE experts', and gate.weight, "
                 "the router)");
    }
  }
  lora.expert_targets = !params.empty();
  const nlohmann::json rank = gate_up ? nlohmann::json{{".*\\.gate_up_proj", 2 * lora.r}} : nlohmann::json::object();
  const nlohmann::json alpha =
      gate_up ? nlohmann::json{{".*\\.gate_up_proj", 2 * lora.alpha}} : nlohmann::json::object();
  for (auto [key, want] : {std::pair{"rank_pattern", rank}, {"alpha_pattern", alpha}}) {
    const nlohmann::json got = unset(cfg, key) ? nlohmann::json::object() : cfg.at(key);
    if (got != want)
      user_error(src, ": '", key, "' is ", got.dump(), ": per-module ",
                 std::string(key) == "rank_pattern" ? "ranks" : "alphas", " are not supported by soltrain",
                 gate_up ? cat(" (but for the experts' fused gate_up_proj: ", want.dump(), ")") : std::string());
  }
}
}  // namespace

LoraConfig read_adapter_config(const fs::path& adapter_dir) {
  const fs::path path = adapter_dir / kConfigFile;
  if (!fs::exists(path)) user_error(adapter_dir.string(), ": not a PEFT adapter folder (no ", kConfigFile, ")");
  const nlohmann::json cfg = read_json_file(path);
  const std::string src = path.string();
  if (!cfg.is_object()) user_error(src, ": expected a JSON object");
  const std::string type = cfg.value("peft_type", std::string());
  if (type != "LORA") user_error(src, ": peft_type is '", type, "', soltrain loads LORA adapters only");
  // Features that change the math or the tensor set; silently ignoring any of them would give wrong outputs.
  const std::pair<const char*, const char*> unsupported[] = {
      {"use_dora", "DoRA"},
      {"layers_to_transform", "adapting a subset of layers (layers_to_transform)"},
      {"layer_replication", "layer_replication"},
      {"fan_in_fan_out", "fan_in_fan_out (Conv1D-style weights)"},
      {"lora_bias", "trained LoRA biases (lora_bias)"},
      {"use_qalora", "QALoRA"},
      {"trainable_token_indices", "trainable_token_indices"},
      {"exclude_modules", "exclude_modules"},
      {"ensure_weight_tying", "one trained copy of a tied embedding and LM head (ensure_weight_tying)"},
      // LoRA variants whose forward differs from W·x + scale·B·A·x (or that soltrain does not know)
      {"alora_invocation_tokens", "activated LoRA (alora_invocation_tokens)"},
      {"arrow_config", "Arrow routing (arrow_config)"},
      {"use_bdlora", "BD-LoRA (use_bdlora)"},
      {"kasa_config", "KaSA (kasa_config)"},
      {"monteclora_config", "MonteCLoRA (monteclora_config)"},
      {"velora_config", "VeLoRA (velora_config)"}};
  for (auto [key, what] : unsupported)
    if (!unset(cfg, key)) user_error(src, ": '", key, "' is set: ", what, " is not supported by soltrain");
  const std::string bias = cfg.value("bias", std::string("none"));
  if (bias != "none") user_error(src, ": bias is '", bias, "', soltrain supports bias \"none\" only");

  LoraConfig lora;
  try {
    // Range-checked before the conversion: a 2^40 rank must not wrap around to 0.
    const auto& r = cfg.at("r");
    const bool fits = r.is_number_unsigned()  ? r.get<uint64_t>() <= uint64_t(1) << 20
                      : r.is_number_integer() ? r.get<int64_t>() >= 0 && r.get<int64_t>() <= int64_t(1) << 20
                                              : false;
    if (!fits) user_error(src, ": \"r\" must be an integer from 1 to ", 1 << 20, ", got ", r.dump());
    lora.r = r.get<int>();
    lora.alpha = cfg.at("lora_alpha").get<float>();
    lora.dropout = cfg.value("lora_dropout", 0.0f);
    lora.use_rslora = cfg.value("use_rslora", false);
    // PEFT's LoftQ: the adapter was trained over each base weight's NF4 round trip (model/loftq.h), which PEFT
    // redoes when it loads it and soltrain's merge too.
    if (const auto init = cfg.find("init_lora_weights"); init != cfg.end() && *init == "loftq") {
      const nlohmann::json loftq = cfg.value("loftq_config", nlohmann::json::object());
      if (loftq.value("loftq_bits", 4) != 4)
        user_error(src, ": LoftQ with loftq_bits ", loftq.value("loftq_bits", 4), " (soltrain reads 4-bit LoftQ)");
      lora.loftq_iter = loftq.value("loftq_iter", 1);
    }
    const auto& t = cfg.at("target_modules");
    if (t.is_string()) {
      // "all-linear" is PEFT's shorthand for every linear layer but the output head: our seven projections.
      if (t.get<std::string>() != "all-linear")
        user_error(src, ": target_modules is the pattern '", t.get<std::string>(),
                   "'; soltrain reads a list of module names or \"all-linear\"");
      lora.target_modules.assign(kLoraModuleNames.begin(), kLoraModuleNames.end());
      lora.all_linear = true;
    } else {
      // PEFT keeps full module paths ("model.layers.1.mlp.down_proj") where it does not condense them into names
      // (fewer than 20 modules, as all-linear on a two-layer model gives): each is its projection's name here, and
      // an adapter on some layers only then misses the others' tensors (refused naming the first, at loading).
      for (std::string name : t.get<std::vector<std::string>>()) {
        const size_t dot = name.rfind('.');
        const bool path = name.starts_with("model.layers.") || name.starts_with("model.language_model.layers.");
        if (path && dot != std::string::npos) name = name.substr(dot + 1);
        if (std::find(lora.target_modules.begin(), lora.target_modules.end(), name) == lora.target_modules.end())
          lora.target_modules.push_back(name);
      }
      // Qwen2-MoE's shared_expert_gate (what PEFT's all-linear adds there): a flag, not one of the seven
      auto& m = lora.target_modules;
      if (const auto it = std::find(m.begin(), m.end(), "shared_expert_gate"); it != m.end()) {
        m.erase(it);
        lora.shared_expert_gate = true;
      }
    }
    read_expert_targets(cfg, lora, src);
    if (!unset(cfg, "modules_to_save"))  // (the model checks them: embed_tokens, lm_head, untied)
      for (const std::string& m : cfg.at("modules_to_save").get<std::vector<std::string>>())
        lora.modules_to_save.push_back(m);
  } catch (const nlohmann::json::exception& e) {
    user_error(src, ": ", e.what());
  }
  lora.validate(src);
  return lora;
}

void refuse_non_finite(const std::vector<float>& v, const fs::path& file, const std::string& name) {
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i]))
      user_error(file.string(), ": tensor '", name, "' holds ", std::isnan(v[i]) ? "NaN" : "inf", " (at element ", i,
                 "): the adapter is corrupt or its training diverged");
}

void check_adapter_finite(const SafetensorsFile& f, const fs::path& file) {
  std::vector<float> v;
  for (const auto& [name, e] : f.entries()) {
    v.resize(size_t(shape_numel(e.shape)));
    read_as_f32(e, e.shape, v.data(), file.string() + ": " + name);
    refuse_non_finite(v, file, name);
  }
}

namespace {
// Base parameters trained in full beside the adapters (a reward model's score head: PEFT's modules_to_save for
// SEQ_CLS), saved under the PEFT model's name for them.
bool trained_beside_adapters(const Parameter& p) {
  return p.trainable && !is_lora_name(p.name);
}
std::string beside_adapters_name(const Parameter& p) {
  return "base_model.model." + p.name;
}
}  // namespace

void load_adapter_weights(Transformer& model, const fs::path& adapter_dir) {
  const fs::path path = adapter_dir / kWeightsFile;
  if (!fs::exists(path))
    user_error(adapter_dir.string(), ": no ", kWeightsFile,
               fs::exists(adapter_dir / "adapter_model.bin")
                   ? " (adapter_model.bin is not read: re-save with safetensors)"
                   : "");
  const SafetensorsFile file(path);
  std::vector<float> staging;
  std::set<std::string> used;
  for (Parameter& p : model.params().all()) {
    if (!is_lora_name(p.name) && !trained_beside_adapters(p)) continue;
    const std::string name = checkpoint_name(model.config(), is_lora_name(p.name) ? p.name : beside_adapters_name(p));
    if (!is_lora_name(p.name) && !file.find(name))
      user_error(path.string(), ": no tensor '", name, "': the adapter was not trained with its ", p.name,
                 " (a reward model's adapter holds its score head)");
    const TensorEntry& e = file.at(name);
    staging.resize(size_t(shape_numel(p.shape)));
    read_as_f32(e, p.shape, staging.data(), path.string() + ": " + name);
    refuse_non_finite(staging, path, name);
    model.params().upload(model.ops(), p, staging.data());
    used.insert(name);
  }
  for (const auto& [name, e] : file.entries())
    if (!used.count(name))
      user_error(path.string(), ": tensor '", name, "' is not part of a LoRA adapter on ",
                 model.lora() ? "the configured target modules" : "this model");
}

std::unique_ptr<Transformer> load_pretrained_with_adapter(const fs::path& model_dir, const fs::path& adapter_dir,
                                                          Ops& ops, WeightFormat base,
                                                          std::optional<VocabResize> vocab) {
  LoraConfig lora = read_adapter_config(adapter_dir);
  lora.base_format = base;
  auto model = load_pretrained(model_dir, ops, lora, true, {}, std::nullopt, vocab);
  load_adapter_weights(*model, adapter_dir);
  return model;
}

std::string peft_task_type(const ModelConfig& c) {
  return c.num_labels == 0 ? "CAUSAL_LM" : c.token_classifier ? "TOKEN_CLS" : "SEQ_CLS";
}

nlohmann::json adapter_config_json(const LoraConfig& lora, const AdapterBase& base, bool moe,
                                   const std::string& task_type) {
  const bool classifier = task_type != "CAUSAL_LM";
  // Every key PEFT 0.21's LoraConfig writes, with its defaults where soltrain has no such feature. PEFT
  // itself writes target_modules from a set (any order); ours follow the layer's order.
  using J = nlohmann::json;
  std::vector<std::string> targets;
  J parameters = nullptr, rank_pattern = J::object(), alpha_pattern = J::object();
  for (int t = 0; t < kLoraTargets; ++t)
    if (lora.targets(LoraTarget(t)) && (is_attention_target(LoraTarget(t)) || !moe))
      targets.push_back(kLoraModuleNames[size_t(t)]);
  if (lora.shared_expert_gate) targets.push_back("shared_expert_gate");
  const J alpha = lora.alpha == float(int64_t(lora.alpha)) ? J(int64_t(lora.alpha)) : J(std::stod(cat(lora.alpha)));
  if (moe && (lora.targets(LoraTarget::gate) || lora.targets(LoraTarget::down) || lora.router)) {
    parameters = J::array();  // (sorted, as PEFT writes the set)
    if (lora.targets(LoraTarget::down)) parameters.push_back("down_proj");
    if (lora.router) parameters.push_back("gate.weight");
    if (lora.targets(LoraTarget::gate)) {
      parameters.push_back("gate_up_proj");
      rank_pattern[".*\\.gate_up_proj"] = 2 * lora.r;
      alpha_pattern[".*\\.gate_up_proj"] =
          alpha.is_number_integer() ? J(2 * alpha.get<int64_t>()) : J(2 * alpha.get<double>());
    }
  }
  // (alpha: integral alphas are written as integers, as Python writes lora_alpha=16; floats go through their
  // shortest decimal form, so 0.05f is written 0.05, not 0.05000000074505806)
  return J{{"alora_invocation_tokens", nullptr},
           {"alpha_pattern", alpha_pattern},
           {"arrow_config", nullptr},
           {"auto_mapping", nullptr},
           {"base_model_name_or_path", base.name_or_path},
           {"bias", "none"},
           {"corda_config", nullptr},
           {"ensure_weight_tying", false},
           {"eva_config", nullptr},
           {"exclude_modules", nullptr},
           {"fan_in_fan_out", false},
           {"inference_mode", true},
           {"init_lora_weights", lora.loftq_iter > 0 ? J("loftq") : J(true)},
           {"kasa_config", nullptr},
           {"layer_replication", nullptr},
           {"layers_pattern", nullptr},
           {"layers_to_transform", nullptr},
           {"loftq_config", lora.loftq_iter > 0 ? J{{"loftq_bits", 4}, {"loftq_iter", lora.loftq_iter}} : J::object()},
           {"lora_alpha", alpha},
           {"lora_bias", false},
           {"lora_dropout", std::stod(cat(lora.dropout))},
           {"lora_ga_config", nullptr},
           {"megatron_config", nullptr},
           {"megatron_core", "megatron.core"},
           // (PEFT's SEQ_CLS and TOKEN_CLS tasks keep its classification heads in full: modules_to_save ["classifier",
           // "score"])
           {"modules_to_save", classifier                     ? J::array({"classifier", "score"})
                               : lora.modules_to_save.empty() ? J(nullptr)
                                                              : J(lora.modules_to_save)},
           {"monteclora_config", nullptr},
           {"peft_type", "LORA"},
           {"peft_version", "0.21.0"},
           {"qalora_group_size", 16},
           {"r", lora.r},
           {"rank_pattern", rank_pattern},
           {"revision", base.revision.empty() ? J(nullptr) : J(base.revision)},
           {"target_modules", targets},
           {"target_parameters", parameters},
           {"task_type", task_type},
           {"trainable_token_indices", nullptr},
           {"use_bdlora", nullptr},
           {"use_dora", false},
           {"use_qalora", false},
           {"use_rslora", lora.use_rslora},
           {"velora_config", nullptr}};
}

void write_adapter(const Transformer& model, const fs::path& dir, const AdapterBase& base) {
  SOLTRAIN_CHECK(model.lora(), "write_adapter on a model without LoRA");
  // Each tensor fetched from the device as the file is written (into a background snapshot's pinned slab, queued).
  Ops& ops = const_cast<Transformer&>(model).ops();
  std::vector<StreamedTensor> tensors;
  for (const Parameter& p : model.params().all())
    if (is_lora_name(p.name) || trained_beside_adapters(p))
      tensors.push_back({checkpoint_name(model.config(), is_lora_name(p.name) ? p.name : beside_adapters_name(p)),
                         DType::F32, p.shape, [&model, &ops, &p](void* dst) {
                           model.params().download(ops, p, static_cast<float*>(dst), DeferredWrites::queueing());
                         }});
  // safetensors' own writer orders tensors by name (all share one dtype): do the same, so files compare.
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  write_safetensors_streamed(dir / kWeightsFile, tensors, {{"format", "pt"}});
  write_file_atomic(
      dir / kConfigFile,
      adapter_config_json(*model.lora(), base, model.config().moe_layers() > 0 && model.config().moe.lora_on_experts,
                          peft_task_type(model.config()))
          .dump(2));
}

void save_adapter(const Transformer& model, const fs::path& out_dir, const AdapterBase& base) {
  StagedDir staged(out_dir);
  write_adapter(model, staged.path(), base);
  staged.commit();
}

}  // namespace soltrain
