// Hub ids in a training config (`model: Org/Name`, dataset `path: org/name`) → local files in the Hugging
// Face cache, downloaded when missing (see hub/hub_resolve.h). Called by the commands before anything
// else reads the model or data, so the rest of soltrain sees only local paths.
#pragma once
#include <ostream>

#include "train/train_config.h"

namespace soltrain {

// Replaces c.model and the hub datasets' paths (a dataset of several files becomes one entry per file,
// each with the same type and fields) with local paths; says on `log` what it resolved. A dataset's files are
// chosen as datasets.load_dataset chooses them: `data_files` (also within a local folder), else the card's configs
// (`name`, else the default config), else the files whose names say the split.
void resolve_hub_inputs(TrainConfig& c, std::ostream& log);

// A --model argument: itself when it exists or is no hub id, else the hub model's folder (revision main).
std::filesystem::path local_or_hub_model(const std::string& arg, std::ostream& log);

}  // namespace soltrain
