// The config's keys as one table: each key's name, the peers' names for it (Axolotl, Surogate, TRL,
// transformers), the value it takes, its default, one line of documentation and which commands read it. The
// YAML reader looks keys up here (cli/config.cpp); `soltrain config-keys` prints the table: --markdown is the
// README's key reference (a test compares them), --json what the Python configs document their keyword
// arguments with. Keys of the peers' configs that soltrain has no setting of its own for are cli/peer_keys.h's.
#pragma once
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/config_values.h"
#include "train/train_config.h"

namespace soltrain {

// What a key's reader writes into and resolves against.
struct ReadContext {
  TrainConfig& c;
  TrainMode mode;
  const std::string& file;     // the config's name, for messages
  std::filesystem::path base;  // relative paths are relative to this folder (the config file's)
};

enum CommandBit : unsigned { kSftBit = 1, kPtBit = 2, kDpoBit = 4, kGrpoBit = 8, kEveryCommand = 15 };

struct KeySpec {
  std::string name;
  std::vector<std::string> aliases;   // the same setting under the peers' names
  std::string type;                   // bool, integer, number, string, path, choice, list, datasets, map
  std::string expected;               // what a value must be: "an integer >= 1", "cosine, linear, ..."
  std::string default_value;          // as the docs show it; "" for none
  std::string doc;                    // one line
  unsigned commands = kEveryCommand;  // which of sft, pt, dpo, grpo read it
  std::string section;
  // Reads the value into ctx.c; `key` is the name as written (an alias names itself in messages).
  std::function<void(const Entry&, const std::string& key, ReadContext&)> read;
};

// In the README's order: by section, then as listed.
// `optimizer: NAME` (HF Trainer's, Axolotl's and torchao's names) set on c; false for a name soltrain lacks, whose
// reason optimizer_refusal gives. Shared by the config key and `bench --optimizer`.
bool set_optimizer(TrainConfig& c, const std::string& name);
std::string optimizer_refusal(const std::string& name);

const std::vector<KeySpec>& config_keys();
// By name or alias; nullptr for neither.
const KeySpec* find_config_key(const std::string& name);
// Every name and alias, for "did you mean" suggestions.
std::vector<std::string> config_key_names();

std::string config_keys_markdown();
nlohmann::json config_keys_json();

}  // namespace soltrain
