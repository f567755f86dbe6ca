// What every run builds from its config in one way (sft, pt, dpo, bench, the Python API): the adapters and
// their base storage, the model's settings and plan, the optimizer, the schedule, the save / eval cadence and
// the final outputs. A second copy of any of these drifts: DPO once built its own LoraConfig without
// `base_format` (qlora_nf4 trained a dense base), its own schedule without the cosine floor, and its own
// final save without merge_adapter.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>

#include "core/error.h"
#include "data/shards.h"
#include "dist/communicator.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "train/optimizer.h"
#include "train/schedule.h"
#include "train/train_config.h"

namespace soltrain {

// Runs `prepare` (reading and tokenizing the datasets), its UserErrors raised as DataError: the Python API
// tells a bad dataset from a bad config.
template <typename Prepare>
auto as_data_error(Prepare&& prepare) {
  try {
    return prepare();
  } catch (const DataError&) {
    throw;
  } catch (const UserError& e) {
    throw DataError(e.what());
  }
}

// The adapters the config asks for (nullopt: full fine-tuning), checked; `base_format` and the offloaded base
// included.
// `where` names the settings in its errors.
std::optional<LoraConfig> lora_config(const TrainConfig& c, const char* where = "config.yaml");

// A reward model's pad token id, as TRL's RewardTrainer chooses it: special_tokens' pad_token, else the
// tokenizer's pad_token, else its eos_token.
int reward_pad_token_id(const TrainConfig& c);

// The config's model as loaded (with its adapters), every token id of `data` checked against its vocabulary.
// `gradients`: false when ZeRO-3 gives each rank only its gradient slices. With `comm` (data parallel) and
// zero_stage 3 each rank allocates and reads only its slices (zero3_cut: the whole model is never on one rank);
// `weight_bytes_read` gets the bytes of the checkpoint's weights it read. With ep_size over `comm`'s ranks and a
// frozen base, each rank holds only its share of the experts' base weights.
// (reward_model: the model read as its family's sequence classifier, model/checkpoint.h AsClassifier)
std::unique_ptr<Transformer> load_run_model(const TrainConfig& c, Ops& ops, const std::optional<LoraConfig>& lora,
                                            std::initializer_list<const ShardSet*> data, bool gradients = true,
                                            const Communicator* comm = nullptr, size_t* weight_bytes_read = nullptr);

// The model's run settings (residual dtype, attention backward form, FP8 recipe, token tile, offloaded
// checkpoints, expert parallelism over `comm`'s ranks), then its plan for micro-batches of `rows` x
// sequence_len. Paths without ranks (null `comm`) refuse ep_size in one line.
void configure_model(Transformer& model, const TrainConfig& c, Ops& ops, int rows, Communicator* comm = nullptr);

// One update holds its gradient_accumulation_steps x `world` micro-batches of `rows` x sequence_len on the
// host at once: refused in one line (host_memory.h) when they do not fit, before they are allocated.
void check_update_batches_fit(const TrainConfig& c, int world, int rows);

OptimizerConfig optimizer_config(const TrainConfig& c);
// How the model's store keeps its trainable tensors: gradients or not, masters fp32 or (bf16_stochastic_round) bf16.
StoreOptions store_options(const TrainConfig& c, bool gradients = true);

// The learning-rate schedule over `total_steps` updates (warmup from warmup_ratio when no warmup_steps).
ScheduleConfig schedule_config(const TrainConfig& c, int64_t total_steps);

// The number of optimizer updates of a run (max_steps, or num_epochs over the micro-batches of an epoch).
int64_t total_training_steps(const TrainConfig& c, int64_t micro_batches_per_epoch);

// When to save and evaluate: the config's steps, or Axolotl's saves_per_epoch / evals_per_epoch turned into
// steps of an epoch of `steps_per_epoch` updates (save_steps / eval_steps win when both are given).
struct Cadence {
  int64_t save_steps = 0, eval_steps = 0;
};
Cadence run_cadence(const TrainConfig& c, int64_t steps_per_epoch);

// "trainable params: 4,194,304 || all params: 6,742,609,920 || trainable%: 0.0622", PEFT's
// print_trainable_parameters line (all: the trainable and the frozen weights).
std::string describe_parameters(const ParameterStore& ps);

// "LoRA r16 on q,k,v,o,gate,up,down over a frozen NF4 base (qlora_nf4)": what every run prints of its adapters.
std::string describe_lora(const TrainConfig& c);

// The end of a run: the adapter (PEFT's folder, output_dir/adapter) or the model (output_dir/model), with
// merge_adapter the merged model in output_dir/merged. Returns the summary line's
// middle ("adapter saved to ...; merged model saved to ...").
std::string save_final_outputs(const TrainConfig& c, const Transformer& model, bool lora);

}  // namespace soltrain
