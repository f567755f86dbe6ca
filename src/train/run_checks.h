// What a training run's config asks for, checked against the model folder before any work: the folder is
// there, and the sizes fit the model (sequence_len within max_position_embeddings) and an int.
#pragma once
#include "train/train_config.h"

namespace soltrain {

// UserError naming the key, the value and the limit.
void check_run_inputs(const TrainConfig& c);

}  // namespace soltrain
