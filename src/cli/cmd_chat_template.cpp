// `soltrain chat-template`: JSON lines {"messages": [...], ...} on stdin → {"text", "ids"} lines, the
// model's chat template rendered as HF apply_chat_template renders it, then tokenized.
#include <iostream>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace soltrain {

std::function<int()> add_chat_template_command(CLI::App& app) {
  struct Opts {
    std::string tokenizer;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* c = app.add_subcommand(
      "chat-template", "render JSON lines {\"messages\": [...], <template variables>} into {\"text\", \"ids\"}");
  c->add_option("--tokenizer", o->tokenizer, "model folder with tokenizer.json and tokenizer_config.json")->required();
  return [o]() {
    const std::filesystem::path dir = o->tokenizer;
    Tokenizer tok = Tokenizer::load(dir / "tokenizer.json");
    const ChatTemplate tmpl = ChatTemplate::from_tokenizer_config(dir / "tokenizer_config.json");
    std::ios::sync_with_stdio(false);
    std::string line;
    for (size_t n = 1; std::getline(std::cin, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      nlohmann::ordered_json vars;  // ordered: tojson in templates shows keys in the input's order, as HF
      try {
        vars = nlohmann::ordered_json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        user_error("stdin line ", n, ": not valid JSON (", e.what(), ")");
      }
      if (!vars.is_object() || !vars.contains("messages") || !vars["messages"].is_array())
        user_error("stdin line ", n, ": expected an object with an array \"messages\"");
      // A null variable (e.g. "enable_thinking": null in fixtures) means "not given", as in HF.
      for (auto it = vars.begin(); it != vars.end();) it = it->is_null() ? vars.erase(it) : std::next(it);
      std::string text;
      try {
        text = tmpl.render(vars);
      } catch (const UserError& e) {
        user_error("stdin line ", n, ": ", e.what());
      }
      const nlohmann::ordered_json out = {{"text", text}, {"ids", tok.encode(text)}};
      std::cout << out.dump() << "\n";
    }
    std::cout.flush();
    if (!std::cout) user_error("stdout: write failed");
    return 0;
  };
}

}  // namespace soltrain
