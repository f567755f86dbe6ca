// The templates Axolotl's `chat_template: NAME` selects (its src/axolotl/utils/chat_templates/templates/*.jinja),
// written here to render the same text character for character, so a config that names one trains on what
// Axolotl would have trained on whatever the model's own template is. Every tag strips the whitespace around
// it ({%- -%}), so the layout below is for reading only; only the quoted strings reach the output.
#include "data/named_templates.h"

#include <map>

namespace soltrain {

namespace {

// Axolotl's chatml: each turn "<|im_start|>{role}\n{content}<|im_end|>\n", no default system message.
const char* kChatml = R"J(
{%- for message in messages -%}
  {{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
)J";

// Axolotl's llama3: Llama 3's header/eot turns with each content trimmed, the tokenizer's BOS written by the
// template before the first turn (so the tokenizer must not add another), and no default system message
// (Meta's own template adds a dated one; Axolotl's does not).
const char* kLlama3 = R"J(
{%- for message in messages -%}
  {%- if message['content'] is string -%}
    {%- set text = message['content'] -%}
  {%- else -%}
    {%- set text = message['content'] | selectattr('text', 'defined') | map(attribute='text') | join('') -%}
  {%- endif -%}
  {%- if loop.first -%}{{- bos_token -}}{%- endif -%}
  {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + (text | trim) + '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{%- endif -%}
)J";

// Axolotl's qwen3: Qwen3's template (tools block, <think> for assistant turns after the last real user
// query, tool calls and responses) with two differences from Qwen's own: `real_last_index` (a variable
// Axolotl may pass) stands for "the last message" when deciding which turn shows an empty think block, and
// the generation prompt opens a think block unless enable_thinking is false.
const char* kQwen3 = R"J(
{%- macro text_of(content) -%}
  {%- if content is string -%}{{- content -}}
  {%- else -%}
    {%- for item in content -%}{%- if 'text' in item -%}{{- item['text'] -}}{%- endif -%}{%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{%- set has_system = messages[0].role == 'system' -%}
{%- if tools -%}
  {{- '<|im_start|>system\n' -}}
  {%- if has_system -%}{{- text_of(messages[0].content) + '\n\n' -}}{%- endif -%}
  {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
  {%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
  {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif has_system -%}
  {{- '<|im_start|>system\n' + text_of(messages[0].content) + '<|im_end|>\n' -}}
{%- endif -%}
{#- The last user turn that is a real query (not a wrapped tool response), searched from the end. -#}
{%- set ns = namespace(searching=true, last_query=messages | length - 1) -%}
{%- for message in messages | reverse -%}
  {%- if ns.searching and message.role == 'user' -%}
    {%- if message.content is not string or not (message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) -%}
      {%- set ns.searching = false -%}
      {%- set ns.last_query = messages | length - 1 - loop.index0 -%}
    {%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if real_last_index is defined and real_last_index is not none -%}
  {%- set last = real_last_index -%}
{%- else -%}
  {%- set last = messages | length - 1 -%}
{%- endif -%}
{%- for message in messages -%}
  {%- if message.role == 'user' or (message.role == 'system' and not loop.first) -%}
    {{- '<|im_start|>' + message.role + '\n' + text_of(message.content) + '<|im_end|>\n' -}}
  {%- elif message.role == 'assistant' -%}
    {%- if message.content is none -%}
      {%- set content = '' -%}
    {%- else -%}
      {%- set content = text_of(message.content) -%}
    {%- endif -%}
    {%- set reasoning = '' -%}
    {%- if message.reasoning_content is string -%}
      {%- set reasoning = message.reasoning_content -%}
    {%- elif '</think>' in content -%}
      {%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}
      {%- set content = content.split('</think>')[-1].lstrip('\n') -%}
    {%- endif -%}
    {%- if loop.index0 > ns.last_query and (loop.index0 == last or reasoning) -%}
      {{- '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') -}}
    {%- else -%}
      {{- '<|im_start|>assistant\n' + content -}}
    {%- endif -%}
    {%- if message.tool_calls -%}
      {%- for call in message.tool_calls -%}
        {%- if not loop.first or content -%}{{- '\n' -}}{%- endif -%}
        {%- if call.function -%}{%- set call = call.function -%}{%- endif -%}
        {{- '<tool_call>\n{"name": "' + call.name + '", "arguments": ' -}}
        {%- if call.arguments is string -%}{{- call.arguments -}}{%- else -%}{{- call.arguments | tojson -}}{%- endif -%}
        {{- '}\n</tool_call>' -}}
      {%- endfor -%}
    {%- endif -%}
    {{- '<|im_end|>\n' -}}
  {%- elif message.role == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\n<tool_response>\n' + text_of(message.content) + '\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
  {%- if enable_thinking is defined and enable_thinking is false -%}
    {{- '<think>\n\n</think>\n\n' -}}
  {%- else -%}
    {{- '<think>\n\n' -}}
  {%- endif -%}
{%- endif -%}
)J";

// Axolotl's qwen_25: Qwen2.5's template, whose system turn defaults to "You are Qwen, created by Alibaba
// Cloud. You are a helpful assistant." when the conversation has none.
const char* kQwen25 = R"J(
{%- set default_system = 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' -%}
{%- set system = messages[0]['content'] if messages[0]['role'] == 'system' else default_system -%}
{%- if tools -%}
  {{- '<|im_start|>system\n' + system -}}
  {{- '\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
  {%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
  {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- else -%}
  {{- '<|im_start|>system\n' + system + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
  {%- if message.role == 'user' or (message.role == 'system' and not loop.first) or (message.role == 'assistant' and not message.tool_calls) -%}
    {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}
  {%- elif message.role == 'assistant' -%}
    {{- '<|im_start|>assistant' -}}
    {%- if message.content -%}{{- '\n' + message.content -}}{%- endif -%}
    {%- for call in message.tool_calls -%}
      {%- if call.function is defined -%}{%- set call = call.function -%}{%- endif -%}
      {{- '\n<tool_call>\n{"name": "' + call.name + '", "arguments": ' + (call.arguments | tojson) + '}\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\n' -}}
  {%- elif message.role == 'tool' -%}
    {%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
)J";

}  // namespace

std::optional<std::string> named_chat_template(const std::string& name) {
  static const std::map<std::string, const char*> templates = {
      {"chatml", kChatml}, {"llama3", kLlama3}, {"qwen3", kQwen3}, {"qwen_25", kQwen25}};
  const auto it = templates.find(name);
  if (it == templates.end()) return std::nullopt;
  return std::string(it->second);
}

std::string named_chat_template_list() {
  return "chatml, llama3, qwen3, qwen_25";
}

}  // namespace soltrain
