// The run's tokenizer: the model's own, or a copy with Axolotl's tokenizer settings applied (tokens,
// special_tokens, added_tokens_overrides: tokenizer/tokenizer_edits.h), and the embedding size transformers'
// resize_token_embeddings gives the model as Axolotl calls it. Everything that tokenizes, pads or saves a
// tokenizer reads run_tokenizer_folder(); load_run_model resizes the model by run_vocab_resize(). Both are functions
// of the config alone (resolved once per process), so no path that trains can skip them.
#pragma once
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "train/train_config.h"

namespace soltrain {

struct RunTokenizer {
  std::filesystem::path folder;    // the model's, or the edited copy
  int vocab_resize = 0;            // the embedding rows the model is resized to (0: as stored)
  std::vector<std::string> notes;  // what was changed, for the run's header
};

// An edited tokenizer is written once into dataset_prepared_path (named by its content, so runs with the same
// edits share it). An adapter run that adds tokens without lora_modules_to_save [embed_tokens, lm_head] is a
// UserError, as Axolotl's check is.
const RunTokenizer& resolve_run_tokenizer(const TrainConfig& c);
std::filesystem::path run_tokenizer_folder(const TrainConfig& c);
// load_pretrained's resize for the run (none when the embedding keeps its rows).
std::optional<VocabResize> run_vocab_resize(const TrainConfig& c);

// Resolves it before any data work and adds its notes to c.notes (the run's header says them).
void prepare_run_tokenizer(TrainConfig& c);

}  // namespace soltrain
