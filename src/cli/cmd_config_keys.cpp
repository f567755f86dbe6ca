// `soltrain config-keys`: the config's key table (cli/config_schema.h) as Markdown (the README's key reference)
// or JSON (what the Python configs document their keyword arguments with).
#include <iostream>

#include "cli/commands.h"
#include "cli/config_schema.h"

namespace soltrain {

std::function<int()> add_config_keys_command(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  CLI::App* c =
      app.add_subcommand("config-keys", "print every config key: name, aliases, value, default, what it does");
  c->add_flag("--json", *json, "as JSON (default: a Markdown table per section)");
  return [json]() {
    if (*json)
      std::cout << config_keys_json().dump(1) << "\n";
    else
      std::cout << config_keys_markdown();
    return 0;
  };
}

}  // namespace soltrain
