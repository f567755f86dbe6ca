// Keys of the peer tools' configs (Axolotl, Surogate) that soltrain has no key of that name for: what each
// means to soltrain. The README's "Keys from Axolotl and Surogate" table documents the same list.
#pragma once
#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

#include "train/train_config.h"

namespace soltrain {

// Applies `key` to `c` when it is a peer key: a soltrain setting under another name, a setting that is
// empty, false or already what soltrain does (accepted, nothing changes), or a feature soltrain lacks
// (UserError "key: ... not built yet; use ..." without a location; the caller adds the line).
// Returns false when `key` is not a peer key.
bool apply_peer_key(const std::string& key, const YAML::Node& value, TrainConfig& c);

// Sets the QLoRA base format `f` that `key` asks for (qlora_nf4, load_in_4bit, adapter: qlora, ...); two keys
// asking for different formats are a UserError naming both (`where`, when given, prefixes it).
void set_quantised_base(TrainConfig& c, WeightFormat f, const std::string& key, const std::string& where = "");

// A peer key's value as the peers read it: empty, null or false is "off" (is_off); as_bool takes YAML's booleans
// and an empty value as false, else UserError "key: \"v\" is not valid: expected true or false".
bool is_off(const YAML::Node& n);
bool as_bool(const std::string& key, const YAML::Node& n);

// Whether apply_peer_key takes `key` (the table's keys and the trackers' wandb_* / mlflow_* / ... families).
bool is_peer_key(const std::string& key);
// Every peer key, for "did you mean" suggestions.
std::vector<std::string> peer_key_names();

}  // namespace soltrain
