// Fuzz target: the chat-template engine — parse the input as a template and render a conversation.
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "tokenizer/jinja_template.h"
#include "tokenizer/jinja_value.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace soltrain;
  static const jinja::Value vars = jinja::from_json(nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"},
                 {"role": "assistant", "content": "<think>\nhm\n</think>\n\nhello", "tool_calls":
                   [{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
                 {"role": "tool", "content": "42"}, {"role": "user", "content": "thanks"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "enable_thinking": false, "bos_token": "<s>", "eos_token": "</s>"})"));
  const std::string source(reinterpret_cast<const char*>(data), size);
  fuzz::expect_only_user_errors([&] { (void)jinja::Template(source, "fuzz").render(*vars.dict); });
  return 0;
}
