// ChatTemplate against Hugging Face: the models' own templates on the chat fixtures (text rendered by
// transformers), hand-made Qwen3 tool/reasoning conversations, and tokenizer_config.json loading.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/error.h"
#include "io/json_file.h"
#include "test_util.h"
#include "tokenizer/chat_template.h"

namespace soltrain {
namespace {

namespace fs = std::filesystem;

// The folder holding <name>/tokenizer_config.json: the build's SOLTRAIN_TOKENIZERS, else the environment's.
std::optional<fs::path> tokenizer_config(const std::string& name) {
  std::vector<fs::path> roots;
#ifdef SOLTRAIN_TOKENIZERS
  roots.emplace_back(SOLTRAIN_TOKENIZERS);
#endif
  if (const char* env = std::getenv("SOLTRAIN_TOKENIZERS")) roots.emplace_back(env);
  for (const auto& r : roots)
    if (fs::exists(r / name / "tokenizer_config.json")) return r / name / "tokenizer_config.json";
  return std::nullopt;
}

#define REQUIRE_TOKENIZER(var, name)                                                                          \
  auto var = tokenizer_config(name);                                                                          \
  if (!var)                                                                                                   \
    GTEST_SKIP() << name << "/tokenizer_config.json not found: set SOLTRAIN_TOKENIZERS (build definition or " \
                 << "environment) to the folder tests/tools/fetch_tokenizers.sh fills with qwen3/ and llama3/";

// Renders every {messages, add_generation_prompt, enable_thinking, text} entry; returns how many match.
void check_fixtures(const fs::path& config, const std::string& fixture) {
  ChatTemplate t = ChatTemplate::from_tokenizer_config(config);
  nlohmann::json entries = read_json_file(test::fixtures() / "tokenizer" / fixture);
  ASSERT_FALSE(entries.empty());
  size_t matched = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    nlohmann::ordered_json vars;
    vars["messages"] = nlohmann::ordered_json::parse(e["messages"].dump());
    vars["add_generation_prompt"] = e["add_generation_prompt"].get<bool>();
    if (!e["enable_thinking"].is_null()) vars["enable_thinking"] = e["enable_thinking"].get<bool>();
    std::string got = t.render(vars);
    EXPECT_EQ(got, e["text"].get<std::string>()) << fixture << " entry " << i;
    matched += got == e["text"].get<std::string>();
  }
  EXPECT_EQ(matched, entries.size());
}

TEST(ChatTemplate, Qwen3MatchesEveryFixture) {
  REQUIRE_TOKENIZER(config, "qwen3");
  check_fixtures(*config, "qwen3_chat.json");
}

TEST(ChatTemplate, Llama3MatchesEveryFixture) {
  REQUIRE_TOKENIZER(config, "llama3");
  check_fixtures(*config, "llama3_chat.json");
}

struct Conversation {
  const char* name;
  const char* variables;
  const char* expected;
};

// Branches of the Qwen3 template the fixtures do not reach. Each expected text follows from reading the
// template, and was cross-checked with jinja2 3.1.6 set up as transformers sets it up.
const Conversation kQwen3Conversations[] = {
    // With tools, the system message goes first in the one system turn, then the tool list (one tojson line per tool,
    // keys in input order).
    {"tools_with_system",
     R"json({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}], "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}], "add_generation_prompt": true})json",
     R"txt(<|im_start|>system
Be brief.

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
<|im_start|>user
Weather in Paris?<|im_end|>
<|im_start|>assistant
)txt"},
    // With tools and no system message, the system turn holds only the tool list; no generation prompt.
    {"tools_no_system",
     R"json({"messages": [{"role": "user", "content": "Hi"}], "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}, {"type": "function", "function": {"name": "now", "parameters": {}}}], "add_generation_prompt": false})json",
     R"txt(<|im_start|>system
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
{"type": "function", "function": {"name": "now", "parameters": {}}}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
<|im_start|>user
Hi<|im_end|>
)txt"},
    // The last user query is message 0, so both later assistant turns show their reasoning_content (stripped of
    // newlines) in <think>; tool_calls with a "function" wrapper, arguments as a dict (tojson) or as a string
    // (verbatim); no newline before the first call when content is empty; consecutive tool messages share one user
    // turn.
    {"tool_round_trip",
     R"json({"messages": [{"role": "user", "content": "Weather in Paris and Rome?"}, {"role": "assistant", "content": "", "reasoning_content": "Need two calls.", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}, {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]}, {"role": "tool", "content": "{\"temp\": 21}"}, {"role": "tool", "content": "{\"temp\": 25}"}, {"role": "assistant", "content": "Paris 21°C, Rome 25°C.", "reasoning_content": "\nBoth warm.\n"}], "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}], "add_generation_prompt": false})json",
     R"txt(<|im_start|>system
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
<|im_start|>user
Weather in Paris and Rome?<|im_end|>
<|im_start|>assistant
<think>
Need two calls.
</think>

<tool_call>
{"name": "get_weather", "arguments": {"city": "Paris"}}
</tool_call>
<tool_call>
{"name": "get_weather", "arguments": {"city": "Rome"}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
{"temp": 21}
</tool_response>
<tool_response>
{"temp": 25}
</tool_response><|im_end|>
<|im_start|>assistant
<think>
Both warm.
</think>

Paris 21°C, Rome 25°C.<|im_end|>
)txt"},
    // reasoning_content of an assistant turn before the last user query is dropped; the last turn's inline <think> is
    // split off and re-emitted.
    {"history_reasoning_dropped",
     R"json({"messages": [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1", "reasoning_content": "old thoughts"}, {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "<think>\nnew thoughts\n</think>\n\nA2"}], "add_generation_prompt": false})json",
     R"txt(<|im_start|>user
Q1<|im_end|>
<|im_start|>assistant
A1<|im_end|>
<|im_start|>user
Q2<|im_end|>
<|im_start|>assistant
<think>
new thoughts
</think>

A2<|im_end|>
)txt"},
    // A tool call without the "function" wrapper; content before the first call gets a newline; enable_thinking=false
    // adds the empty think block after the generation prompt.
    {"tool_call_with_content_no_function_wrapper",
     R"json({"messages": [{"role": "user", "content": "Go"}, {"role": "assistant", "content": "Calling.", "tool_calls": [{"name": "now", "arguments": {}}]}, {"role": "tool", "content": "12:00"}], "add_generation_prompt": true, "enable_thinking": false})json",
     R"txt(<|im_start|>user
Go<|im_end|>
<|im_start|>assistant
Calling.
<tool_call>
{"name": "now", "arguments": {}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
12:00
</tool_response><|im_end|>
<|im_start|>assistant
<think>

</think>

)txt"},
    // A user message that is entirely a <tool_response> does not count as a query, so the last query is message 0 and
    // the middle assistant turn keeps its reasoning.
    {"user_tool_response_is_not_a_query",
     R"json({"messages": [{"role": "user", "content": "Start"}, {"role": "assistant", "content": "mid", "reasoning_content": "r1"}, {"role": "user", "content": "<tool_response>\nok\n</tool_response>"}, {"role": "assistant", "content": "end", "reasoning_content": "r2"}], "add_generation_prompt": false})json",
     R"txt(<|im_start|>user
Start<|im_end|>
<|im_start|>assistant
<think>
r1
</think>

mid<|im_end|>
<|im_start|>user
<tool_response>
ok
</tool_response><|im_end|>
<|im_start|>assistant
<think>
r2
</think>

end<|im_end|>
)txt"},
    // A system message that is not first renders as an ordinary turn.
    {"system_only_later",
     R"json({"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "late system"}], "add_generation_prompt": false})json",
     R"txt(<|im_start|>user
a<|im_end|>
<|im_start|>system
late system<|im_end|>
)txt"},
};

TEST(ChatTemplate, Qwen3ToolsToolCallsAndReasoning) {
  REQUIRE_TOKENIZER(config, "qwen3");
  ChatTemplate t = ChatTemplate::from_tokenizer_config(*config);
  for (const auto& c : kQwen3Conversations)
    EXPECT_EQ(t.render(nlohmann::ordered_json::parse(c.variables)), c.expected) << c.name;
}

TEST(ChatTemplate, ToolKeyOrderFollowsTheJsonType) {
  ChatTemplate t("{{ tools[0] | tojson }}");
  const char* vars = R"({"tools": [{"type": "function", "function": {"name": "f"}}]})";
  // ordered_json keeps the input order, as a Python dict would; nlohmann::json sorts keys.
  EXPECT_EQ(t.render(nlohmann::ordered_json::parse(vars)), R"({"type": "function", "function": {"name": "f"}})");
  EXPECT_EQ(t.render(nlohmann::json::parse(vars)), R"({"function": {"name": "f"}, "type": "function"})");
}

TEST(ChatTemplate, DefaultsLikeApplyChatTemplate) {
  // tools and documents are defined (none), add_generation_prompt is false, bos/eos come from the config.
  ChatTemplate t("{{ tools is none }} {{ documents is defined }} {{ add_generation_prompt }} [{{ bos_token }}]");
  EXPECT_EQ(t.render(nlohmann::json::object()), "True True False []");
  t.set_special_tokens("<s>", "</s>");
  EXPECT_EQ(t.render(nlohmann::json::object()), "True True False [<s>]");
  EXPECT_EQ(t.render(nlohmann::json::parse(R"({"bos_token": "B", "add_generation_prompt": true})")),
            "True True True [B]");
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text;
}

TEST(ChatTemplate, LoadsStringOrNamedTemplatesAndTokenObjects) {
  test::TempDir dir;
  fs::path cfg = dir.path / "tokenizer_config.json";
  write(cfg, R"({"chat_template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}",
                 "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
                 "eos_token": "</s>"})");
  ChatTemplate t = ChatTemplate::from_tokenizer_config(cfg);
  EXPECT_EQ(t.bos_token(), "<s>");
  EXPECT_EQ(t.render(nlohmann::json::parse(R"({"messages": [{"content": "hi"}]})")), "<s>hi</s>");

  write(cfg, R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})");
  EXPECT_EQ(ChatTemplate::from_tokenizer_config(cfg).render(nlohmann::json::object()), "D");
  EXPECT_EQ(ChatTemplate::from_tokenizer_config(cfg, "tool_use").render(nlohmann::json::object()), "T");
  try {
    ChatTemplate::from_tokenizer_config(cfg, "rag");
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("no chat template named \"rag\" (it has: tool_use, default)"),
              std::string::npos);
  }
}

TEST(ChatTemplate, FallsBackToChatTemplateJinjaAndNamesTheFileOnErrors) {
  test::TempDir dir;
  fs::path cfg = dir.path / "tokenizer_config.json";
  write(cfg, R"({"eos_token": "</s>"})");
  EXPECT_THROW(ChatTemplate::from_tokenizer_config(cfg), UserError);
  write(dir.path / "chat_template.jinja", "{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}\n");
  EXPECT_EQ(
      ChatTemplate::from_tokenizer_config(cfg).render(nlohmann::json::parse(R"({"messages": [{"content": "a"}]})")),
      "a</s>");
  write(cfg, R"({"chat_template": "ok\n{% if %}"})");
  try {
    ChatTemplate::from_tokenizer_config(cfg);
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), cfg.string() +
                                         ": chat template line 2, column 7: expected an expression, got "
                                         "end of statement block '%}'");
  }
}

}  // namespace
}  // namespace soltrain
