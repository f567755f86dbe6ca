// Moving a Transformer's weights to and from Hugging Face model folders.
#pragma once
#include <filesystem>

#include "io/safetensors.h"
#include "model/transformer.h"

namespace soltrain {

// Loads config.json and the weights of an HF folder onto the ops' device; with `lora`, the base is frozen
// and fresh adapters are added (see peft_adapter.h to load saved ones instead). `gradients`: Transformer's.
// With `expert_share` {i, P} (expert parallelism, rank i of a group of P) and a frozen base (`lora`), an MoE
// model holds only share i of its experts' base weights (MoeConfig::held_first).
struct ExpertShare {
  int index = 0, of = 1;
};
// With `classifier` (a reward model: the tokenizer's pad token id) a causal LM folder is read as its family's
// sequence classifier with one label (make_sequence_classifier: a new score head, its lm_head left unread), and a
// classifier folder keeps its head with that pad id. With `token_labels` (a process reward model) it is read as
// the family's token classifier with that many labels instead (make_token_classifier: a new score head and bias).
// A classifier folder read without it is a UserError.
struct AsClassifier {
  int pad_token_id = -1;
  int token_labels = 0;
};
// With `vocab` (a run whose tokenizer grew or shrank: train/run_tokenizer.h) the embedding and an untied LM head
// are resized to that many rows as transformers' resize_token_embeddings does (resize_vocabulary).
struct VocabResize {
  int rows = 0;
  bool mean_resizing = true;
};
std::unique_ptr<Transformer> load_pretrained(const std::filesystem::path& dir, Ops& ops,
                                             std::optional<LoraConfig> lora = std::nullopt, StoreOptions store = {},
                                             ExpertShare expert_share = {},
                                             std::optional<AsClassifier> classifier = std::nullopt,
                                             std::optional<VocabResize> vocab = std::nullopt,
                                             size_t* weight_bytes_read = nullptr);  // (load_weights' count)

// A model folder's weights under soltrain's names: a vision-language model's language model as a causal LM's
// (model_tensor_name), its vision tower aside (CheckpointReader::outside).
CheckpointReader open_model_checkpoint(const std::filesystem::path& dir, const ModelConfig& c);

// Copies every base parameter from the checkpoint (adapters excepted); missing or mis-shaped tensors are
// UserErrors. Into a sharded store (ZeRO-3's slices) each plainly stored trainable weight is read by the byte
// range of the elements this rank owns, nothing else of it. Returns the bytes of the weights it read (a tensor
// read whole counts whole).
size_t load_weights(Transformer& model, const std::filesystem::path& dir);

// What a model folder carries besides config.json and the weights, as transformers' save_pretrained and the
// tokenizer's save write them (chat_template.jinja included: transformers 4.45+ keeps the template there): every
// folder soltrain writes from a model (full fine-tune, merged model) copies those the source has, and a hub
// model's download fetches them.
inline constexpr const char* kModelSideFiles[] = {
    "generation_config.json",  "tokenizer.json",    "tokenizer_config.json",
    "special_tokens_map.json", "vocab.json",        "merges.txt",
    "tokenizer.model",         "added_tokens.json", "chat_template.jinja"};
// Copies those of kModelSideFiles that `from` has into `to`; UserError naming a file that cannot be copied.
void copy_model_side_files(const std::filesystem::path& from, const std::filesystem::path& to);
// The same, the tokenizer's files only (generation_config.json aside): what an adapter's folder carries. Both
// replace files `to` already has (a run's edited tokenizer over the model's).
void copy_tokenizer_files(const std::filesystem::path& from, const std::filesystem::path& to);

// The type a model folder's weights are stored in, as transformers reads it: config.json's `dtype` (`torch_dtype`
// before transformers 4.56), else its first floating tensor's; an FP8 checkpoint's is bf16 (what it dequantises
// to). What a full fine-tune is saved as by default, as HF Trainer, Axolotl and Surogate save a bf16 base in bf16.
DType model_dtype(const std::filesystem::path& model_dir);

// Writes into `dir` (an existing, staged folder) what transformers loads: config.json (its dtype saying
// `dtype`), safetensors (sharded past max_shard_bytes, with an index) of every parameter as `dtype` (F32, BF16
// or F16; the fp32 masters rounded to nearest even) and the tokenizer/generation files found in `source_dir`.
// Full fine-tuning only: a LoRA model saves its adapter (peft_adapter.h).
void write_pretrained(const Transformer& model, const std::filesystem::path& dir,
                      const std::filesystem::path& source_dir, DType dtype, size_t max_shard_bytes = size_t(5) << 30);
// The same as a folder of its own, atomic: it appears complete or not at all.
void save_pretrained(const Transformer& model, const std::filesystem::path& out_dir,
                     const std::filesystem::path& source_dir, DType dtype, size_t max_shard_bytes = size_t(5) << 30);

}  // namespace soltrain
