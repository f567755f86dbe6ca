// A LLaMA-Factory training config (`llamafactory-cli train config.yaml`: stage, model_name_or_path, finetuning_type,
// dataset names looked up in dataset_dir/dataset_info.json, template, cutoff_len, pref_*, ...) rewritten into
// soltrain's keys as LLaMA-Factory (v0.9.5, hparams/*_args.py) means them, its defaults included where they differ
// from soltrain's (lora_alpha 2 x lora_rank, cutoff_len 2048, packing for pt, HF TrainingArguments' learning rate,
// epochs, schedule and batch size). Keys both read alike (output_dir, learning_rate, ... of TrainingArguments) pass
// through. Each dataset becomes a `datasets` entry whose `llama_factory` mapping is its dataset_info.json entry plus
// the template, cutoff_len and train_on_prompt: data/llama_factory.h renders it as LLaMA-Factory does.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "cli/config_values.h"
#include "train/train_config.h"

namespace soltrain {

struct LlamaFactoryTranslation {
  std::vector<std::pair<std::string, Entry>> keys;  // soltrain's, in the file's order
  TrainMode mode;                                   // what `stage` picks (pt, or sft for sft / dpo / kto / rm)
  std::vector<std::string> notes;                   // what became what
};

// Whether `keys` are a LLaMA-Factory config's (two or more of the keys only it has).
bool is_llama_factory_config(const std::vector<std::string>& keys);
// The translation; UserError (one line naming the key) for what soltrain cannot run as LLaMA-Factory would.
// Relative paths (dataset_dir) are kept as written: LLaMA-Factory opens them from the working folder.
LlamaFactoryTranslation translate_llama_factory(const std::vector<std::pair<std::string, Entry>>& keys,
                                                const std::string& where, TrainMode mode);

}  // namespace soltrain
