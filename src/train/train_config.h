// The typed configuration of a training run (what the YAML file says, defaults filled in). The CLI
// parses and validates it (cli/config.h); the trainer only reads it.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/loader.h"
#include "model/expert_placement.h"
#include "model/grpo_objective.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "tokenizer/tokenizer_edits.h"
#include "train/optimizer.h"
#include "train/schedule.h"

namespace soltrain {

struct DatasetSpec {
  std::filesystem::path path;
  DatasetType type = DatasetType::kAuto;
  DatasetFields fields;  // field names, roles and system_prompt of this dataset
  std::string split;     // Axolotl / Surogate `split`: a folder's files of this split
  // Hugging Face's slice of a split, `train[:20%]`, `train[10:-5]`: bounds as written (empty: open), kept
  // as text and resolved against the number of documents (train_data.cpp).
  std::optional<std::pair<std::string, std::string>> slice;
  int64_t samples = 0;  // Surogate `samples`: > 0 takes this many documents (see train_data.cpp)
  std::string hub_id;   // `path: org/name` naming a hub dataset (not a local path): resolved by cli/hub_inputs.h
  std::string revision = "main";
  // Axolotl's `name` (Surogate's `subset`): the hub dataset's config, as its card (README.md) defines configs;
  // `data_files`: the repository's (or folder's) files to read, paths or globs (cli/hub_inputs.h).
  std::string name;
  std::vector<std::string> data_files;
  std::string preference_type = "auto";  // DPO runs: the record shape (data/preference.h find_preference_format)
  // Axolotl's stepwise_supervised entries may carry TRL's PRMConfig settings themselves (examples/qwen2/prm.yaml):
  // they win over the top-level step_separator / train_on_last_step_only for this dataset
  std::optional<std::string> step_separator;
  std::optional<bool> train_on_last_step_only;
  // A streamed hub dataset's file, not downloaded when the run starts (cli/hub_inputs.h): fetched into `path` when the
  // stream reaches it (the dataset repository, its commit and the file's path in it).
  struct HubFetch {
    std::string repo, commit, file;
  };
  std::optional<HubFetch> fetch;
};

// Preference training (`soltrain dpo`, or `rl: dpo` in a config): TRL's DPOConfig names and defaults.
struct DpoSettings {
  bool enabled = false;
  PreferenceLoss loss = PreferenceLoss::Sigmoid;  // loss_type (rl: ipo sets ipo)
  bool loss_given = false;                        // loss_type set in the config
  // rl: orpo / simpo / kto: TRL's ORPO, CPO (loss_type simpo) and KTO trainers; a loss_type must then agree
  std::optional<PreferenceLoss> method;
  double beta = 0.1, label_smoothing = 0, rpo_alpha = 0;
  double desirable_weight = 1, undesirable_weight = 1;  // KTO's (Axolotl: kto_desirable_weight, ...)
  bool apo_zero_unpaired = false;           // loss_type apo_zero_unpaired (rl: kto): KTO's loss with the KL estimate 0
  bool beta_given = false;                  // beta (rl_beta) set: Axolotl's orpo_alpha then does not replace it
  std::optional<double> orpo_alpha;         // Axolotl's: beta when beta is not given (meant for ORPO)
  double cpo_alpha = 1, simpo_gamma = 0.5;  // TRL's CPOConfig: SimPO's NLL term's weight and target margin
  int64_t max_prompt_len = 0;  // 0: prompts are not cut (a prompt with no room for an answer is a bad record)
  // LoRA: the reference's log-probs computed once before training (the adapters off) and stored, as full
  // fine-tuning always does, instead of a forward with the adapters off in every step (Axolotl's key).
  bool precompute_ref = false;
  // reward_model (Axolotl's; TRL's RewardTrainer): the pairs train a Bradley–Terry reward model, the model read as
  // its family's sequence classifier with one label (model/reward_objective.h) instead of a preference loss
  bool reward_model = false;
  double center_rewards_coefficient = 0;  // TRL's: + this × (r_chosen + r_rejected)² per pair
};

// Online RL (`soltrain grpo`, or `rl: grpo`): TRL's GRPOConfig names and defaults. Each update generates
// per_device_train_batch_size x gradient_accumulation_steps completions, num_generations per prompt, scores them
// with the reward functions and trains on them num_iterations times.
struct GrpoSettings {
  bool enabled = false;
  GrpoConfig loss;  // loss_type, scale_rewards, beta, epsilon(_high), delta, importance_sampling_level, ...
  int num_generations = 8, max_prompt_length = 512, num_iterations = 1;
  bool mask_truncated_completions = false;
  bool epsilon_high_given = false;   // else epsilon_high is epsilon
  std::filesystem::path config_dir;  // the config file's folder: Python reward modules are found there too
  // Built-in names (accuracy, think_format), `module.path:function` (Python, TRL's signature), an http(s)://
  // endpoint or a `command:...` (train/external_reward.h).
  std::vector<std::string> reward_funcs;
  int reward_timeout = 600;            // seconds an endpoint or command may take per batch
  std::vector<double> reward_weights;  // empty: 1 each
  // Sampling (TRL's generation keys): temperature also divides the logits of the trained log-probs.
  double temperature = 1.0, top_p = 1.0, min_p = 0.0, repetition_penalty = 1.0;
  int top_k = 0;
  // `stop_strings` (TRL's generation_kwargs `stop` / `stop_strings`): a completion ends at the token completing
  // one (kept; counted as terminated, not truncated, unlike TRL's EOS-only test: the README says so)
  std::vector<std::string> stop_strings;
  // The memory generation may take (generation_memory_gib, or generation_memory_fraction of the device's); both
  // 0: whatever is free when it is allocated.
  double generation_memory_gib = 0, generation_memory_fraction = 0;
  // One step off-policy (TRL's AsyncGRPOTrainer at max_staleness 1, NeMo-RL's async GRPO at age 1): the next
  // batch's completions are generated from the update's starting weights while the update trains, on a second
  // backend in a thread of its own; its old log-probs are the trainer's under those weights (the PPO ratio carries
  // the staleness).
  bool generation_overlap = false;
  bool log_completions = false;
  int num_completions_to_print = 4;
  // TRL's use_vllm and vllm_importance_sampling_* (its correction for the generation engine's log-probs): soltrain
  // generates in its own engine either way; the correction is on when vllm_importance_sampling_correction says so, or
  // (not given) with use_vllm, TRL's default there. Resolved into loss.sampling_correction (cli/config.cpp).
  bool use_vllm = false;
  int sampling_correction_given = -1;  // -1: not given; else the value of vllm_importance_sampling_correction
  std::string sampling_correction_mode = "sequence_mask";
  double sampling_clip_min = NAN, sampling_clip_max = 3.0;  // NaN: none
};

struct LoraSettings {  // as written in the YAML; the model layer's LoraConfig is built from it
  bool enabled = false;
  int rank = 16;
  double alpha = 32, dropout = 0.0;
  std::vector<std::string> target_modules = all_lora_module_names();
  std::vector<std::string> modules_to_save;  // Axolotl's lora_modules_to_save: embed_tokens, lm_head
  // Given as PEFT's `all-linear` (or Axolotl's lora_target_linear): every linear layer, which on an MoE model
  // PEFT takes to include the router and Qwen2-MoE's shared_expert_gate (model/transformer.cpp refuses it there).
  bool all_linear = false;
  bool use_rslora = false;
  int loftq_iter = 0;  // Axolotl's peft: {loftq_config: ...}: LoftQ's initialisation (model/loftq.h); 0: off
  // QLoRA (`qlora_nf4`, `qlora_fp8`, Axolotl's `load_in_4bit` / `adapter: qlora`): the frozen base's
  // projections held quantised. `base_key` is the key that asked, for messages.
  WeightFormat base = WeightFormat::Dense;
  std::string base_key;
};

enum class TrainMode { kSft, kPretrain, kDpo, kGrpo };

// resume_from_checkpoint: start fresh, continue the newest checkpoint in output_dir (`true`), or a folder.
struct ResumeFrom {
  enum Kind { kFresh, kLatest, kFolder } kind = kFresh;
  std::filesystem::path folder;  // kFolder only
};

// Pushing to the hub (HF TrainingArguments' push_to_hub, hub_model_id, hub_strategy, hub_private_repo).
struct HubPush {
  bool enabled = false;  // push_to_hub, or a hub_model_id given (Axolotl pushes when it is)
  std::string model_id;  // Org/Name
  // end: the final model or adapter; every_save: also the model at each checkpoint; checkpoint: and the latest
  // checkpoint whole in last-checkpoint/; all_checkpoints: every checkpoint whole in checkpoint-N/.
  std::string strategy = "every_save";
  bool private_repo = false;
};

// Experiment trackers fed through their Python libraries (train/trackers.h): HF's report_to, Axolotl's wandb_*,
// mlflow_* and (its SwanLab plugin's) swanlab_* keys (settings by the key's suffix: wandb_project -> "project").
struct Trackers {
  bool wandb = false, mlflow = false, swanlab = false;
  bool swanlab_plugin = false;  // Axolotl's SwanLabPlugin listed in plugins (use_swanlab then defaults to true)
  std::optional<bool> use_swanlab;
  std::map<std::string, std::string> wandb_settings, mlflow_settings, swanlab_settings;
  std::string run_name;  // HF's run_name
  // Axolotl's OpenTelemetry metrics (use_otel_metrics): a Prometheus endpoint at http://host:port/metrics
  bool otel = false;
  std::string otel_host = "localhost";
  int otel_port = 8000;
  std::optional<bool> use_wandb;  // Axolotl's switch (false: no wandb even with a wandb_project)
  bool any() const { return wandb || mlflow || swanlab || otel; }
};

struct TrainConfig {
  std::filesystem::path model, output_dir;
  std::string model_hub_id;       // `model: Org/Name` naming a hub model: resolved into `model` by cli/hub_inputs.h
  std::string revision = "main";  // of the hub model
  std::vector<DatasetSpec> datasets, validation_datasets;
  double validation_split_ratio = 0.0;  // used when validation_datasets is empty
  int64_t validation_count = 0;         // > 0: this many documents instead of the ratio (val_set_size: 100)
  int sequence_len = 2048;
  bool sample_packing = true, train_on_inputs = false;
  int per_device_train_batch_size = 1, gradient_accumulation_steps = 1;
  double num_epochs = 1;
  int64_t max_steps = 0;  // > 0 overrides num_epochs
  double learning_rate = 1e-5;
  ScheduleType lr_scheduler_type = ScheduleType::kLinear;
  int64_t warmup_steps = 0;
  double warmup_ratio = 0.0, wsd_decay_ratio = 0.1;
  // Axolotl's cosine_min_lr_ratio (the cosine schedule's floor) and cosine_constant_lr_ratio (a constant tail
  // at the floor, not built: refused when both are non-zero).
  double cosine_min_lr_ratio = 0, cosine_constant_lr_ratio = 0;
  // Axolotl's lr_quadratic_warmup with its cosine schedule: the warmup rises as (k / warmup)² (rule_axolotl_schedule)
  bool quadratic_warmup = false;
  double weight_decay = 0.0, max_grad_norm = 1.0;
  double adamw_beta1 = 0.9, adamw_beta2 = 0.999, adamw_epsilon = 1e-8;
  Moments moments = Moments::F32;  // `optimizer: adamw_8bit` (and bitsandbytes' names for it): Blockwise8
  bool muon = false;               // `optimizer: muon`: Muon on the hidden matrices, AdamW on the rest (optimizer.h)
  // Surogate's optimizer: normuon (with muon set): NorMuon (train/optimizer.h MuonSettings) and its keys
  bool normuon = false;
  double normuon_momentum = 0.95, normuon_beta2 = 0.95;
  bool normuon_cautious_wd = true;
  Offload offload;  // `offload_master`, `offload_optimizer`, `offload_grads`: that state in host memory
  bool optimizer_in_backward = false;  // each layer updated as its backward ends (train/backward_update.h)
  bool bf16_stochastic_round = false;  // trainable weights kept in bf16 only, updates rounded stochastically
  uint64_t seed = 42;
  bool reinit_weights = false;  // Axolotl's: the base drawn afresh from the seed (model/random_weights.h init_weights)
  Recompute recompute = Recompute::None;
  int64_t token_tile = 0;            // the MLP's token tile for long sequences; 0 = automatic (model/activation_plan.h)
  bool offload_activations = false;  // recompute full's layer-input checkpoints in host memory (Transformer)
  bool offload_weights = false;      // a frozen LoRA base streamed from host memory (model/weight_stream.h)
  int offload_weights_resident_layers = 0;  // ... but for this many of its layers, kept on the device
  std::optional<DType> residual_dtype;      // the residual stream on the GPU; unset: the run chooses (Transformer)
  AttentionBackward attention_backward = AttentionBackward::Split;  // how attention's backward forms dQ (kernels/ops.h)
  bool fp8_hybrid = false;                                          // recipe: fp8-hybrid (model/fp8_recipe.h)
  std::optional<QatSettings> qat;  // Axolotl's qat: block, quantisation-aware training (model/qat.h)
  Fp8Settings fp8;
  LoraSettings lora;
  DpoSettings dpo;
  GrpoSettings grpo;
  int64_t save_steps = 0;    // 0 = only at the end (and on Ctrl-C)
  int save_total_limit = 0;  // 0 = keep all
  ResumeFrom resume_from_checkpoint;
  int64_t eval_steps = 0;  // 0 = only before and after training
  // train/early_stopping.h: stop after this many evaluations without a lower validation loss (0: never) ...
  int early_stopping_patience = 0;
  double early_stopping_threshold = 0;  // ... lower by more than this
  // The final model is the checkpoint with the lowest validation loss; unset: on with early stopping where a
  // checkpoint is written at every evaluation (as Axolotl sets it).
  std::optional<bool> load_best_model_at_end;
  // Axolotl's saves_per_epoch / evals_per_epoch: turned into steps once the steps per epoch are known;
  // save_steps / eval_steps win when both are given.
  double saves_per_epoch = 0, evals_per_epoch = 0;
  std::string chat_template;       // Axolotl's top-level chat_template: datasets without their own use it
  std::vector<std::string> notes;  // what the reader decided for the user, printed first by the run
  // A peer config's FSDP / DeepSpeed settings as read (cli/peer_sharding.h), turned into zero_stage and the
  // offload switches once every key is read.
  struct PeerSharding {
    std::vector<std::string> keys;  // the keys that asked, in the file's order
    std::vector<std::string> said;  // what they said ("FULL_SHARD", "offload_params"), for the note
    int stage = -1;                 // the ZeRO stage they mean; -1: none said
    bool offload_params = false, offload_optimizer = false;
    std::string source;  // DeepSpeed's JSON (its path, or "inline"), for problems with `fixed`
    // DeepSpeed's batch settings given as numbers, not "auto": (name, value), checked against the config's own
    std::vector<std::pair<std::string, double>> fixed;
  } peer_sharding;
  // Axolotl's special_tokens, tokens and added_tokens_overrides, applied to a copy of the model's tokenizer
  // (train/run_tokenizer.h), and its embedding resizing rules (resize_token_embeddings_to_32x, shrink_embeddings,
  // mean_resizing_embeddings: transformers' resize_token_embeddings as Axolotl calls it).
  TokenizerEdits tokenizer_edits;
  bool resize_to_32x = false, shrink_embeddings = false, mean_resizing = true;
  // Axolotl's tokenizer_use_mistral_common: the model's tekken.json and mistral-common's chat format (its version's)
  // instead of tokenizer.json and the repository's template (tokenizer/tekken.h)
  bool mistral_common = false;
  int64_t logging_steps = 1;
  Device device = Device::CPU;
  BadRecordPolicy bad_records = BadRecordPolicy::kError;
  std::filesystem::path dataset_prepared_path;  // shard cache; default output_dir/prepared
  double loss_watchdog_threshold = 0;           // > 0: stop when the loss stays above it (Axolotl's key)
  int loss_watchdog_patience = 3;               // for this many consecutive steps
  bool overwrite_output_dir = false;            // write into a non-empty folder soltrain did not create
  std::string source_text;                      // the YAML as given plus overrides, saved with checkpoints
  std::filesystem::path dump_batches;           // `--dump-batches DIR`: every micro-batch trained on, as files
  // Data parallel: `gpus: N` starts N worker processes of this binary on this machine (CPU ranks when
  // device: cpu); ZeRO's stage (DeepSpeed's meaning) when there is more than one rank.
  int gpus = 1;
  int zero_stage = 0;
  // A Ray job (Axolotl's use_ray / ray_num_workers / resources_per_worker, Surogate's distributed block): the
  // command hands the run to soltrain's Python launcher (python/soltrain/ray.py), which starts num_workers Ray
  // actors as the job's ranks (torchrun's variables, rank 0's node as the rendezvous) in a placement group of
  // `resources` each; with none given, a GPU each (a CPU each with device: cpu).
  struct RayJob {
    bool enabled = false;
    std::string address;  // "auto", "ray://host:port", or "" (a cluster already joined, else a local one)
    int num_workers = 1;
    int nodes = 0;  // Surogate's num_nodes with gpus_per_node 0: num_workers = nodes x gpus (rule_ray)
    std::map<std::string, double> resources;
  } ray;
  // Expert parallelism (Surogate's key, model/expert_parallel.h): MoE experts split over groups of this many
  // ranks, tokens sent to their experts' ranks and back. 1: off.
  int ep_size = 1;
  // LLEP (model/expert_placement.h): with ep_size > 1, a layer whose experts' rows are imbalanced over the
  // group runs the busiest experts' excess on the least loaded ranks; every rank then holds every expert.
  LoadBalance ep_balance;
  // Seconds a rank waits on another at the rendezvous or in a host collective before the job ends naming
  // the silent rank (HF TrainingArguments' ddp_timeout, 1800 s).
  int ddp_timeout = 1800;
  // Checkpoints written by a thread from a host snapshot while training goes on (one process; data parallel
  // saves stay in step). false: written from the device before the next step.
  bool background_checkpoints = true;
  bool tensorboard = true;  // output_dir/tensorboard events beside metrics.jsonl (use_tensorboard, report_to)
  // The launcher restarts a job whose rank died (killed, crashed, hung past ddp_timeout) from its last complete
  // checkpoint, up to max_restarts times, at the same rank count (fewer GPUs if some are gone).
  bool auto_resume = false;
  // A NaN or infinite loss (or gradient norm) restores the newest checkpoint, finds the update that produced
  // it, and trains on without that update's batches, at most this many times; 0 stops the run at once.
  int skip_bad_batches = 1;
  int max_restarts = 3;
  bool shuffle = true;  // false (Axolotl's curriculum_sampling): the datasets' order
  // process_reward_model (Axolotl's; TRL's PRMTrainer): stepwise_supervised rows train the model read as its family's
  // token classifier (model/config.h token_classifier) with num_labels labels, each step's label at its last token.
  bool process_reward_model = false;
  int num_labels = 0;  // a classifier's labels as the config gives them (0: not given; a PRM's default is 2)
  // TRL's PRMConfig: the text after each step, and only the last step's label in the training data (not the
  // validation data's)
  std::string step_separator = "\n";
  bool train_on_last_step_only = false;
  bool dataset_exact_deduplication = false;  // Axolotl's: identical tokenized documents kept once
  int64_t min_sample_len = 0;                // Axolotl's: documents of fewer tokens are dropped (0: none)
  // The training datasets read as training goes, in order, never tokenized ahead nor whole in memory
  // (data/stream_loader.h): `streaming: true`, or Axolotl's pretraining_dataset (which also makes the run pt).
  bool streaming = false;
  bool pretraining_dataset = false;  // the datasets came as pretraining_dataset
  // Axolotl's excess_length_strategy: documents longer than sequence_len cut (soltrain's default), left out
  // (Axolotl's default, and so an Axolotl config's: rule_axolotl_defaults) or refused
  OverlongPolicy overlong = OverlongPolicy::kTruncate;
  bool merge_adapter = false;  // Surogate's: LoRA folded into the base, output_dir/merged
  // The type a full fine-tune's model is saved as; unset ("auto"): the base's own (bf16 for a bf16 base).
  std::optional<DType> save_dtype;
  TrainMode mode = TrainMode::kSft;  // the command (or `rl:`) that runs it
  bool verbose = false;              // --verbose: the whole memory plan (every activation buffer), not its top
  HubPush hub;
  Trackers trackers;
};

}  // namespace soltrain
