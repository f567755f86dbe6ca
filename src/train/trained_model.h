// What a trained model's folder holds, written as the peers write theirs so their tools load it unchanged: a
// LoRA run's PEFT adapter naming its base by hub id, with the tokenizer files and a model card (README.md) beside
// it, as Axolotl's output has them; a full fine-tune's transformers folder in the base's own dtype (bf16 for a
// bf16 base, as HF Trainer, Axolotl and Surogate save it), with its card. One writer for the final output, the
// checkpoints and the Python API's save, so they cannot drift apart.
#pragma once
#include <filesystem>
#include <string>

#include "model/peft_adapter.h"
#include "model/transformer.h"
#include "train/train_config.h"

namespace soltrain {

// The base as an adapter names it: the hub id (and revision) the run was given, else the local folder.
AdapterBase adapter_base(const TrainConfig& c);

// The type a full fine-tune is saved as: `save_dtype` when set, else the base model's own (model_dtype).
DType save_dtype(const TrainConfig& c);

// Writes the trained model into `dir` (an existing, staged folder). `fp32_masters`: a full fine-tune's weights
// are the fp32 masters whatever save_dtype says (a checkpoint resumes from them bitwise).
void write_trained_model(const TrainConfig& c, const Transformer& model, const std::filesystem::path& dir,
                         bool fp32_masters = false);
// The same as a folder of its own, atomically (the final output, the Python API's save).
void save_trained_model(const TrainConfig& c, const Transformer& model, const std::filesystem::path& out_dir);

// README.md as the hub shows it: YAML front matter (base_model, library_name, tags, datasets) and how the model
// was trained and is loaded.
std::string model_card(const TrainConfig& c, bool lora);

}  // namespace soltrain
