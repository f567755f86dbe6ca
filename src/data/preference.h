// Preference datasets (DPO): each record is a prompt and two answers, chosen and rejected. The shapes read:
// prompt / chosen / rejected as strings (TRL's standard form, Axolotl's chatml.prompt_pairs); chosen /
// rejected as message lists, with a `prompt` list or sharing their first messages as the prompt (TRL's
// conversational form); Axolotl's chatml.intel (system, question, chosen, rejected) and
// chat_template.default (field_messages for the prompt, field_chosen / field_rejected one message each);
// Axolotl's chat_template.argilla (ORPO's; argilla_chat for DPO): chosen / rejected whole conversations, the
// prompt the chosen one's messages before its last (after a `system` field), each answer its last message.
// Every shape is rendered through the chat template; a pair becomes two documents, prompt + answer, with only
// the answer trained.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <utility>

#include "data/dataset.h"
#include "data/sample_encoder.h"

namespace soltrain {

enum class PreferenceFormat {
  kAuto,
  kPromptPairs,
  kConversational,
  kIntel,
  kChatTemplate,
  kArgillaChat,
  kBradleyTerry,
  kIcr,      // Axolotl's <template>.icr: system, input, chosen, rejected (argilla/distilabel-intel-orca-dpo-pairs)
  kArgilla,  // Axolotl's <template>.argilla: instruction, chosen_response, rejected_response
  kUltra     // Axolotl's <template>.ultra: prompt, and chosen / rejected conversations whose second message answers
};
// auto, preference, prompt_pairs (chatml.prompt_pairs, ...), conversational, intel (chatml.intel, ...),
// chat_template (chat_template.default), chat_template.argilla (..., argilla_chat), bradley_terry.chat_template
// (Axolotl's reward-model rows: system, input, chosen, rejected); nullopt for other names.
std::optional<PreferenceFormat> find_preference_format(std::string_view type);

struct PreferenceSample {
  nlohmann::ordered_json prompt = nlohmann::ordered_json::array();  // messages
  nlohmann::ordered_json chosen, rejected;                          // messages after the prompt
};

// BadRecord on a missing or empty answer, a missing prompt, or fields of the wrong kind.
PreferenceSample to_preference_sample(const nlohmann::ordered_json& record, PreferenceFormat format,
                                      const DatasetFields& f);

// KTO's unpaired records (TRL's unpaired preference form), the shape read from each record: `prompt` (text or
// messages; Axolotl's KTO shapes name it `instruction` (argilla) or `question` (intel)), an optional `system`,
// `completion` (text, one message or messages; argilla_chat rows: the user's message then the answer, no prompt)
// and a boolean `label`, true when the completion is desirable.
struct UnpairedSample {
  nlohmann::ordered_json prompt = nlohmann::ordered_json::array();  // messages
  nlohmann::ordered_json completion;                                // messages after the prompt
  bool desirable = false;
};
// auto, kto, unpaired, and Axolotl's KTO types <template>.ultra / .argilla / .argilla_chat / .intel.
bool is_unpaired_format(std::string_view type);
// BadRecord on a missing or empty completion, a missing prompt or label, or fields of the wrong kind.
UnpairedSample to_unpaired_sample(const nlohmann::ordered_json& record, const DatasetFields& f);

// prompt + answer ids for each answer, answer tokens trained. The prompt is what the template renders for
// the prompt messages with the generation prompt; each answer is the rest of what it renders for prompt +
// answer (as TRL splits a conversational pair). Prompts longer than max_prompt_len (> 0) keep their last
// tokens (TRL's keep_end); then answers are cut to fit seq_len. BadRecord when the prompt alone leaves no
// room for an answer token, or the template renders the prompt differently inside the whole conversation.
class PreferenceEncoder {
 public:
  PreferenceEncoder(Tokenizer& tok, const ChatTemplate& tmpl, int64_t seq_len, int64_t max_prompt_len)
      : tok_(tok), tmpl_(tmpl), seq_len_(seq_len), max_prompt_len_(max_prompt_len) {}
  std::pair<Document, Document> encode(const PreferenceSample& s);
  Document encode(const UnpairedSample& s);     // prompt + completion, the completion trained
  int64_t answers_cut() const { return cut_; }  // answers cut to fit seq_len so far

 private:
  // The prompt rendered with the generation prompt, and its ids (cut to max_prompt_len, keeping the end).
  std::pair<std::string, std::vector<int32_t>> prompt_ids(const nlohmann::ordered_json& prompt);
  std::string render(const nlohmann::ordered_json& messages, bool generation_prompt) const;
  Document answer(const std::vector<int32_t>& prompt, const std::string& prompt_text,
                  const nlohmann::ordered_json& answer, const char* which);
  Tokenizer& tok_;
  const ChatTemplate& tmpl_;
  int64_t seq_len_, max_prompt_len_;
  int64_t cut_ = 0;
};

}  // namespace soltrain
