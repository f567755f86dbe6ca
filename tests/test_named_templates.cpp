// The named chat templates (`chat_template: llama3 | qwen3 | qwen_25 | chatml`) against jinja2's render of
// Axolotl's own template files (tests/tools/make_named_template_renders.py), character for character, over
// conversations that reach every branch: trimming, content parts, <think>, tool calls and responses, tools.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "data/named_templates.h"
#include "data/record_encoder.h"
#include "data_test_util.h"
#include "test_util.h"
#include "tokenizer/chat_template.h"

namespace soltrain {
namespace {

// A named template (or a dataset's jinja) on a base model whose tokenizer has no chat template of its own (Axolotl's
// mistral orpo example: Mistral-7B-v0.1 with chat_template: chatml) takes only the tokenizer's bos/eos; the model's
// own template, asked for, is still one line.
TEST(NamedTemplates, NeedNoTemplateInTheTokenizer) {
  test::TempDir t;
  test::write_text(t.path / "tokenizer_config.json",
                   R"({"bos_token": "<s>", "eos_token": {"content": "</s>", "special": true}})");
  const nlohmann::json vars = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  const ChatTemplate chatml = chat_template_for("chatml", "", t.path / "tokenizer_config.json");
  EXPECT_EQ(chatml.render(vars), "<|im_start|>user\nhi<|im_end|>\n");
  EXPECT_EQ(chatml.bos_token(), "<s>");
  EXPECT_EQ(chatml.eos_token(), "</s>");
  const ChatTemplate own = chat_template_for("jinja", "{{ bos_token }}{{ messages[0]['content'] }}{{ eos_token }}",
                                             t.path / "tokenizer_config.json");
  EXPECT_EQ(own.render(vars), "<s>hi</s>");
  EXPECT_NE(test::user_error_text([&] {
              chat_template_for("", "", t.path / "tokenizer_config.json");
            }).find("this tokenizer has no chat template"),
            std::string::npos);
}

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
