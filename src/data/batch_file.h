// A batch stored as safetensors (input_ids, targets I32/I64 [B,T]), as the reference fixtures and
// `soltrain dump` use it.
#pragma once
#include <filesystem>

#include "model/transformer.h"

namespace soltrain {

// Reads input_ids and targets, and positions / cu_seqlens (packed documents) when the file has them.
HostBatch load_batch_file(const std::filesystem::path& path);
// Writes a batch with its document layout (what `sft --dump-batches` leaves for checks against other
// trainers).
// Preference batches add "pairs" ([P, 2]: each pair's chosen and rejected document) and, for full fine-tuning,
// "ref_nll" (F32: the reference's Σ NLL of those documents).
void save_batch_file(const std::filesystem::path& path, const HostBatch& b);

// `--dump-batches DIR`: an update's micro-batches as DIR/step-S-micro-M.safetensors.
void save_update_batches(const std::filesystem::path& dir, int64_t step, const std::vector<HostBatch>& micro);

}  // namespace soltrain
