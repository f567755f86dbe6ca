// GRPO's reward functions: built-in ones (what users write every time), Python ones with TRL's signature, either
// imported by a python3 process the run starts (`module.path:function` in YAML; python/soltrain/rewards.py
// compiled in) or called in the caller's process (soltrain.GRPOTrainer's callables, through `in_process`), and
// endpoints or commands given the batch as JSON (train/external_reward.h).
// Each scores a generation batch's completions: one value per completion, NaN where it returned None. A
// function that raises or returns the wrong count stops the run with one line naming it.
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "train/train_config.h"

namespace soltrain {

// One generation batch as the reward functions see it, completion by completion.
struct RewardRequest {
  std::vector<nlohmann::ordered_json> prompts;  // as the dataset gives them (text, or a conversation)
  std::vector<std::string> completions;         // decoded, special tokens skipped
  std::vector<std::vector<int32_t>> completion_ids;
  std::vector<nlohmann::ordered_json> records;  // the dataset record each came from (its other columns)
  bool conversational = false;                  // completions go to Python as [{role: assistant, content}]
};

// The built-in functions' names, for messages and the docs.
const std::vector<std::string>& builtin_reward_names();

// A built-in function's scores. accuracy: the completion's answer (the last \boxed{...}, else the text after the
// last "####", else the last number when the reference is a number, else the whole text) equals the record's
// `answer` (or `solution`, `ground_truth`) after normalisation (case, spaces, a trailing period; numbers by
// value): 1 or 0, NaN without a reference. think_format: 1 when the completion is <think>...</think> followed by an
// answer, else 0.
std::vector<double> builtin_reward(const std::string& name, const RewardRequest& r);

// The answer accuracy reads from a completion and the comparison it makes (exposed for tests).
std::string extract_answer(const std::string& completion, bool numeric_reference);
bool answers_match(const std::string& got, const std::string& want);

// A Python scorer in the caller's process: takes the request JSON, returns {"rewards": ...} or {"error": ...}.
using InProcessRewards = std::function<std::string(const std::string& request_json)>;

class RewardFunctions {
 public:
  // Every name of g.reward_funcs: built-in, or Python (`in_process` when given, else a python3 process importing
  // them, its imports resolved from `paths` too). Python that cannot start or import stops here, in one line.
  RewardFunctions(const GrpoSettings& g, const std::vector<std::string>& paths, InProcessRewards in_process = {});
  ~RewardFunctions();
  RewardFunctions(const RewardFunctions&) = delete;
  RewardFunctions& operator=(const RewardFunctions&) = delete;
  // The metrics' names (rewards/<name>/mean): the built-in name, or the Python function's.
  const std::vector<std::string>& names() const { return names_; }
  // [function][completion] scores (NaN: None).
  std::vector<std::vector<double>> score(const RewardRequest& r);

 private:
  std::string python_call(const std::string& request_line);  // a reply line from the Python side
  enum class Kind { Builtin, Python, External };             // external_reward.h: an endpoint or a command
  std::vector<std::string> specs_, names_;
  std::vector<Kind> kinds_;  // one per spec
  int timeout_s_ = 600;      // reward_timeout
  InProcessRewards in_process_;
  pid_t pid_ = -1;
  std::FILE *to_ = nullptr, *from_ = nullptr;
};

}  // namespace soltrain
