// The multi-GPU settings of the peers' configs (Axolotl's and HF TrainingArguments' `fsdp`, `fsdp_config`,
// `fsdp_version` and `deepspeed`): what each asks of soltrain, read key by key into TrainConfig::peer_sharding,
// then, once every key is read, turned into soltrain's own settings: zero_stage (FULL_SHARD = ZeRO-3,
// SHARD_GRAD_OP = ZeRO-2, a DeepSpeed JSON's zero_optimization.stage) and the offload switches (FSDP's
// offload_params, DeepSpeed's offload_optimizer / offload_param), with one note saying what they became. The
// ranks stay soltrain's own (gpus: N or mpirun); FSDP's wrapping, prefetch and state-dict settings change
// nothing soltrain computes or writes and are accepted.
#pragma once
#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

#include "train/train_config.h"

namespace soltrain {

// The peer-key readers (cli/peer_keys.cpp's rows): UserError "key: ..." for a value they cannot mean.
void read_fsdp(const std::string& key, const YAML::Node& n, TrainConfig& c);
void read_fsdp_config(const std::string& key, const YAML::Node& n, TrainConfig& c);
void read_fsdp_version(const std::string& key, const YAML::Node& n, TrainConfig& c);
// `deepspeed`: a JSON file's path (from the working folder, as the Python tools open it; Axolotl's own
// deepspeed_configs/*.json by their known contents when the file is not there) or the JSON inline.
void read_deepspeed(const std::string& key, const YAML::Node& n, TrainConfig& c);

// After every key (cli/config.cpp's rules): the stage and offloads the read keys asked for, a note naming them,
// and problems (a conflicting zero_stage, DeepSpeed batch sizes other than the config's) into `errors`.
// `explicit_stage`: the config sets zero_stage itself, at `stage_where`.
void apply_peer_sharding(TrainConfig& c, bool explicit_stage, const std::string& stage_where,
                         std::vector<std::string>& errors);

}  // namespace soltrain
