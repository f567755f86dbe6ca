// LoRA adapters as PEFT files: adapter_config.json + adapter_model.safetensors, read and written exactly as
// PeftModel.save_pretrained / from_pretrained do, so PEFT and vLLM load ours and we load theirs.
#pragma once
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "model/transformer.h"

namespace soltrain {

// The LoraConfig of an adapter folder. Features soltrain does not implement (DoRA, tied adapters, trained
// biases, per-layer ranks or alphas, layer subsets, ...) are UserErrors naming the key.
LoraConfig read_adapter_config(const std::filesystem::path& adapter_dir);

// The base model of `model_dir` with the adapter of `adapter_dir` loaded (frozen base, trainable adapter),
// the base held in `base` (QLoRA: Nf4 / Fp8Block quantise it on load).
// `vocab`: the base's embedding resized first, as the run that trained the adapter resized it (added tokens).
std::unique_ptr<Transformer> load_pretrained_with_adapter(const std::filesystem::path& model_dir,
                                                          const std::filesystem::path& adapter_dir, Ops& ops,
                                                          WeightFormat base = WeightFormat::Dense,
                                                          std::optional<VocabResize> vocab = std::nullopt);

// Copies every adapter tensor of `model` from adapter_model.safetensors; missing, mis-shaped or unused
// tensors are UserErrors.
void load_adapter_weights(Transformer& model, const std::filesystem::path& adapter_dir);

// Where an adapter's base model comes from, as PEFT writes it in adapter_config.json: the hub id (or local
// folder) PEFT and vLLM load the base from, and the hub revision when it is not the default branch.
struct AdapterBase {
  std::string name_or_path;
  std::string revision;  // empty: the default branch (PEFT's null)
};

// adapter_config.json as PEFT 0.21 writes it for this configuration; on a model whose LoRA targets gate/up/down
// adapt its experts (`moe`, MoeConfig::lora_on_experts) they are the experts' stacked parameters: target_parameters
// gate_up_proj (rank and alpha doubled by rank_pattern / alpha_pattern) and down_proj, as PEFT maps them for
// transformers 5. A classifier's is PEFT's SEQ_CLS task (a reward model) or TOKEN_CLS (a process reward model:
// `task_type`), its score head a module saved in full.
nlohmann::json adapter_config_json(const LoraConfig& lora, const AdapterBase& base, bool moe = false,
                                   const std::string& task_type = "CAUSAL_LM");
// PEFT's task type of a model: CAUSAL_LM, SEQ_CLS (a sequence classifier) or TOKEN_CLS (a token classifier).
std::string peft_task_type(const ModelConfig& c);

// Writes the adapter's two files (fp32 tensors under PEFT's names, metadata {"format": "pt"}) into `dir`, an
// existing (staged) folder. A base parameter trained beside the adapters (a reward model's score head) is saved as
// PEFT saves a modules_to_save module: base_model.model.<name>.
void write_adapter(const Transformer& model, const std::filesystem::path& dir, const AdapterBase& base);
// The same as a folder of its own, atomically.
void save_adapter(const Transformer& model, const std::filesystem::path& out_dir, const AdapterBase& base);

// A diverged run's adapter (NaN or inf in a tensor) loads and merges without a word otherwise, then
// generates token 0 forever: UserError naming the file, tensor and element.
void refuse_non_finite(const std::vector<float>& values, const std::filesystem::path& file, const std::string& name);
// Every tensor of an adapter file, checked as above (merge reads them lazily while it writes: checked first).
void check_adapter_finite(const SafetensorsFile& f, const std::filesystem::path& file);

}  // namespace soltrain
