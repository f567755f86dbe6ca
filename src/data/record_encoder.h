// One dataset's records → documents (tokens and loss mask), as `soltrain tokenize` writes them into shards and
// a streamed dataset (data/stream_loader.h) packs them as training reads it: one encoding for both.
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "data/dataset.h"
#include "data/sample_encoder.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace soltrain {

class RecordEncoder {
 public:
  // `tok`: tokenizer_dir's tokenizer.json, loaded once by the caller for all its datasets (it outlives this);
  // tokenizer_dir also holds tokenizer_config.json. `type` kAuto is decided by the first record (and sets which of
  // `fields` it reads).
  RecordEncoder(Tokenizer& tok, const std::filesystem::path& tokenizer_dir, DatasetType type, DatasetFields fields,
                bool train_on_inputs);
  RecordEncoder(const RecordEncoder&) = delete;  // (its SampleEncoder points at its tokenizer and template)
  RecordEncoder& operator=(const RecordEncoder&) = delete;
  // BadRecord when the record cannot be used (the caller says where and applies bad_records).
  Document encode(const nlohmann::ordered_json& record);
  DatasetType type() const { return type_; }
  const DatasetFields& fields() const { return fields_; }

 private:
  std::filesystem::path dir_;
  DatasetType type_;
  DatasetFields fields_;
  bool train_on_inputs_;
  Tokenizer& tok_;
  std::string eos_, bos_;
  std::optional<ChatTemplate> tmpl_;
  std::optional<SampleEncoder> enc_;
};

// The chat template a dataset's conversations render with: `name` one of soltrain's named templates, or "jinja" with
// `jinja` its text (both with the tokenizer's bos/eos), or the tokenizer_config's own when empty or
// "tokenizer_default". UserError for an unknown name.
ChatTemplate chat_template_for(const std::string& name, const std::string& jinja,
                               const std::filesystem::path& tokenizer_config);

}  // namespace soltrain
