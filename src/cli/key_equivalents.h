// Other tools' names for soltrain's settings that soltrain does not read (LLaMA-Factory's, HF
// TrainingArguments', TRL's, PEFT's): an unknown key is answered with its equivalent before any spelling guess
// ("cutoff_len" is LLaMA-Factory's sequence_len, not "a key two letters away"), and a config in
// LLaMA-Factory's format is named as such in one line with its keys' equivalents, not a dozen "unknown key"s.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace soltrain {

struct KeyEquivalent {
  const char* key;   // the other tool's key
  const char* tool;  // whose it is
  const char* use;   // what to write in soltrain ("sequence_len", "lora: true", ...)
};

// The equivalent of an unknown `key`, when a known tool names it.
std::optional<KeyEquivalent> key_equivalent(const std::string& key);

}  // namespace soltrain
