// The template sandbox's limits (jinja_limits.h): hostile templates from a downloaded model end in one
// template error naming the limit, fast, never a crash or a hang; the real templates stay far below them.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/error.h"
#include "data_test_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/jinja_template.h"
#include "tokenizer/jinja_value.h"

namespace soltrain {
namespace {

using Clock = std::chrono::steady_clock;

// The UserError of parsing and rendering `tpl`, or "" when it succeeds; fails the test if it takes long.
std::string error_of(const std::string& tpl) {
  const auto t0 = Clock::now();
  std::string msg;
  try {
    jinja::Template(tpl, "t").render({});
  } catch (const UserError& e) {
    msg = e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0) << tpl.substr(0, 200);
  return msg;
}

std::string repeated(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

void expect_limit(const std::string& tpl, const std::string& limit) {
  const std::string msg = error_of(tpl);
  EXPECT_NE(msg.find("exceeds the sandbox's " + limit), std::string::npos) << msg;
  EXPECT_EQ(msg.rfind("t line ", 0), 0u) << "the error says where: " << msg;
}

TEST(JinjaLimits, RecursiveMacrosStopAtTheCallDepth) {
  expect_limit("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "macro call depth");
  expect_limit("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5000) }}",
               "macro call depth");
  // deep blocks inside each call reach the evaluation depth (what bounds the C++ stack) before the call depth
  expect_limit("{% macro f(n) %}" + repeated("{% if true %}", 150) + "{{ f(n - 1) }}" + repeated("{% endif %}", 150) +
                   "{% endmacro %}{{ f(90) }}",
               "evaluation depth");
  // deep expressions inside each call: the same limit, however large the build's stack frames are
  expect_limit(
      "{% macro f(n) %}{{ " + repeated("(1 + ", 60) + "f(n - 1)" + repeated(")", 60) + " }}{% endmacro %}{{ f(99) }}",
      "evaluation depth");
  // a bounded recursion a real template might do is fine
  EXPECT_EQ(error_of("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}x{% endif %}{% endmacro %}{{ f(50) }}"), "");
}

TEST(JinjaLimits, DeepNestingIsAParseErrorNotAStackOverflow) {
  expect_limit("{{ " + repeated("(", 5000) + "1" + repeated(")", 5000) + " }}", "nesting depth");
  expect_limit(repeated("{% if true %}", 50000) + "x" + repeated("{% endif %}", 50000), "nesting depth");
  expect_limit("{{ " + repeated("[", 5000) + repeated("]", 5000) + " }}", "nesting depth");
  expect_limit("{{ " + repeated("not ", 100000) + "1 }}", "nesting depth");
  expect_limit("{{ " + repeated("-", 100000) + "1 }}", "nesting depth");
  // chains of operators deepen the tree without recursion in the parser
  expect_limit("{{ 1" + repeated(" + 1", 100000) + " }}", "nesting depth");
  expect_limit("{{ x" + repeated(".a", 100000) + " }}", "nesting depth");
  expect_limit("{{ x" + repeated("|first", 100000) + " }}", "nesting depth");
  expect_limit("{{ 1" + repeated(" if 1 else 1", 50000) + " }}", "nesting depth");
  EXPECT_EQ(error_of("{{ " + repeated("(", 50) + "1" + repeated(")", 50) + " }}"), "");
}

TEST(JinjaLimits, ValuesBuiltDeepStopAtTheValueDepth) {
  // printing or freeing a list nested 10^5 deep would recurse 10^5 times
  expect_limit(
      "{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}"
      "{{ ns.x }}",
      "value nesting depth");
  expect_limit("{% set ns = namespace(x={}) %}{% for i in range(100000) %}{% set ns.x = {'a': ns.x} %}{% endfor %}",
               "value nesting depth");
  // a namespace inside a namespace could become a cycle
  EXPECT_NE(error_of("{% set ns = namespace(x=1) %}{% set ns.x = ns %}{{ ns }}").find("keeps namespaces apart"),
            std::string::npos);
  EXPECT_NE(error_of("{% set a = namespace() %}{% set b = namespace(a=[a]) %}{% set a.b = [b] %}")
                .find("keeps namespaces apart"),
            std::string::npos);
  EXPECT_EQ(error_of("{% set ns = namespace(x=[]) %}{% for i in range(50) %}{% set ns.x = [ns.x] %}{% endfor %}"
                     "{{ ns.x | length }}"),
            "");
}

TEST(JinjaLimits, NestedLoopsStopAtTheStepLimit) {
  expect_limit("{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}", "total steps");
  expect_limit("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", "total steps");
}

TEST(JinjaLimits, HugeStringsAreRefusedBeforeTheyAreBuilt) {
  expect_limit("{{ 'x' * 100000000000 }}", "output size (bytes)");
  expect_limit("{{ ['xxxxxxxx'] * 100000000000 }}", "output size (bytes)");
  expect_limit("{{ 'x' | indent(100000000000) }}", "output size (bytes)");
  expect_limit("{{ {'a': 1} | tojson(indent=100000000000) }}", "output size (bytes)");
  // doubling: each step is cheap, the string is not
  expect_limit("{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
               "output size (bytes)");
  expect_limit("{% set s = 'x' * 1000000 %}{{ (s * 10) | replace('x', s) }}", "output size (bytes)");
  // the rendered text itself
  expect_limit("{% set s = 'x' * 10000000 %}{% for i in range(20) %}{{ s }}{% endfor %}", "output size (bytes)");
}

TEST(JinjaLimits, IntegerArithmeticNeverOverflowsSilently) {
  EXPECT_NE(error_of("{{ 2 ** 10000000000000 }}").find("integer overflow"), std::string::npos);
  EXPECT_EQ(error_of("{{ 1 ** 10000000000000 }}{{ (-1) ** 10000000000001 }}"), "");
  EXPECT_NE(error_of("{{ 9223372036854775807 + 1 }}").find("integer overflow"), std::string::npos);
  EXPECT_NE(error_of("{{ -9223372036854775807 - 2 }}").find("integer overflow"), std::string::npos);
  EXPECT_NE(error_of("{{ 4294967296 * 4294967296 }}").find("integer overflow"), std::string::npos);
  EXPECT_NE(error_of("{{ (-9223372036854775807 - 1) // -1 }}").find("integer overflow"), std::string::npos);
  EXPECT_EQ(error_of("{{ (-9223372036854775807 - 1) % -1 }}{{ (-9223372036854775807 - 1) is divisibleby(-1) }}"), "");
  EXPECT_EQ(jinja::Template(
                "{{ 2 ** 62 }} {{ 7 // -1 }} {{ range(9223372036854775800, 9223372036854775807, 5) | list }}", "t")
                .render({}),
            "4611686018427387904 -7 [9223372036854775800, 9223372036854775805]");
}

// The models' own templates on a long conversation: nowhere near any limit.
TEST(JinjaLimits, RealTemplatesOnALongConversationStayWithinThem) {
  for (const char* name : {"qwen3", "llama3"}) {
    std::filesystem::path dir;
    try {
      dir = test::tokenizer_folder(name);
    } catch (const std::exception& e) {
      GTEST_SKIP() << e.what();
    }
    const ChatTemplate t = ChatTemplate::from_tokenizer_config(dir / "tokenizer_config.json");
    nlohmann::json messages = nlohmann::json::array();
    for (int i = 0; i < 2000; ++i)
      messages.push_back({{"role", i % 2 ? "assistant" : "user"}, {"content", "message " + std::to_string(i)}});
    const std::string out = t.render(nlohmann::json{{"messages", messages}, {"add_generation_prompt", true}});
    EXPECT_NE(out.find("message 1999"), std::string::npos);
  }
}

}  // namespace
}  // namespace soltrain
