// `soltrain encode`: JSON lines {"text": ...} on stdin → {"ids": [...]} lines on stdout, with a tokenizer.json.
#include <iostream>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace soltrain {

std::function<int()> add_encode_command(CLI::App& app) {
  struct Opts {
    std::string tokenizer;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* c = app.add_subcommand("encode", "tokenize JSON lines {\"text\": ...} from stdin into {\"ids\": [...]}");
  c->add_option("--tokenizer", o->tokenizer, "tokenizer.json or a model folder holding one")->required();
  return [o]() {
    Tokenizer tok = Tokenizer::load(o->tokenizer);
    std::ios::sync_with_stdio(false);
    std::string line, out;
    for (size_t n = 1; std::getline(std::cin, line); ++n) {
      if (line.empty()) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::parse_error& e) {
        user_error("stdin line ", n, ": not valid JSON (", e.what(), ")");
      }
      if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
        user_error("stdin line ", n, ": expected an object with a string field \"text\"");
      const std::vector<int32_t> ids = tok.encode(j["text"].get_ref<const std::string&>());
      // Written by hand: much faster than building a json array for every line.
      out.assign("{\"ids\": [");
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i) out += ", ";
        out += std::to_string(ids[i]);
      }
      out += "]}\n";
      std::cout << out;
    }
    std::cout.flush();
    if (!std::cout) user_error("stdout: write failed");
    return 0;
  };
}

}  // namespace soltrain
