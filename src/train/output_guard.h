// Before a training run does any work: its output_dir is its own or empty (or the user said
// overwrite_output_dir), nothing it replaces holds an input, and leftovers of killed runs are cleaned up.
#pragma once
#include <ostream>

#include "io/output_lock.h"
#include "train/train_config.h"

namespace soltrain {

// UserError when the run would write over something it did not write or over its own inputs, or when
// another run holds output_dir; otherwise creates output_dir, locks it for the returned lock's life (one run
// per folder, io/output_lock.h), marks it as a soltrain output and removes stale partial files (said on `log`).
[[nodiscard]] OutputLock prepare_run_outputs(const TrainConfig& c, std::ostream& log);

}  // namespace soltrain
