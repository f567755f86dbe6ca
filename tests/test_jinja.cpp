// Unit tests of the Jinja engine on small templates. Every expected string was checked against jinja2 3.1.6
// set up as transformers sets it up (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/jinja_template.h"
#include "tokenizer/jinja_value.h"

namespace soltrain {
namespace {

std::string render(const std::string& tpl, const std::string& vars = "{}") {
  auto v = jinja::from_json(nlohmann::ordered_json::parse(vars));
  return jinja::Template(tpl, "t").render(*v.dict);
}

// The UserError message of rendering (or parsing) `tpl`, or "" when it succeeds.
std::string error_of(const std::string& tpl, const std::string& vars = "{}") {
  try {
    render(tpl, vars);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(Jinja, TrimBlocksAndLstripBlocks) {
  // The block tags' lines vanish entirely: lstrip removes the indent, trim_blocks the newline after.
  EXPECT_EQ(render("a\n  {% if true %}\n  x\n  {% endif %}\nb"), "a\n  x\nb");
  EXPECT_EQ(render("line1\n    {% for m in [1,2] %}\n    item {{ m }}\n    {% endfor %}\nend\n"),
            "line1\n    item 1\n    item 2\nend");
  // Not at the start of a line: the spaces around tags stay.
  EXPECT_EQ(render("a {% if true %} x {% endif %} b"), "a  x  b");
  // Comments behave like blocks; print tags do not trim the newline after them.
  EXPECT_EQ(render("  {# c #}\nx"), "x");
  EXPECT_EQ(render("{{ 1 }}\nx"), "1\nx");
}

TEST(Jinja, WhitespaceControlModifiers) {
  EXPECT_EQ(render("{{- \"  a  \" -}}  |  {{- \"b\" }}"), "  a  |b");
  EXPECT_EQ(render("  {%- if true %}x{% endif -%}  \n  y"), "xy");
  // "+" turns lstrip/trim off for that tag.
  EXPECT_EQ(render("{% if true +%}\nx{%+ if true %}y{% endif %}{% endif %}"), "\nxy");
}

TEST(Jinja, TrailingNewlineDroppedAndRaw) {
  EXPECT_EQ(render("text\n"), "text");
  EXPECT_EQ(render("text\n\n"), "text\n");
  EXPECT_EQ(render("a\n  {% raw %}\n {{x}} \n  {% endraw %}\nb"), "a\n\n {{x}} \nb");
  EXPECT_EQ(render("a\n  {%- raw -%}\n {{x}} \n  {%- endraw -%}\nb"), "a{{x}}b");
}

TEST(Jinja, IfElifElse) {
  const std::string t = "{% if x is string %}S{% elif x is mapping %}M{% elif x is sequence %}Q{% else %}O{% endif %}";
  EXPECT_EQ(render(t, R"({"x": "s"})"), "S");
  EXPECT_EQ(render(t, R"({"x": {}})"), "M");
  EXPECT_EQ(render(t, R"({"x": [1]})"), "Q");
  EXPECT_EQ(render(t, R"({"x": 1})"), "O");
}

TEST(Jinja, ForLoopVariables) {
  EXPECT_EQ(render("{% for x in [1,2,3] %}{{ loop.cycle(\"a\",\"b\") }}{{ loop.revindex }}{{ loop.revindex0 }}"
                   "{{ loop.nextitem }}{{ loop.depth }}{% endfor %}"),
            "a3221b2131a101");
  EXPECT_EQ(render("{% for m in x %}{{ loop.index0 }}{{ m.role }}{% if loop.first %}^{% endif %}"
                   "{% if not loop.last %},{% endif %}{% endfor %}",
                   R"({"x": [{"role": "a"}, {"role": "b"}]})"),
            "0a^,1b");
  // Inner loops shadow `loop`; jinja2's depth counts recursion, so it stays 1.
  EXPECT_EQ(render("{% for x in [1,2] %}{% for y in [3] %}{{ loop.depth }}{{ loop.index }}{% endfor %}"
                   "{{ loop.index }}{% endfor %}"),
            "111112");
}

TEST(Jinja, ForFilterElseUnpackingAndIterables) {
  // The filter runs before counting: loop.length and previtem see only kept items.
  EXPECT_EQ(render("{%- for x in [1,2,3] if x > 1 %}{{ loop.index }}/{{ loop.length }}{{ loop.previtem }}"
                   "{% else %}none{% endfor %}"),
            "1/22/22");
  EXPECT_EQ(render("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for a, b in {\"x\": 1, \"y\": 2}.items() %}{{ a }}{{ b }}{% endfor %}"), "x1y2");
  EXPECT_EQ(render("{% for x in \"ab\" %}{{ x }}{% endfor %}{% for k in {\"p\":1} %}{{ k }}{% endfor %}"), "abp");
  EXPECT_EQ(render("{% for x in nothing %}a{% endfor %}"), "");
}

TEST(Jinja, BreakAndContinue) {
  EXPECT_EQ(render("{% for i in range(3) %}{% if i == 1 %}{% continue %}{% endif %}{{ i }}{% endfor %}"), "02");
  EXPECT_EQ(render("{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}"), "012");
}

TEST(Jinja, SetScopesLikeJinja2) {
  // A for body is a scope of its own, fresh each iteration; an if is not.
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1,2] %}{% set x = 2 %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(render("{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}"), "2");
  EXPECT_EQ(render("{% set x = 5 %}{% for i in [1,2] %}[{{ x }}]{% set x = i %}{% endfor %}{{ x }}"), "[5][5]5");
  EXPECT_EQ(render("{% for i in [1,2] %}{% if i == 2 %}[{{ x }}]{% endif %}{% set x = i %}{% endfor %}"), "[]");
  EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ a }}{{ b }}"), "12");
  EXPECT_EQ(render("{% set x %}inner {{ 1 }}{% endset %}[{{ x }}]"), "[inner 1]");
}

TEST(Jinja, NamespaceCarriesStateOutOfLoops) {
  EXPECT_EQ(render("{% set ns = namespace(a=1) %}{% for i in [1,2,3] %}{% set ns.a = ns.a + i %}{% endfor %}"
                   "{{ ns.a }}{% set ns.b = \"new\" %}{{ ns.b }}"),
            "7new");
  EXPECT_EQ(render("{{ namespace(a=1) }}"), "<Namespace {'a': 1}>");
  EXPECT_NE(error_of("{% set d = {} %}{% set d.x = 1 %}").find("not a namespace"), std::string::npos);
}

TEST(Jinja, Macros) {
  EXPECT_EQ(render("{% macro f(a, b=2) %}{{ a }}-{{ b }}{% endmacro %}{{ f(1) }} {{ f(1, b=3) }} {{ f(b=5, a=0) }}"),
            "1-2 1-3 0-5");
  // Names resolve when the macro is called, from the scopes around its definition.
  EXPECT_EQ(render("{% set y = 3 %}{% macro f() %}{{ y }}{% endmacro %}{% set y = 4 %}{{ f() }}"), "4");
  EXPECT_EQ(render("{% for i in [1] %}{% macro f() %}{{ i }}{% endmacro %}{{ f() }}{% endfor %}"), "1");
  EXPECT_EQ(render("{% macro m(x) %}[{{ x }}]{% endmacro %}{% for i in [1,2] %}{{ m(i) }}{% endfor %}{{ m() }}"),
            "[1][2][]");
  EXPECT_NE(error_of("{% macro m(x) %}{% endmacro %}{{ m(1, 2) }}").find("takes not more than 1"), std::string::npos);
}

TEST(Jinja, LiteralsPrintLikePython) {
  EXPECT_EQ(render("{{ [1, \"a\", none, true, 1.0, {\"k\": (1,2)}] }}"), "[1, 'a', None, True, 1.0, {'k': (1, 2)}]");
  EXPECT_EQ(render("{{ (1,) }} {{ 1, 2 }} {{ \"a\" \"b\" }}"), "(1,) (1, 2) ab");
  EXPECT_EQ(render("{{ [\"it's\", 'say \"hi\"'] }}"), "[\"it's\", 'say \"hi\"']");
  EXPECT_EQ(render("{{ \"a\\\\d\\x41\\u00e9\\n\" }}"), "a\\dAé\n");
  EXPECT_EQ(render("{{ x }}", R"({"x": {"a": [1, {"b": null}], "c": 1.5, "d": true}})"),
            "{'a': [1, {'b': None}], 'c': 1.5, 'd': True}");
}

TEST(Jinja, Arithmetic) {
  EXPECT_EQ(render("{{ 1e16 }} {{ 0.00001 }} {{ 3/2 }} {{ 4/2 }} {{ 7//2 }} {{ -7//2 }} {{ -7 % 3 }} {{ 2**10 }} "
                   "{{ 2**-1 }} {{ 0.1+0.2 }} {{ 1e15 }}"),
            "1e+16 1e-05 1.5 2.0 3 -4 2 1024 0.5 0.30000000000000004 1000000000000000.0");
  EXPECT_EQ(render("{{ 5.5 // 2 }} {{ 7 - 2.5 }} {{ true + 1 }} {{ -1 | abs }} {{ \"ab\" * 2 }} {{ [1] + [2] }}"),
            "2.0 4.5 2 1 abab [1, 2]");
  EXPECT_EQ(render("{{ \"a\" ~ 1 ~ none ~ undefined ~ true }}"), "a1NoneTrue");
}

TEST(Jinja, ComparisonsAndLogic) {
  EXPECT_EQ(render("{{ \"x\" if 0 else \"y\" }} {{ 1 and 2 }} {{ 0 or \"z\" }} {{ not 1 }} {{ 1 in [1] }} "
                   "{{ \"b\" not in \"abc\" }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}"),
            "y 2 z False True False True False");
  EXPECT_EQ(render("{{ 1 == 1.0 }} {{ true == 1 }} {{ [1,2] < [1,3] }} {{ \"10\" < \"9\" }}"), "True True True True");
  EXPECT_EQ(render("{{ 1 if false }}|"), "|");
}

TEST(Jinja, SubscriptsAndSlices) {
  EXPECT_EQ(render("{{ \"abc\"[::-1] }} {{ \"héllo\"|length }} {{ \"héllo\"[1] }} {{ \"abc\"[-1] }}"), "cba 5 é c");
  EXPECT_EQ(render("{{ \"abcdef\"[::2] }}{{ [1,2,3,4][-2:] }}{{ [1,2,3][::-1] }}{{ [1,2,3,4,5][4:1:-2] }}"
                   "{{ [1,2,3][-10:10] }}{{ [1,2,3][::-2] }}"),
            "ace[3, 4][3, 2, 1][5, 3][1, 2, 3][3, 1]");
  EXPECT_EQ(render("{{ x.0 }}{{ x[-1] }}{{ x[5] }}", R"({"x": ["p", "q"]})"), "pq");
  // Attribute access tries the attribute first, subscript the key first.
  EXPECT_EQ(render("{{ d[\"items\"] }} {{ d.items()|list }}", R"({"d": {"items": 1}})"), "1 [('items', 1)]");
}

TEST(Jinja, StringMethods) {
  EXPECT_EQ(render("{{ \"a,b,,c\".split(\",\") }} {{ \" a  b \".split() }} {{ \"a b c\".split(\" \", 1) }} "
                   "{{ \"a b c\".rsplit(\" \", 1) }}"),
            "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b c'] ['a b', 'c']");
  EXPECT_EQ(render("{{ \"  x\\n \".strip() }}|{{ \"xxaxx\".strip(\"x\") }}|{{ \"\\n\\nx\\n\".lstrip(\"\\n\") }}|"
                   "{{ \"abc\".startswith((\"x\",\"a\")) }}|{{ \"abc\".endswith(\"bc\") }}"),
            "x|a|x\n|True|True");
  EXPECT_EQ(render("{{ \"aXbXc\".replace(\"X\", \"-\") }} {{ \"Hi\".upper() }} {{ \"Hi\".lower() }} "
                   "{{ \"{}-{x}\".format(1, x=2) }} {{ \"x\".join([\"a\", \"b\"]) }} {{ \"hello world\".title() }}"),
            "a-b-c HI hi 1-2 axb Hello World");
  EXPECT_EQ(render("{{ \"a<b>c\".split(\"<b>\")[-1] }}"), "c");
}

TEST(Jinja, DictMethods) {
  EXPECT_EQ(render("{{ d.get(\"a\") }} {{ d.get(\"z\") }} {{ d.get(\"z\", 5) }} {{ d.keys()|list }} "
                   "{{ d.values()|list }} {{ d.items()|list }}",
                   R"({"d": {"a": 1, "b": 2}})"),
            "1 None 5 ['a', 'b'] [1, 2] [('a', 1), ('b', 2)]");
  // The sandbox is immutable, as HF's is.
  EXPECT_NE(error_of("{{ d.update({}) }}", R"({"d": {}})").find("immutable sandbox"), std::string::npos);
  EXPECT_NE(error_of("{{ l.append(1) }}", R"({"l": []})").find("immutable sandbox"), std::string::npos);
}

TEST(Jinja, Filters) {
  EXPECT_EQ(render("{{ \"  x  \"|trim }}|{{ \"xxhixx\"|trim(\"x\") }}|{{ \"hello world\"|title }}|"
                   "{{ \"hELLO\"|capitalize }}|{{ 3.7|int }}|{{ \"42\"|int }}|{{ \"x\"|int }}|{{ 2|float }}"),
            "x|hi|Hello World|Hello|3|42|0|2.0");
  EXPECT_EQ(render("{{ {\"a\":1}|items|list }} {{ undefined_x|default(\"d\") }} {{ \"\"|default(\"d\") }} "
                   "{{ \"\"|default(\"d\", true) }} {{ [1,2]|join(\"-\") }} {{ [1,2]|first }} {{ \"ab\"|last }} "
                   "{{ \"ab\"|list }}"),
            "[('a', 1)] d  d 1-2 1 b ['a', 'b']");
  EXPECT_EQ(render("{{ [1,2,3]|length }} {{ \"ab\"|count }} {{ {\"a\": 1}|length }} {{ [1, 2]|sum }} {{ [3,1]|max }} "
                   "{{ [3,1]|min }} {{ [\"b\",\"A\"]|sort }} {{ 2.5|round }} {{ 3.5|round }}"),
            "3 2 1 3 3 1 ['A', 'b'] 2.0 4.0");
  EXPECT_EQ(render("{{ [3,1,2]|sort }} {{ [1,2]|reverse|list }} {{ \"ab\"|reverse }} {{ [1,2,1]|unique|list }} "
                   "{{ [{\"a\":1},{\"a\":2}]|map(attribute=\"a\")|list }}"),
            "[1, 2, 3] [2, 1] ba [1, 2] [1, 2]");
  EXPECT_EQ(render("{{ [{\"r\":\"s\"},{\"r\":\"u\"}]|selectattr(\"r\", \"equalto\", \"u\")|list }} "
                   "{{ [1,2,3]|select(\"odd\")|list }} {{ [{\"r\":\"s\"}]|rejectattr(\"r\")|list }}"),
            "[{'r': 'u'}] [1, 3] []");
  EXPECT_EQ(render("{{ \"hello\"|replace(\"l\", \"L\") }} {{ \"hello\"|replace(\"l\", \"L\", 1) }} {{ \"Hi\"|upper }} "
                   "{{ \"Hi\"|lower }} {{ 1|string }} {{ none|string }} {{ \"<b>\"|safe }}"),
            "heLLo heLlo HI hi 1 None <b>");
  EXPECT_EQ(
      render(
          "{{ \"a\\nb\\n\\nc\"|indent(2) }}|{{ \"a\\nb\"|indent(2, true) }}|{{ \"a\\n\\nb\"|indent(2, blank=true) }}"),
      "a\n  b\n\n  c|  a\n  b|a\n  \n  b");
  EXPECT_EQ(render("{{ [{\"n\":\"a\"},{\"n\":\"b\"}]|join(\",\", attribute=\"n\") }}"), "a,b");
}

TEST(Jinja, TojsonMatchesHuggingFace) {
  // json.dumps(ensure_ascii=False): no HTML escaping (unlike jinja2's own tojson), raw UTF-8, key order kept.
  EXPECT_EQ(render("{{ x | tojson }}", R"({"x": {"b": [1, 2.5, "é", null, true], "a": "\"\n\u001f<&>"}})"),
            R"({"b": [1, 2.5, "é", null, true], "a": "\"\n\u001f<&>"})");
  EXPECT_EQ(render("{{ x|tojson(indent=2) }}", R"({"x": {"b": [1, {}], "a": []}})"),
            "{\n  \"b\": [\n    1,\n    {}\n  ],\n  \"a\": []\n}");
  EXPECT_EQ(render("{{ [1,2]|tojson(separators=(\",\", \":\")) }}{{ {\"b\":1,\"a\":2}|tojson(sort_keys=true) }}"),
            "[1,2]{\"a\": 2, \"b\": 1}");
  EXPECT_EQ(render("{{ 1.0|tojson }} {{ 1e20|tojson }} {{ 0.1|tojson }}"), "1.0 1e+20 0.1");
  EXPECT_NE(error_of("{{ x | tojson }}").find("Object of type Undefined is not JSON serializable"), std::string::npos);
}

TEST(Jinja, Tests) {
  EXPECT_EQ(render("{{ x is none }} {{ none is none }} {{ 1 is number }} {{ true is number }} {{ \"a\" is iterable }} "
                   "{{ {} is sequence }}"),
            "False True True True True True");
  EXPECT_EQ(render("{{ 1 is integer }} {{ true is integer }} {{ 1.0 is float }} {{ none is mapping }} "
                   "{{ true is boolean }} {{ false is false }} {{ 1 is true }}"),
            "True False True False True True False");
  EXPECT_EQ(render("{{ 10 is divisibleby 5 }} {{ 3 is odd }} {{ 4 is even }} {{ x is sameas none }} {{ 1 is eq 1 }} "
                   "{{ 2 is gt 1 }} {{ \"a\" is in \"abc\" }} {{ x is not none }} {{ y is undefined }}",
                   R"({"x": null})"),
            "True True True True True True True False True");
}

TEST(Jinja, UndefinedIsLenientUntilUsedDeeply) {
  // jinja2's default Undefined: prints empty, is falsy, iterates as empty, has length 0 ...
  EXPECT_EQ(render("[{{ u }}]{{ u is defined }}{% if not u %}F{% endif %}{{ u|length }}{{ u|list }}"), "[]FalseF0[]");
  EXPECT_EQ(render("{{ x.foo }}|{{ (none).foo }}|{{ x.content is none }} {{ x.missing is defined }}",
                   R"({"x": {"content": null}})"),
            "||True False");
  // ... but an attribute of it, arithmetic on it or calling it is an error.
  EXPECT_EQ(error_of("{{ x.foo.bar }}", R"({"x": {}})"), "t line 1, column 9: 'dict object' has no attribute 'foo'");
  EXPECT_EQ(error_of("{{ foo + 1 }}"), "t line 1, column 8: 'foo' is undefined");
  EXPECT_EQ(error_of("{{ \"abc\".nomethod() }}"), "t line 1, column 18: 'str object' has no attribute 'nomethod'");
}

// Numbers and escapes the template spells badly are template errors (a UserError), never a stray
// std::invalid_argument / out_of_range from the number parsing.
TEST(Jinja, BadNumbersAndEscapesAreTemplateErrors) {
  EXPECT_NE(error_of("{{ \"\\xZZ\" }}").find("bad \\x/\\u/\\U escape"), std::string::npos);
  EXPECT_NE(error_of("{{ \"\\x1g\" }}").find("bad \\x/\\u/\\U escape"), std::string::npos);
  EXPECT_NE(error_of("{{ \"\\U00110000\" }}").find("bad \\x/\\u/\\U escape"), std::string::npos);
  EXPECT_NE(error_of("{{ l.99999999999999999999 }}", R"({"l": [1]})").find("index out of range"), std::string::npos);
  EXPECT_NE(error_of("{{ 99999999999999999999 }}").find("number out of range"), std::string::npos);
  EXPECT_NE(error_of("{{ '{99999999999999999999}'.format(1) }}").find("positional argument"), std::string::npos);
  EXPECT_EQ(render("{{ \"\\x41\\u00e9\" }}"), "A\u00e9");
}

TEST(Jinja, SyntaxErrorsSayWhereAndWhy) {
  EXPECT_EQ(error_of("{{ 1 + }}"), "t line 1, column 8: expected an expression, got end of print statement '}}'");
  EXPECT_EQ(error_of("ok\n  {{ \"x\" | nofilter }}"), "t line 2, column 12: no filter named 'nofilter'");
  EXPECT_EQ(error_of("{{ 1 is nottest }}"), "t line 1, column 9: no test named 'nottest'");
  EXPECT_EQ(error_of("{% for x in y %}"),
            "t line 1, column 4: unexpected end of template: the 'for' block opened here needs '{% endfor %}'");
  EXPECT_EQ(error_of("{% for x in [1] %}\n{% endif %}"),
            "t line 2, column 4: unexpected 'endif': the innermost open block is 'for' (line 1), which expects 'else' "
            "or 'endfor'");
  EXPECT_EQ(error_of("{# unterminated"), "t line 1, column 1: unterminated comment: missing '#}'");
  EXPECT_EQ(error_of("a\n{{ \"abc\" "), "t line 2, column 1: unterminated tag: missing '}}'");
  EXPECT_EQ(error_of("{% include \"x\" %}"), "t line 1, column 4: unknown or unsupported statement 'include'");
  EXPECT_EQ(error_of("{% if true %}\n{% break %}{% endif %}"), "t line 2, column 4: 'break' outside a for loop");
}

TEST(Jinja, RuntimeErrorsSayWhereAndWhy) {
  EXPECT_EQ(error_of("{{ 1 / 0 }}"), "t line 1, column 6: division by zero");
  EXPECT_EQ(error_of("x\n{{ none + \"a\" }}"),
            "t line 2, column 9: unsupported operand type(s) for +: 'NoneType' and 'str'");
  EXPECT_EQ(error_of("{% for m in 3 %}{% endfor %}"), "t line 1, column 13: 'int' object is not iterable");
}

TEST(Jinja, RaiseExceptionAndStrftimeInChatTemplates) {
  ChatTemplate t(
      "{% if messages[0].role != 'user' %}{{ raise_exception('Conversations must start with user') }}"
      "{% endif %}ok");
  EXPECT_EQ(t.render(nlohmann::json::parse(R"({"messages": [{"role": "user"}]})")), "ok");
  try {
    t.render(nlohmann::json::parse(R"({"messages": [{"role": "assistant"}]})"));
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(), "chat template: Conversations must start with user");
  }
  std::string year = ChatTemplate("{{ strftime_now('%Y') }}").render(nlohmann::json::object());
  EXPECT_EQ(year.size(), 4u);
}

}  // namespace
}  // namespace soltrain
