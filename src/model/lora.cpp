#include "model/lora.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "core/error.h"

namespace soltrain {

float LoraConfig::scale() const {
  return use_rslora ? alpha / std::sqrt(float(r)) : alpha / float(r);
}

bool LoraConfig::targets(LoraTarget t) const {
  return std::find(target_modules.begin(), target_modules.end(), kLoraModuleNames[int(t)]) != target_modules.end();
}

void LoraConfig::validate(const std::string& source) const {
  if (r <= 0) user_error(source, ": lora r must be a positive integer, got ", r);
  if (!std::isfinite(alpha)) user_error(source, ": lora alpha must be a finite number");
  if (!(dropout >= 0 && dropout < 1)) user_error(source, ": lora dropout must be in [0, 1), got ", dropout);
  if (target_modules.empty())
    user_error(source,
               ": lora target_modules is empty: name some of q_proj, k_proj, v_proj, o_proj, gate_proj, "
               "up_proj, down_proj");
  for (const std::string& m : target_modules)
    if (std::find(kLoraModuleNames.begin(), kLoraModuleNames.end(), m) == kLoraModuleNames.end())
      user_error(source, ": lora target module '", m,
                 "' is not supported: use q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj or down_proj");
  for (const std::string& m : modules_to_save)
    if (m != "embed_tokens" && m != "lm_head")
      user_error(source, ": modules_to_save '", m,
                 "': soltrain trains embed_tokens and lm_head in full beside the "
                 "adapters");
  if (offload_base && base_format != WeightFormat::Dense)
    user_error(source, ": offload_weights streams a bf16 base; a quantised QLoRA base (",
               weight_format_name(base_format), ") stays on the device: drop one of them");
}

std::string lora_module_path(int layer, LoraTarget t) {
  return cat("model.layers.", layer, is_attention_target(t) ? ".self_attn." : ".mlp.", kLoraModuleNames[int(t)]);
}

std::string lora_a_name(int layer, LoraTarget t) {
  return "base_model.model." + lora_module_path(layer, t) + ".lora_A.weight";
}

std::string lora_b_name(int layer, LoraTarget t) {
  return "base_model.model." + lora_module_path(layer, t) + ".lora_B.weight";
}

bool is_lora_name(const std::string& name) {
  return name.ends_with(".lora_A.weight") || name.ends_with(".lora_B.weight");
}

std::vector<float> lora_a_init(int r, int in, uint64_t seed, const std::string& name) {
  // kaiming_uniform_(a=sqrt(5)): gain sqrt(2 / (1 + 5)), bound = gain · sqrt(3 / fan_in) = 1 / sqrt(fan_in).
  uint32_t h = 2166136261u;  // FNV-1a of the name: the same stream on every platform, unlike std::hash
  for (unsigned char c : name) h = (h ^ c) * 16777619u;
  std::seed_seq seq{uint32_t(seed), uint32_t(seed >> 32), h};
  std::mt19937 rng(seq);
  const float bound = 1.0f / std::sqrt(float(in));
  std::uniform_real_distribution<float> u(-bound, bound);
  std::vector<float> a(size_t(r) * size_t(in));
  for (float& x : a) x = u(rng);
  return a;
}

}  // namespace soltrain
