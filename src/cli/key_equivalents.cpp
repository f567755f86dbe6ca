#include "cli/key_equivalents.h"

#include <algorithm>

#include "core/error.h"

namespace soltrain {

namespace {

constexpr const char* kLlamaFactory = "LLaMA-Factory";
constexpr const char* kTrainingArguments = "HF TrainingArguments";
constexpr const char* kTrl = "TRL";
constexpr const char* kPeft = "PEFT";

// Sources: LLaMA-Factory's examples/train_lora/*.yaml and hparams/*_args.py; transformers' TrainingArguments;
// TRL's SFTConfig / DPOConfig; PEFT's LoraConfig; Axolotl's config reference.
constexpr KeyEquivalent kEquivalents[] = {
    {"model_name_or_path", kLlamaFactory, "model"},
    {"stage", kLlamaFactory, "the command: soltrain sft, pt or dpo"},
    {"do_train", kLlamaFactory, "nothing (soltrain sft trains)"},
    {"finetuning_type", kLlamaFactory, "lora: true (or nothing for full)"},
    {"lora_target", kLlamaFactory, "lora_target_modules (all-linear for all)"},
    {"dataset", kLlamaFactory, "datasets: [{path: ..., type: ...}]"},
    {"dataset_dir", kLlamaFactory, "datasets' paths"},
    {"template", kLlamaFactory, "chat_template"},
    {"cutoff_len", kLlamaFactory, "sequence_len"},
    {"max_samples", kLlamaFactory, "a dataset's samples"},
    {"val_size", kLlamaFactory, "val_set_size"},
    {"pref_beta", kLlamaFactory, "beta"},
    {"pref_loss", kLlamaFactory, "loss_type"},
    {"quantization_bit", kLlamaFactory, "qlora_nf4: true (4) or qlora_fp8: true (8)"},
    {"plot_loss", kLlamaFactory, "nothing (training_curves.svg is always written)"},
    {"overwrite_cache", kLlamaFactory, "nothing (the cache is reused only when its inputs match)"},
    {"preprocessing_num_workers", kLlamaFactory, "nothing (tokenizing uses every core)"},
    {"trust_remote_code", kLlamaFactory, "nothing (soltrain runs no model code)"},
    {"max_seq_length", kTrl, "sequence_len"},
    {"max_length", kTrl, "sequence_len"},
    {"packing", kTrl, "sample_packing"},
    {"completion_only_loss", kTrl, "train_on_inputs: false"},
    {"assistant_only_loss", kTrl, "train_on_inputs: false"},
    {"dataset_text_field", kTrl, "a dataset's field (type: completion, field: ...)"},
    {"max_prompt_length", kTrl, "max_prompt_len"},
    {"dataset_name", kTrl, "datasets: [{path: org/name}]"},
    {"eval_strategy", kTrainingArguments, "eval_steps (or evals_per_epoch)"},
    {"evaluation_strategy", kTrainingArguments, "eval_steps (or evals_per_epoch)"},
    {"logging_strategy", kTrainingArguments, "logging_steps"},
    {"optim", kTrainingArguments, "optimizer"},
    {"save_safetensors", kTrainingArguments, "nothing (always safetensors)"},
    {"per_device_eval_batch_size", kTrainingArguments, "nothing (evaluation batches as training does)"},
    {"r", kPeft, "lora_rank"},
    {"target_modules", kPeft, "lora_target_modules"},
};

}  // namespace

std::optional<KeyEquivalent> key_equivalent(const std::string& key) {
  for (const KeyEquivalent& e : kEquivalents)
    if (key == e.key) return e;
  return std::nullopt;
}

}  // namespace soltrain
