// Mistral's tekken.json (mistral-common's Tekkenizer: tiktoken-style byte BPE ranks, a split pattern and the
// control tokens first) as the Hugging Face tokenizer.json and tokenizer_config.json that encode the same ids, as
// transformers' MistralConverter converts it, with mistral-common's chat format for the file's version as the
// chat template. A run with `tokenizer_use_mistral_common` (Axolotl's key: Devstral, Magistral, Ministral) trains
// and saves through these files, so every tool that reads tokenizer.json reads what the run tokenized with.
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

namespace soltrain {

struct TekkenConversion {
  nlohmann::json tokenizer;  // tokenizer.json
  nlohmann::json config;     // tokenizer_config.json (bos/eos/unk/pad and the chat template)
  std::string version;       // the tekken format's version ("v3", "v7", "v11", "v13", ...)
};

// Bad or unsupported content throws UserError naming the file.
TekkenConversion convert_tekken(const std::filesystem::path& tekken_json);

// mistral-common's encode_chat_completion for text conversations (system, user and assistant messages; content a
// string or text / thinking chunks) in tekken format `version`, as a chat template. UserError for a version
// soltrain has no format of.
std::string mistral_chat_template(const std::string& version, const std::string& where);

}  // namespace soltrain
