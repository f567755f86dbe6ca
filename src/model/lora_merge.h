// Folding a LoRA adapter into its base model: W + scale·B·A, written as a Hugging Face folder.
#pragma once
#include <filesystem>

namespace soltrain {

// Reads the base folder and the PEFT adapter and writes `out_dir` (atomically) with every adapted weight
// merged in fp32 and stored in the base tensor's dtype; other tensors, config.json and tokenizer files are
// copied unchanged, so the result loads wherever the base did (what PEFT's merge_and_unload saves).
void merge_adapter(const std::filesystem::path& model_dir, const std::filesystem::path& adapter_dir,
                   const std::filesystem::path& out_dir, size_t max_shard_bytes = size_t(5) << 30);

}  // namespace soltrain
