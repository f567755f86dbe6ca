// GRPO rewards computed outside soltrain and outside Python: an HTTP endpoint (reward_funcs entry
// "http://host:8000/score", POSTed the generation batch as JSON) or a command ("command:./score.sh", started per
// batch with the JSON on its stdin; its stderr is the run's). The JSON is what Python reward functions get:
// {"prompts", "completions", "completion_ids", "columns": {name: [one value per completion]}}. The answer is a
// JSON list with one number (or null: no score) per completion, or {"rewards": [...]}. Anything else (an HTTP
// error, a command that fails, the wrong count, reward_timeout passed) stops the run with one line naming it.
#pragma once
#include <string>
#include <vector>

namespace soltrain {

// Whether a reward_funcs entry names an endpoint or a command.
bool is_external_reward(const std::string& spec);
// One line (UserError) when such an entry cannot be used: not an http(s) URL, or no command after "command:".
void check_external_reward(const std::string& spec);
// Its name in the metrics (rewards/<name>/mean): the URL's last path segment (else its host), or the command's
// last word's file name without extension ("command:python3 rewards/length.py" -> "length").
std::string external_reward_name(const std::string& spec);
// The scores of `n` completions (NaN: null).
std::vector<double> external_reward(const std::string& spec, const std::string& request_json, size_t n, int timeout_s);
// The answer's scores (exposed for tests): one line naming `spec` when it is not n numbers or nulls.
std::vector<double> parse_reward_answer(const std::string& spec, const std::string& answer, size_t n);

}  // namespace soltrain
