#include "train/run_checks.h"

#include <climits>

#include "core/error.h"
#include "model/config.h"
#include "model/fp8_checkpoint.h"
#include "model/transformer.h"

namespace fs = std::filesystem;

namespace soltrain {

void check_run_inputs(const TrainConfig& c) {
  std::error_code ec;
  if (!fs::is_directory(c.model, ec))
    user_error("model: ", c.model.string(), ": ", fs::exists(c.model, ec) ? "is not a folder" : "no such folder",
               " (expected a Hugging Face model folder with config.json, the weights and tokenizer.json)");
  ModelConfig m = load_model_config(c.model);
  is_fp8_block_checkpoint(m, c.model);  // (a quantization_config soltrain does not read: one line, before any work)
  if (m.num_labels > 0 && !(m.token_classifier ? c.process_reward_model : c.dpo.reward_model))
    refuse_classifier(c.model, m);
  if (c.dpo.reward_model) make_sequence_classifier(m, 1, m.pad_token_id);  // (the run reads it as its classifier)
  if (c.process_reward_model) make_token_classifier(m, c.num_labels);
  if (c.muon && m.moe_layers() > 0)
    user_error("optimizer: muon on a mixture-of-experts model (", m.architecture, ") is not built yet");
  if (m.moe_layers() > 0) {  // (the model refuses them too, once loaded: here no output is made first)
    if (c.fp8_hybrid) user_error(moe_refusal(m, MoeUnsupported::Fp8Recipe));
    if (c.token_tile != kTokenTileAuto) user_error(moe_refusal(m, MoeUnsupported::TokenTile));
    if (c.grpo.generation_overlap) user_error(moe_refusal(m, MoeUnsupported::GenerationOverlap));
  }
  if (c.qat)
    if (const std::string why = qat_refusal(*c.qat, m); !why.empty()) user_error(why);
  if (c.lora.enabled)
    if (const std::string why = modules_to_save_refusal(c.lora.modules_to_save, m); !why.empty()) user_error(why);
  if (c.sequence_len > m.max_position_embeddings)
    user_error("sequence_len ", c.sequence_len, " is longer than the model's max_position_embeddings (",
               m.max_position_embeddings, ", ", (c.model / "config.json").string(),
               "): lower sequence_len, or raise max_position_embeddings there if you mean to extend the context");
  const int64_t tokens = int64_t(c.per_device_train_batch_size) * c.sequence_len;
  if (tokens > INT_MAX)
    user_error("per_device_train_batch_size ", c.per_device_train_batch_size, " x sequence_len ", c.sequence_len, " = ",
               tokens, " tokens per micro-batch: more than ", INT_MAX, "; lower one of them");
}

}  // namespace soltrain
