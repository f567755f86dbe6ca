// Chat templates chosen by name (Axolotl's `chat_template:` key) instead of the model's own.
#pragma once
#include <optional>
#include <string>

namespace soltrain {

// The Jinja source of a named template, or nullopt for a name soltrain does not have. "tokenizer_default"
// (and "") mean the model's own template and are not names here.
std::optional<std::string> named_chat_template(const std::string& name);

// The names named_chat_template knows, for messages ("chatml, llama3, ...").
std::string named_chat_template_list();

}  // namespace soltrain
