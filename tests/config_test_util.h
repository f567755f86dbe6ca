// A minimal SFT config (model, output_dir, one dataset) with a test's keys appended, parsed: what the config
// reader says of those keys.
#pragma once
#include <string>

#include "cli/config.h"
#include "core/error.h"

namespace soltrain::test {

// The reader's one-line error for the minimal config plus `extra` (its keys start at line 6), or "" when it is
// accepted.
inline std::string config_error(const std::string& extra) {
  const std::string base = "model: m\noutput_dir: out\ndatasets:\n  - path: d.jsonl\n    type: conversation\n";
  try {
    parse_train_config(base + extra, "cfg.yaml", {}, TrainMode::kSft);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace soltrain::test
