// ChatTemplate: tokenizer_config.json loading and HF's rendering context around the Jinja engine.
#include "tokenizer/chat_template.h"

#include <ctime>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/input_file.h"
#include "io/json_file.h"
#include "tokenizer/jinja_error.h"

namespace soltrain {

ChatTemplate::ChatTemplate(const std::string& source) : template_(source, "chat template") {}

namespace {

// A special token in tokenizer_config.json: a string, an AddedToken object {"content": ...}, or null.
bool token_string(const nlohmann::json& j, const std::filesystem::path& path, const char* key, std::string* out) {
  if (!j.contains(key) || j[key].is_null()) return false;
  const auto& t = j[key];
  if (t.is_string()) {
    *out = t.get<std::string>();
    return true;
  }
  if (t.is_object() && t.contains("content") && t["content"].is_string()) {
    *out = t["content"].get<std::string>();
    return true;
  }
  user_error(path.string(), ": \"", key, "\" must be a string or an object with a \"content\" string");
}

std::string pick_template(const nlohmann::json& config, const std::filesystem::path& path, const std::string& name) {
  const auto& t = config["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (!t.is_array())
    user_error(path.string(), ": \"chat_template\" must be a string or a list of {\"name\", \"template\"}");
  std::string names;
  for (const auto& entry : t) {
    if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") || !entry["name"].is_string() ||
        !entry["template"].is_string())
      user_error(path.string(), ": each \"chat_template\" entry must be {\"name\": string, \"template\": string}");
    if (entry["name"] == name) return entry["template"].get<std::string>();
    names += (names.empty() ? "" : ", ") + entry["name"].get<std::string>();
  }
  user_error(path.string(), ": no chat template named \"", name, "\" (it has: ", names, ")");
}

jinja::Value strftime_now(jinja::CallArgs& a) {
  jinja::Value fmt = a.get(0, "format");
  if (!fmt.is_string()) throw jinja::EvalError("strftime_now expects a format string");
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[512];
  size_t n = std::strftime(buf, sizeof buf, fmt.str.c_str(), &local);
  return jinja::Value::from(std::string(buf, n));
}

}  // namespace

ChatTemplate ChatTemplate::from_tokenizer_config(const std::filesystem::path& path, const std::string& name) {
  nlohmann::json config = read_json_file(path);
  if (!config.is_object()) user_error(path.string(), ": expected a JSON object");
  std::string source;
  if (config.contains("chat_template") && !config["chat_template"].is_null()) {
    source = pick_template(config, path, name);
  } else {
    std::filesystem::path jinja_file = path.parent_path() / "chat_template.jinja";
    std::error_code ec;
    if (!std::filesystem::exists(jinja_file, ec))
      user_error(path.string(), ": no \"chat_template\" and no ", jinja_file.string(),
                 ": this tokenizer has no chat template");
    source = read_input_file(jinja_file, "a chat template");
  }
  try {
    ChatTemplate ct(source);
    ct.has_bos_ = token_string(config, path, "bos_token", &ct.bos_token_);
    ct.has_eos_ = token_string(config, path, "eos_token", &ct.eos_token_);
    return ct;
  } catch (const UserError& e) {
    user_error(path.string(), ": ", e.what());
  }
}

void ChatTemplate::set_special_tokens(std::string bos, std::string eos) {
  bos_token_ = std::move(bos);
  eos_token_ = std::move(eos);
  has_bos_ = has_eos_ = true;
}

std::string ChatTemplate::render(const nlohmann::json& variables) const {
  if (!variables.is_object()) user_error("chat template: the variables must be a JSON object");
  return render_values(*jinja::from_json(variables).dict);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& variables) const {
  if (!variables.is_object()) user_error("chat template: the variables must be a JSON object");
  return render_values(*jinja::from_json(variables).dict);
}

std::string ChatTemplate::render_values(jinja::Dict variables) const {
  // Defaults first: the caller's variables come later and win.
  jinja::Dict context;
  context.emplace_back("tools", jinja::Value::none());
  context.emplace_back("documents", jinja::Value::none());
  context.emplace_back("add_generation_prompt", jinja::Value::from(false));
  if (has_bos_) context.emplace_back("bos_token", jinja::Value::from(bos_token_));
  if (has_eos_) context.emplace_back("eos_token", jinja::Value::from(eos_token_));
  context.emplace_back("raise_exception", jinja::Value::function([](jinja::CallArgs& a) -> jinja::Value {
                         throw jinja::RaisedError(jinja::to_str(a.get(0, "message")));
                       }));
  context.emplace_back("strftime_now", jinja::Value::function(strftime_now));
  context.insert(context.end(), variables.begin(), variables.end());
  return template_.render(context);
}

}  // namespace soltrain
