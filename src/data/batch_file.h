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
void save_batch_file(const std::filesystem::path& path, const HostBatch& b);

}  // namespace soltrain
