// A batch stored as safetensors (input_ids, targets I32/I64 [B,T]), as the reference fixtures and
// `soltrain dump` use it.
#pragma once
#include <filesystem>

#include "model/transformer.h"

namespace soltrain {

HostBatch load_batch_file(const std::filesystem::path& path);

}  // namespace soltrain
