// Moving a Transformer's weights to and from Hugging Face model folders.
#pragma once
#include <filesystem>

#include "model/transformer.h"

namespace soltrain {

// Loads config.json and the weights of an HF folder onto the ops' device; with `lora`, the base is frozen
// and fresh adapters are added (see peft_adapter.h to load saved ones instead). `gradients`: Transformer's.
std::unique_ptr<Transformer> load_pretrained(const std::filesystem::path& dir, Ops& ops,
                                             std::optional<LoraConfig> lora = std::nullopt, bool gradients = true);

// Copies every base parameter from the checkpoint (adapters excepted); missing or mis-shaped tensors are
// UserErrors.
void load_weights(Transformer& model, const std::filesystem::path& dir);

// What a model folder carries besides config.json and the weights, as transformers' save_pretrained and the
// tokenizer's save write them (chat_template.jinja included: transformers 4.45+ keeps the template there): every
// folder soltrain writes from a model (full fine-tune, merged model) copies those the source has, and a hub
// model's download fetches them.
inline constexpr const char* kModelSideFiles[] = {
    "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
    "merges.txt",             "tokenizer.model", "added_tokens.json",   "chat_template.jinja"};
// Copies those of kModelSideFiles that `from` has into `to`; UserError naming a file that cannot be copied.
void copy_model_side_files(const std::filesystem::path& from, const std::filesystem::path& to);

// Writes an HF folder that transformers loads: config.json, safetensors (sharded past max_shard_bytes,
// with an index) and the tokenizer/generation files found in `source_dir`. Atomic: the folder appears
// complete or not at all. Full fine-tuning only: a LoRA model saves its adapter (peft_adapter.h).
void save_pretrained(const Transformer& model, const std::filesystem::path& out_dir,
                     const std::filesystem::path& source_dir, size_t max_shard_bytes = size_t(5) << 30);

}  // namespace soltrain
