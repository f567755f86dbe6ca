// Cheap checks of config.json against the checkpoint's tensors, made before the model allocates anything:
// a config claiming 10^6 layers or a 10^12-wide hidden size fails in milliseconds with a clear line instead
// of allocating gigabytes first.
#pragma once
#include <filesystem>

#include "io/safetensors.h"
#include "model/config.h"

namespace soltrain {

// UserError when the checkpoint cannot hold the model `c` describes: the last layer is missing, the
// embedding's shape disagrees, or the config needs more parameters than the checkpoint's tensors hold.
void check_config_fits_checkpoint(const ModelConfig& c, const CheckpointReader& ckpt, const std::filesystem::path& dir);

}  // namespace soltrain
