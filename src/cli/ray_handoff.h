// A config that asks for a Ray job (use_ray, Surogate's distributed block): `soltrain sft` hands it to soltrain's
// Python Ray launcher (python/soltrain/ray.py), which starts the job's ranks as Ray actors. The engine is the same;
// Ray only places and starts the ranks.
#pragma once
#include <string>
#include <vector>

#include "train/train_config.h"

namespace soltrain {

// Replaces this process with `python3 -m soltrain.ray MODE CONFIG --set ...` (SOLTRAIN_PYTHON names another
// interpreter), which says what it starts; UserError in one line when that interpreter cannot import soltrain.ray and
// ray.
[[noreturn]] void hand_to_ray(const std::string& config, const std::vector<std::string>& set, TrainMode mode);

}  // namespace soltrain
