#include "train/grpo_rewards.h"

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <regex>

#include "core/error.h"
#include "rewards_script.h"
#include "train/external_reward.h"
#include "train/python_process.h"

namespace soltrain {

namespace {

constexpr double kNone = std::numeric_limits<double>::quiet_NaN();

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

// The text of the last \boxed{...} (braces balanced), or nothing.
std::optional<std::string> last_boxed(const std::string& s) {
  const size_t at = s.rfind("\\boxed{");
  if (at == std::string::npos) return std::nullopt;
  int depth = 0;
  for (size_t i = at + 6; i < s.size(); ++i) {
    if (s[i] == '{') ++depth;
    if (s[i] == '}' && --depth == 0) return s.substr(at + 7, i - at - 7);
  }
  return std::nullopt;
}

// A number as written ("1,234.5", "-3", "$12"), or nothing.
std::optional<double> as_number(std::string s) {
  s = trim(s);
  s.erase(std::remove(s.begin(), s.end(), ','), s.end());
  if (!s.empty() && s[0] == '$') s.erase(0, 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (*end != 0 || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::string normalised(const std::string& s) {
  std::string out;
  bool space = false;
  for (char ch : trim(s)) {
    if (std::isspace(static_cast<unsigned char>(ch))) {
      space = true;
      continue;
    }
    if (space && !out.empty()) out += ' ';
    space = false;
    out += char(std::tolower(static_cast<unsigned char>(ch)));
  }
  while (!out.empty() && (out.back() == '.' || out.back() == '$')) out.pop_back();
  if (!out.empty() && out[0] == '$') out.erase(0, 1);
  return out;
}

// The reference answer of a record: answer, solution or ground_truth (text or a number).
std::optional<std::string> reference_of(const nlohmann::ordered_json& rec) {
  for (const char* k : {"answer", "solution", "ground_truth"}) {
    const auto it = rec.find(k);
    if (it == rec.end() || it->is_null()) continue;
    if (it->is_string()) return it->get<std::string>();
    if (it->is_number()) return it->dump();
  }
  return std::nullopt;
}

}  // namespace

const std::vector<std::string>& builtin_reward_names() {
  static const std::vector<std::string> names{"accuracy", "think_format"};
  return names;
}

std::string extract_answer(const std::string& completion, bool numeric_reference) {
  if (auto b = last_boxed(completion)) return trim(*b);
  if (const size_t at = completion.rfind("####"); at != std::string::npos) return trim(completion.substr(at + 4));
  if (numeric_reference) {
    static const std::regex number(R"(-?\$?\d[\d,]*(\.\d+)?)");
    std::string last;
    for (std::sregex_iterator it(completion.begin(), completion.end(), number), end; it != end; ++it) last = it->str();
    if (!last.empty()) return last;
  }
  return trim(completion);
}

bool answers_match(const std::string& got, const std::string& want) {
  const auto a = as_number(got), b = as_number(want);
  if (a && b) return std::fabs(*a - *b) <= 1e-9 * std::max(1.0, std::fabs(*b));
  return normalised(got) == normalised(want);
}

std::vector<double> builtin_reward(const std::string& name, const RewardRequest& r) {
  std::vector<double> out(r.completions.size(), kNone);
  for (size_t i = 0; i < r.completions.size(); ++i) {
    const std::string& c = r.completions[i];
    if (name == "accuracy") {
      const auto ref = reference_of(r.records[i]);
      if (!ref) continue;
      out[i] = answers_match(extract_answer(c, as_number(*ref).has_value()), *ref) ? 1.0 : 0.0;
    } else if (name == "think_format") {
      static const std::regex form(R"(^\s*<think>[\s\S]*?</think>\s*\S[\s\S]*$)");
      out[i] = std::regex_match(c, form) ? 1.0 : 0.0;
    } else {
      SOLTRAIN_CHECK(false, "no built-in reward ", name);
    }
  }
  return out;
}

RewardFunctions::RewardFunctions(const GrpoSettings& g, const std::vector<std::string>& paths,
                                 InProcessRewards in_process)
    : specs_(g.reward_funcs), timeout_s_(g.reward_timeout), in_process_(std::move(in_process)) {
  const auto& builtins = builtin_reward_names();
  std::vector<std::string> py;
  for (const std::string& s : specs_) {
    if (std::find(builtins.begin(), builtins.end(), s) != builtins.end()) {
      kinds_.push_back(Kind::Builtin);
      names_.push_back(s);
      continue;
    }
    if (is_external_reward(s)) {
      check_external_reward(s);
      kinds_.push_back(Kind::External);
      names_.push_back(external_reward_name(s));
      continue;
    }
    kinds_.push_back(Kind::Python);
    const size_t colon = s.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == s.size())
      user_error("reward_funcs: \"", s, "\" is neither a built-in reward (accuracy, think_format), ",
                 "module.path:function, an http(s):// endpoint nor command:CMD");
    names_.push_back(s.substr(colon + 1));
    py.push_back(s);
  }
  if (py.empty() || in_process_) return;
  const PythonProcess proc = start_python(kRewardsScript, "reward_funcs");
  pid_ = proc.pid;
  to_ = proc.in;
  from_ = ::fdopen(proc.out, "r");
  const std::string reply = python_call(nlohmann::json{{"init", {{"functions", py}, {"paths", paths}}}}.dump());
  if (reply != "ready") {
    std::string why = reply;
    try {
      why = nlohmann::json::parse(reply).at("error").get<std::string>();
    } catch (const std::exception&) {
    }
    user_error(why);
  }
}

RewardFunctions::~RewardFunctions() {
  if (to_) std::fclose(to_);
  if (from_) std::fclose(from_);
  if (pid_ > 0) {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

std::string RewardFunctions::python_call(const std::string& line) {
  if (in_process_) return in_process_(line);
  const std::string gone = cat("reward_funcs: the Python process (", python_command(), ") ended: its message is above");
  if (std::fputs(line.c_str(), to_) < 0 || std::fputc('\n', to_) < 0 || std::fflush(to_) != 0) user_error(gone);
  std::string reply;
  for (int ch; (ch = std::fgetc(from_)) != EOF && ch != '\n';) reply += char(ch);
  if (reply.empty()) user_error(gone);
  return reply;
}

std::vector<std::vector<double>> RewardFunctions::score(const RewardRequest& r) {
  const size_t n = r.completions.size();
  std::vector<std::vector<double>> out(specs_.size());
  nlohmann::json py_funcs = nlohmann::json::array();
  bool external = false;
  for (size_t f = 0; f < specs_.size(); ++f)
    if (kinds_[f] == Kind::Python)
      py_funcs.push_back(specs_[f]);
    else if (kinds_[f] == Kind::External)
      external = true;
    else
      out[f] = builtin_reward(specs_[f], r);
  if (py_funcs.empty() && !external) return out;
  // The batch as TRL's reward functions take it (the endpoints and commands get the same, without "functions").
  nlohmann::ordered_json req;
  req["prompts"] = r.prompts;
  nlohmann::ordered_json comps = nlohmann::ordered_json::array();
  for (const std::string& c : r.completions)
    comps.push_back(r.conversational ? nlohmann::ordered_json::array({{{"role", "assistant"}, {"content", c}}})
                                     : nlohmann::ordered_json(c));
  req["completions"] = comps;
  req["completion_ids"] = r.completion_ids;
  nlohmann::ordered_json cols = nlohmann::ordered_json::object();
  for (size_t i = 0; i < n; ++i)
    for (const auto& [k, v] : r.records[i].items()) {
      if (k == "prompt" || k == "completion" || k == "completion_ids") continue;
      if (!cols.contains(k)) cols[k] = nlohmann::ordered_json::array();
      while (cols[k].size() < i) cols[k].push_back(nullptr);  // a record without the column: None
      cols[k].push_back(v);
    }
  for (auto& [k, v] : cols.items())
    while (v.size() < n) v.push_back(nullptr);
  req["columns"] = cols;
  if (external) {
    const std::string batch = req.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    for (size_t f = 0; f < specs_.size(); ++f)
      if (kinds_[f] == Kind::External) out[f] = external_reward(specs_[f], batch, n, timeout_s_);
  }
  if (py_funcs.empty()) return out;
  req["functions"] = py_funcs;
  const std::string reply = python_call(req.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(reply);
  } catch (const std::exception&) {
    user_error("reward_funcs: the Python side answered something that is not JSON: ", reply.substr(0, 200));
  }
  if (j.contains("error")) user_error(j["error"].get<std::string>());
  const auto& rows = j.at("rewards");
  size_t k = 0;
  for (size_t f = 0; f < specs_.size(); ++f) {
    if (kinds_[f] != Kind::Python) continue;
    std::vector<double>& v = out[f];
    for (const auto& x : rows.at(k++)) v.push_back(x.is_null() ? kNone : x.get<double>());
    SOLTRAIN_CHECK(v.size() == n, "reward ", specs_[f], ": ", v.size(), " values for ", n);
  }
  return out;
}

}  // namespace soltrain
