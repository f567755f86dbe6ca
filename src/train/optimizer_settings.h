// Which optimizer settings cannot run together, written once: the config rule (cli/config.cpp) puts each line
// at the key's place in the file, and bench (which builds a TrainConfig without the config rules) prints the same
// lines. TrainStep keeps only internal checks behind them.
#pragma once
#include <string>
#include <vector>

#include "train/train_config.h"

namespace soltrain {

struct SettingRefusal {
  std::string key;   // the setting the line is about (the config rule's location for it)
  std::string text;  // the line, starting with the setting's name
};
std::vector<SettingRefusal> optimizer_setting_refusals(const TrainConfig& c);

}  // namespace soltrain
