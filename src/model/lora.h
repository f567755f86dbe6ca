// LoRA adapters: their configuration (PEFT's meaning of r, lora_alpha, use_rslora, target_modules) and the
// names their tensors carry, which are PEFT's saved names so files and gradients need no translation.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace soltrain {

// The projections LoRA can adapt, in the order a decoder layer runs them. This is the one table of their
// names (HF module names, PEFT's target_modules): configs, PEFT files and the model all read it.
enum class LoraTarget { q, k, v, o, gate, up, down };
inline constexpr int kLoraTargets = 7;
inline constexpr std::array<const char*, kLoraTargets> kLoraModuleNames = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                                           "gate_proj", "up_proj", "down_proj"};
inline bool is_attention_target(LoraTarget t) {  // self_attn.* (else mlp.*)
  return int(t) <= int(LoraTarget::o);
}
inline std::vector<std::string> all_lora_module_names() {
  return {kLoraModuleNames.begin(), kLoraModuleNames.end()};
}

struct LoraConfig {
  int r = 8;
  float alpha = 16;
  float dropout = 0;                        // on the adapter's input only, in training steps
  std::vector<std::string> target_modules;  // names from kLoraModuleNames
  bool use_rslora = false;                  // scale alpha / sqrt(r) instead of alpha / r
  uint64_t seed = 0;  // adapter initialisation and the dropout masks
  // QLoRA: how the frozen projections (q, k, v, o, gate, up, down) of the base are held. Dense keeps them
  // in the compute dtype; Nf4 / Fp8Block quantise them on load (or keep a pre-quantised FP8 checkpoint as
  // stored). Embedding, LM head, norms and biases stay dense.
  WeightFormat base_format = WeightFormat::Dense;
  // `offload_weights`: the frozen base's decoder layers in host memory, streamed through the device a layer
  // at a time (model/weight_stream.h), but for `offload_resident_layers` of them that stay on the device
  // (`offload_weights_resident_layers`). A dense base only.
  bool offload_base = false;
  int offload_resident_layers = 0;
  // Read from an adapter's target_parameters (PEFT's MoE experts): gate/up/down name experts, so the model must
  // have MoE layers.
  bool expert_targets = false;
  // Asked for as `all-linear` (PEFT's shorthand): on an MoE model PEFT adapts more than our seven projections
  // (Qwen3-MoE: the router too, `router` below).
  bool all_linear = false;
  // Qwen3-MoE's router (mlp.gate.weight, PEFT's target_parameters "gate.weight"): set by all-linear on such a
  // model, or read from an adapter.
  bool router = false;
  // Qwen2-MoE's shared_expert_gate (a [1, hidden] Linear; PEFT's target_modules "shared_expert_gate"): set by
  // all-linear on such a model, or read from an adapter.
  bool shared_expert_gate = false;
  // PEFT's modules_to_save (Axolotl's lora_modules_to_save): embed_tokens and / or lm_head trained in full beside
  // the adapters and saved with them (base_model.model.<name>); on a tied model two untied copies, as PEFT makes them.
  std::vector<std::string> modules_to_save;
  bool saves(const std::string& module) const {
    return std::find(modules_to_save.begin(), modules_to_save.end(), module) != modules_to_save.end();
  }

  // PEFT's init_lora_weights "loftq" (model/loftq.h) with this many iterations; 0: PEFT's default initialisation.
  // (Last: the fields above are brace-initialised in order.)
  int loftq_iter = 0;

  // scale · B·A is what the adapter adds to a weight.
  float scale() const;
  bool targets(LoraTarget t) const;
  // Checks r, alpha, dropout and module names; a UserError names `source` (a config file) and the key.
  void validate(const std::string& source) const;
};

// HF module path of a projection ("model.layers.3.self_attn.q_proj").
std::string lora_module_path(int layer, LoraTarget t);
// PEFT's saved tensor names: "base_model.model.<module path>.lora_A.weight" / "...lora_B.weight".
std::string lora_a_name(int layer, LoraTarget t);
std::string lora_b_name(int layer, LoraTarget t);
bool is_lora_name(const std::string& name);

// A's PEFT initialisation (kaiming_uniform_ with a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in))), deterministic
// in (seed, tensor name). B starts at zero, so a fresh adapter leaves the model unchanged.
std::vector<float> lora_a_init(int r, int in, uint64_t seed, const std::string& name);

}  // namespace soltrain
