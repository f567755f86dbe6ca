#include "train/run_builder.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "core/host_memory.h"
#include "data/sample_encoder.h"
#include "model/checkpoint.h"
#include "model/lora_merge.h"
#include "model/peft_adapter.h"
#include "model/random_weights.h"
#include "tokenizer/tokenizer.h"
#include "train/data_parallel.h"
#include "train/run_tokenizer.h"
#include "train/trained_model.h"

namespace soltrain {

namespace fs = std::filesystem;

std::optional<LoraConfig> lora_config(const TrainConfig& c, const char* where) {
  if (!c.lora.enabled) return std::nullopt;
  LoraConfig l{c.lora.rank,           float(c.lora.alpha), float(c.lora.dropout),
               c.lora.target_modules, c.lora.use_rslora,   c.seed};
  l.all_linear = c.lora.all_linear;
  l.loftq_iter = c.lora.loftq_iter;
  l.modules_to_save = c.lora.modules_to_save;
  l.base_format = c.lora.base;
  l.offload_base = c.offload_weights;
  l.offload_resident_layers = c.offload_weights_resident_layers;
  l.validate(where);
  return l;
}

int reward_pad_token_id(const TrainConfig& c) {
  // TRL's RewardTrainer: the tokenizer's pad token, else its eos token (Axolotl's special_tokens set them in the
  // run's tokenizer: train/run_tokenizer.h)
  const fs::path dir = run_tokenizer_folder(c), tc = dir / "tokenizer_config.json";
  std::string pad;
  if (fs::exists(tc)) pad = read_special_token(tc, "pad_token");
  if (pad.empty() && fs::exists(tc)) pad = read_special_token(tc, "eos_token");
  if (pad.empty())
    user_error(tc.string(),
               ": no pad_token or eos_token: a reward model needs one to find each sequence's last "
               "token (set special_tokens: {pad_token: ...})");
  const std::optional<int32_t> id = Tokenizer::load(dir / "tokenizer.json").token_to_id(pad);
  if (!id) user_error("the pad token \"", pad, "\" is not in ", (dir / "tokenizer.json").string(), "'s vocabulary");
  return *id;
}

std::unique_ptr<Transformer> load_run_model(const TrainConfig& c, Ops& ops, const std::optional<LoraConfig>& lora,
                                            std::initializer_list<const ShardSet*> data, bool gradients,
                                            const Communicator* comm, size_t* weight_bytes_read) {
  // (the rank's place in its expert-parallel group, as configure_model splits the ranks; with LLEP any rank may
  // run any expert's rows, so each holds them all)
  const ExpertShare share = comm && c.ep_size > 1 && comm->size() % c.ep_size == 0 && !c.ep_balance.on
                                ? ExpertShare{comm->rank() % c.ep_size, c.ep_size}
                                : ExpertShare{};
  // process_reward_model: labels per step, below num_labels; any other run: no labels
  for (const ShardSet* set : data) {
    if (set->documents() > 0 && set->token_labels != c.process_reward_model)
      user_error(c.process_reward_model ? "process_reward_model: true trains on stepwise_supervised datasets only"
                                        : "stepwise_supervised data (a label per step) trains a process reward model: "
                                          "set process_reward_model: true");
    if (const int top = max_token_label(*set); top >= c.num_labels && c.process_reward_model)
      user_error("a step's label is ", top, " but num_labels is ", c.num_labels, " (labels are 0 .. num_labels - 1)");
  }
  // reward_model: the family's sequence classifier, its outputs pooled at the tokenizer's pad id as TRL sets it;
  // process_reward_model: its token classifier
  std::optional<AsClassifier> classifier;
  if (c.dpo.reward_model) classifier = AsClassifier{reward_pad_token_id(c)};
  if (c.process_reward_model) classifier = AsClassifier{-1, c.num_labels};
  StoreOptions store = store_options(c, gradients);
  // ZeRO-3: each rank allocates and reads only its slices (DataParallel's cut)
  // (a rank holding a share of the experts keeps its frozen base whole: DataParallel's rule)
  if (comm && c.zero_stage == 3)
    store = sliced_for_zero3(store, *comm, optimizer_config(c).moments, /*shard_frozen=*/share.of == 1);
  auto model = load_pretrained(c.model, ops, lora, store, share, classifier, run_vocab_resize(c), weight_bytes_read);
  if (c.reinit_weights) {  // (every rank draws the same from the seed)
    init_weights(*model, c.seed);
    if (!comm || comm->rank() == 0)
      std::fprintf(stderr,
                   "note: reinit_weights: the base weights drawn afresh from seed %llu (normal(0, %g)), not "
                   "the checkpoint's\n",
                   static_cast<unsigned long long>(c.seed), model->config().initializer_range);
  }
  for (const ShardSet* set : data)
    for (int32_t id : set->tokens)
      if (id < 0 || id >= model->config().vocab_size)
        user_error(c.model.string(), ": the tokenizer produced id ", id, " but the model's vocab_size is ",
                   model->config().vocab_size);
  return model;
}

void configure_model(Transformer& model, const TrainConfig& c, Ops& ops, int rows, Communicator* comm) {
  if (c.ep_size > 1) {
    const int world = comm ? comm->size() : 1;
    if (world % c.ep_size != 0)
      user_error("ep_size ", c.ep_size, " needs an sft or pt run over a multiple of ", c.ep_size,
                 " ranks (gpus: N or mpirun); this one has ", world);
    // groups of ep_size consecutive ranks; every rank joins the split, in the same order
    model.set_expert_parallel(comm->split(comm->rank() / c.ep_size), c.ep_balance);
  }
  model.set_residual_dtype(c.residual_dtype);
  ops.set_attention_backward(c.attention_backward);
  if (c.fp8_hybrid) model.enable_fp8(c.fp8);  // (data parallel: TrainStep max-reduces the amaxes)
  if (c.qat) model.enable_qat(*c.qat);
  model.set_token_tile(c.token_tile);
  model.set_offload_checkpoints(c.offload_activations);
  model.plan(rows, c.sequence_len, c.recompute);
}

void check_update_batches_fit(const TrainConfig& c, int world, int rows) {
  const uint64_t micro = uint64_t(c.gradient_accumulation_steps) * uint64_t(std::max(world, 1));
  // input_ids, targets and positions (int32) per token, plus the batch's own record.
  const uint64_t bytes = micro * (sizeof(HostBatch) + uint64_t(rows) * uint64_t(c.sequence_len) * 12);
  check_host_memory(bytes,
                    cat("one update's ", micro, " micro-batches (gradient_accumulation_steps ",
                        c.gradient_accumulation_steps, world > 1 ? cat(" x ", world, " ranks") : "", ")"),
                    "lower gradient_accumulation_steps");
}

StoreOptions store_options(const TrainConfig& c, bool gradients) {
  // (optimizer_in_backward: no whole-model gradient buffer is ever allocated; TrainStep's BackwardUpdate makes the
  // head's group's and the two layer slots)
  return {gradients && !c.optimizer_in_backward, c.bf16_stochastic_round ? DType::BF16 : DType::F32};
}

OptimizerConfig optimizer_config(const TrainConfig& c) {
  OptimizerConfig o{float(c.learning_rate), c.adamw_beta1,          c.adamw_beta2, float(c.adamw_epsilon),
                    float(c.weight_decay),  float(c.max_grad_norm), c.moments,     c.offload};
  // (Axolotl's Muon: its momentum is the second beta, 0.95 unless both betas are given)
  o.in_backward = c.optimizer_in_backward;
  if (c.muon) o.muon = MuonSettings{float(c.adamw_beta2)};
  if (c.normuon)
    o.muon = MuonSettings{float(c.normuon_momentum), 5, true, float(c.normuon_beta2), c.normuon_cautious_wd};
  return o;
}

ScheduleConfig schedule_config(const TrainConfig& c, int64_t total_steps) {
  ScheduleConfig s{c.lr_scheduler_type, total_steps,           c.warmup_steps,
                   c.wsd_decay_ratio,   c.cosine_min_lr_ratio, c.quadratic_warmup};
  if (c.warmup_steps == 0 && c.warmup_ratio > 0) s.warmup_steps = warmup_from_ratio(total_steps, c.warmup_ratio);
  return s;
}

int64_t total_training_steps(const TrainConfig& c, int64_t micro_batches_per_epoch) {
  if (c.max_steps > 0) return c.max_steps;
  // HF: updates per epoch = micro-batches // accumulation (at least 1), times the epochs, rounded up.
  const int64_t per_epoch = std::max<int64_t>(1, micro_batches_per_epoch / c.gradient_accumulation_steps);
  return std::max<int64_t>(1, int64_t(std::ceil(c.num_epochs * double(per_epoch))));
}

Cadence run_cadence(const TrainConfig& c, int64_t steps_per_epoch) {
  steps_per_epoch = std::max<int64_t>(1, steps_per_epoch);
  auto every = [&](double per_epoch) { return std::max<int64_t>(1, int64_t(double(steps_per_epoch) / per_epoch)); };
  return {c.save_steps == 0 && c.saves_per_epoch > 0 ? every(c.saves_per_epoch) : c.save_steps,
          c.eval_steps == 0 && c.evals_per_epoch > 0 ? every(c.evals_per_epoch) : c.eval_steps};
}

std::string save_final_outputs(const TrainConfig& c, const Transformer& model, bool lora) {
  const fs::path saved = c.output_dir / (lora ? "adapter" : "model");
  save_trained_model(c, model, saved);  // PEFT's / transformers' layout: peft, vLLM and soltrain merge read it
  std::string summary = cat(lora ? "adapter" : "model", " saved to ", saved.string());
  // Surogate's merge_adapter: the adapter stays where PEFT reads it, the merged model goes next to it.
  if (lora && c.merge_adapter) {
    const fs::path merged = c.output_dir / "merged";
    merge_adapter(c.model, saved, merged);
    copy_tokenizer_files(run_tokenizer_folder(c), merged);  // the run's tokenizer (tokens / special_tokens)
    summary += cat("; merged model saved to ", merged.string());
  }
  return summary;
}

namespace {
std::string thousands(int64_t n) {
  std::string s = std::to_string(n);
  for (int i = int(s.size()) - 3; i > 0; i -= 3) s.insert(size_t(i), ",");
  return s;
}
}  // namespace

std::string describe_parameters(const ParameterStore& ps) {
  const int64_t trainable = ps.numel(), all = ps.numel() + ps.frozen_numel();
  char pct[32];
  std::snprintf(pct, sizeof pct, "%.4f", all > 0 ? 100.0 * double(trainable) / double(all) : 0.0);
  return cat("trainable params: ", thousands(trainable), " || all params: ", thousands(all), " || trainable%: ", pct);
}

std::string describe_lora(const TrainConfig& c) {
  std::string mods;
  for (const std::string& m : c.lora.target_modules) {
    if (!mods.empty()) mods += ",";
    mods.append(m, 0, m.find("_proj"));
  }
  std::string out = cat("LoRA r", c.lora.rank, " on ", mods);
  if (c.lora.base != WeightFormat::Dense)
    out += cat(" over a frozen ",
               c.lora.base == WeightFormat::Nf4       ? "NF4"
               : c.lora.base == WeightFormat::Int8Row ? "LLM.int8 (row-wise int8)"
               : c.lora.base == WeightFormat::Nvfp4   ? "NVFP4 (E2M1, E4M3 scales per 16)"
                                                      : "FP8 (128x128 blocks)",
               " base (", c.lora.base_key, ")");
  return out;
}

}  // namespace soltrain
