# The reference renders for tests/test_named_templates.cpp: Axolotl's own template files (the `chat_template:`
# names soltrain also has), rendered by jinja2 the way transformers' apply_chat_template renders them
# (sandboxed, trim_blocks, lstrip_blocks, tojson without key sorting), over conversations that reach every
# branch: system turns and trimming, content given as parts, <think> in assistant turns, tool calls and
# tool responses, tools, the generation prompt.
#   python3 tests/tools/make_named_template_renders.py AXOLOTL_TEMPLATE_DIR COMMIT > \
#       tests/fixtures/named_templates/axolotl_renders.jsonl
# (AXOLOTL_TEMPLATE_DIR: src/axolotl/utils/chat_templates/templates of axolotl-ai-cloud/axolotl at COMMIT.)
import json, os, sys

from jinja2.sandbox import ImmutableSandboxedEnvironment

template_dir, commit = sys.argv[1], sys.argv[2]
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False, ensure_ascii=False: json.dumps(
    x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

add = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
conversations = {
    "system_and_trim": [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "What is 2+2?\n"},
                        {"role": "assistant", "content": "4"}],
    "think_and_tools": [{"role": "user", "content": "Hi"},
                        {"role": "assistant", "content": "<think>\nsay hi\n</think>\n\nHello!"},
                        {"role": "user", "content": "Add 2 and 3"},
                        {"role": "assistant", "content": "Calling.", "tool_calls": [add]},
                        {"role": "tool", "content": "5"}, {"role": "tool", "content": "(checked)"},
                        {"role": "assistant", "content": "<think>\nthe tool said 5\n</think>\n\nIt is 5."}],
    "no_reasoning_last": [{"role": "system", "content": "S"}, {"role": "user", "content": "a"},
                          {"role": "assistant", "content": "b"}, {"role": "system", "content": "late system"},
                          {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}],
    "content_parts": [{"role": "user", "content": [{"type": "text", "text": " one "}, {"type": "image"},
                                                   {"type": "text", "text": "two "}]},
                      {"role": "assistant", "content": "ok"}],
}
tools = [{"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
# Qwen2.5's template writes content with `+` and so cannot take content parts: skipped there.
skip = {("qwen_25", "content_parts")}
for name in ["chatml", "llama3", "qwen3", "qwen_25"]:
    with open(os.path.join(template_dir, name + ".jinja"), encoding="utf-8") as f:
        template = env.from_string(f.read())
    for conv, messages in conversations.items():
        if (name, conv) in skip or (name == "chatml" and conv == "content_parts"):
            continue
        for generation in [False, True]:
            for with_tools in [False, True]:
                variables = {"messages": messages, "add_generation_prompt": generation,
                             "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                             "tools": tools if with_tools else None}
                print(json.dumps({"template": name, "axolotl_commit": commit, "conversation": conv,
                                  "variables": variables, "rendered": template.render(**variables)}))
