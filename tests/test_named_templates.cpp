// The named chat templates (`chat_template: llama3 | qwen3 | qwen_25 | chatml`) against jinja2's render of
// Axolotl's own template files (tests/tools/make_named_template_renders.py), character for character, over
// conversations that reach every branch: trimming, content parts, <think>, tool calls and responses, tools.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "data/named_templates.h"
#include "test_util.h"
#include "tokenizer/chat_template.h"

namespace soltrain {
namespace {

TEST(NamedTemplates, RenderAsAxolotlsTemplates) {
  std::ifstream in(test::fixtures() / "named_templates" / "axolotl_renders.jsonl");
  ASSERT_TRUE(in) << "missing fixture";
  std::string line;
  std::set<std::string> seen;
  int cases = 0;
  while (std::getline(in, line)) {
    const auto c = nlohmann::ordered_json::parse(line);
    const std::string name = c["template"];
    const auto source = named_chat_template(name);
    ASSERT_TRUE(source) << name;
    const ChatTemplate t(*source);
    // The variables as given (tools null where the conversation has none), keys in the input's order.
    nlohmann::ordered_json vars = c["variables"];
    if (vars["tools"].is_null()) vars.erase("tools");
    EXPECT_EQ(t.render(vars), c["rendered"].get<std::string>())
        << name << " / " << c["conversation"].get<std::string>() << " / generation prompt "
        << vars["add_generation_prompt"] << " / tools " << vars.contains("tools");
    seen.insert(name);
    ++cases;
  }
  EXPECT_EQ(seen, (std::set<std::string>{"chatml", "llama3", "qwen3", "qwen_25"}));
  EXPECT_GE(cases, 50);
}

// Llama 3's template writes the BOS itself, once, before the first turn (the tokenizer's bos_token).
TEST(NamedTemplates, Llama3WritesTheTokenizersBosOnce) {
  ChatTemplate t(*named_chat_template("llama3"));
  t.set_special_tokens("<B>", "<E>");
  const auto vars = nlohmann::ordered_json::parse(
      R"({"messages": [{"role": "user", "content": " hi "}, {"role": "assistant", "content": "yo\n"}]})");
  EXPECT_EQ(t.render(vars),
            "<B><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nyo<|eot_id|>");
}

TEST(NamedTemplates, UnknownNameIsNone) {
  EXPECT_FALSE(named_chat_template("tokenizer_default"));
  EXPECT_FALSE(named_chat_template("llama2"));
  EXPECT_EQ(named_chat_template_list(), "chatml, llama3, qwen3, qwen_25");
}

}  // namespace
}  // namespace soltrain
