// ChatML: each turn "<|im_start|>{role}\n{content}<|im_end|>\n", the generation prompt
// "<|im_start|>assistant\n" -- the format of Axolotl's `chat_template: chatml` (its chat_templates table).
// Llama 3's and Qwen3's formats are the models' own templates, so `tokenizer_default` gives them on those
// models; the peers' copies of them are not reproduced here.
#include "data/named_templates.h"

namespace soltrain {

std::optional<std::string> named_chat_template(const std::string& name) {
  if (name == "chatml")
    return "{% for message in messages %}"
           "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
           "{% endfor %}"
           "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  return std::nullopt;
}

}  // namespace soltrain
