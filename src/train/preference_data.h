// A DPO run's data: every preference dataset tokenized into its own cached shard folder (documents 2i, 2i+1
// = pair i's chosen and rejected answer, data/preference.h), validation pairs from validation_datasets or
// split off by ratio, and, for full fine-tuning, the reference model's sums stored next to the shards.
#pragma once
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include "data/shards.h"
#include "train/train_config.h"

namespace soltrain {

struct PreferenceData {
  ShardSet train, validation;  // two documents per pair
  std::string key;             // what the training pairs were made from (the reference cache's key)
};

PreferenceData prepare_preference_data(const TrainConfig& c, std::ostream& log);

// The reference's Σ NLL of every training document: read from dataset_prepared_path when a previous run (or
// the run being resumed) stored them for the same pairs, model and sequence_len; else `compute()`d and stored.
std::vector<float> cached_reference(const TrainConfig& c, const PreferenceData& d,
                                    const std::function<std::vector<float>()>& compute, std::ostream& log);

}  // namespace soltrain
