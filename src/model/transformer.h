// The decoder-only transformer (Llama / Qwen2 / Qwen3) for training, written once against Ops.
// A step flows one way: the batch goes to the device (through pinned staging, asynchronously) →
// forward (per-token NLL of the targets; per-document sums when the objective asks) → the Objective
// (loss and d loss / d NLL per token, on the device) → backward, with per-layer hooks → the optimizer.
// Activations for a (rows × seq_len) batch are planned and allocated once by plan(); a step allocates
// nothing and never waits for the host. The LM head and cross-entropy run in token chunks so full logits
// never exist at once. With a LoraConfig the base weights are frozen and every targeted projection gains
// a trainable adapter (model/linear.h).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "kernels/ops.h"
#include "model/activation_plan.h"
#include "model/config.h"
#include "model/fp8_recipe.h"
#include "model/layer.h"
#include "model/lora.h"
#include "model/objective.h"
#include "model/parameters.h"
#include "model/qat.h"
#include "model/weight_stream.h"

namespace soltrain {

// One batch on the host: rows × seq_len tokens, targets already shifted (-100 = not counted).
struct HostBatch {
  int rows = 0, seq_len = 0;
  std::vector<int32_t> input_ids, targets;
  // From the packing loader (empty = one document per row): positions restart at 0 for every packed
  // document; cu_seqlens are document start offsets into the flattened rows × seq_len tokens, ending
  // with rows × seq_len (a row's padding is a segment of its own), so attention can stay per document.
  std::vector<int32_t> positions, cu_seqlens;
  // Preference batches (DPO): per pair, the chosen then the rejected answer's document (indices into the
  // documents of cu_seqlens), flat; with full fine-tuning ref_nll holds the reference's Σ NLL of each of
  // those documents (same order), computed before training (model/dpo_objective.h). Empty otherwise.
  std::vector<int32_t> pairs;
  std::vector<float> ref_nll;
  // ORPO, whose NLL term also trains the chosen answer's prompt: per pair, how many of the chosen document's
  // first targets are its prompt's (kept as targets; the answer's log-prob does not count them). Empty otherwise.
  std::vector<int32_t> prompt_targets;
  // KTO (unpaired): each "pair" is an example and its KL document (the prompt with another example's
  // completion); per pair, 1 when the example's completion is desirable. Empty otherwise.
  std::vector<uint8_t> desirable;
  // GRPO batches (model/grpo_objective.h): one completion per row, its prompt's targets -100; per row its
  // advantage; per token −log p of the target under the policy that sampled it (old_nll: kept when a batch is
  // trained more than once) and under the reference (ref_token_nll, when the reference is not a pass of its
  // own), and under the generation engine's sampling distribution (sampling_nll: TRL's sampling_per_token_logps,
  // for its importance-sampling correction). Empty when not used.
  std::vector<float> advantages, old_nll, ref_token_nll, sampling_nll;

  int64_t counted() const;  // targets != -100
};

struct StepResult {
  double loss;      // mean cross-entropy over counted targets (NaN when none is counted)
  int64_t counted;  // targets != -100
};

// The residual stream's dtype as users spell it: auto (nullopt: the run chooses), fp32 or bf16.
std::optional<DType> parse_residual_dtype(const std::string& s, const std::string& where);

// Per-layer events of a step, for work that must follow the layers: reducing a layer's gradients as soon
// as they are final, gathering or prefetching its weights before use, offload copies. Parameter groups
// 0..L-1 are the decoder layers; group L holds the embedding, the final norm and the LM head (its
// gradients are final only after the embedding's backward, at the very end). Work a hook queues belongs
// on Ops::Stream::Side (switch with use_stream and back to Main, ordering with wait()); the caller makes
// Main wait for Side before the optimizer reads the gradients. before_forward(l + 1) fires inside layer l's
// forward, before the fused add + norm that reads layer l + 1's ln1 (the first read of its weights).
class LayerHooks {
 public:
  virtual ~LayerHooks() = default;
  virtual void before_forward(int /*group*/) {}   // its weights are about to be read by forward
  virtual void before_backward(int /*group*/) {}  // ... by backward (recompute included)
  virtual void grads_ready(int /*group*/) {}      // ParameterStore::group_grads(group) is final for this pass
};

// Settings Mixture-of-Experts layers do not run yet, refused in the same line by the run's early checks (before
// any output is made: train/run_checks.h) and by the model itself.
enum class MoeUnsupported { Fp8Recipe, TokenTile, GenerationOverlap };
std::string moe_refusal(const ModelConfig& c, MoeUnsupported what);

class Transformer {
 public:
  // Without `lora` every parameter trains (full fine-tuning); with it only the adapters do (A initialised as
  // PEFT does, B zero). Without `gradients` no gradient buffer is allocated (ParameterStore::allocate: for a
  // model ZeRO-3 shards, which gives each rank only its slices of them).
  Transformer(ModelConfig config, Ops& ops, std::optional<LoraConfig> lora = std::nullopt, StoreOptions store = {});
  ~Transformer();

  const ModelConfig& config() const { return config_; }
  const std::optional<LoraConfig>& lora() const { return lora_; }
  // LoRA dropout is applied in passes with backward (training), as PEFT applies it in train() mode only.
  // Each such pass draws fresh masks from (seed, pass count); set_dropout_step restores the count on resume,
  // and enable_dropout(false) turns it off (gradient dumps against a reference).
  void enable_dropout(bool on) { dropout_enabled_ = on; }
  void set_dropout_step(int64_t s) { dropout_step_ = s; }
  int64_t dropout_step() const { return dropout_step_; }  // passes with dropout so far (checkpoints keep it)
  // With LoRA, enable_adapters(false) makes forward run the frozen base alone: the reference model of
  // preference training at no memory cost. Forward only (no backward may follow) until turned back on.
  void enable_adapters(bool on) { adapters_on_ = on; }
  // The LM head's logits divided by `t` before the cross-entropy (and its gradient scaled alike): the log-probs of
  // the tempered distribution sampling drew from, as TRL's GRPO computes them. 1 by default.
  void set_logit_temperature(float t) { inv_temperature_ = 1.0f / t; }
  ParameterStore& params() { return params_; }
  const ParameterStore& params() const { return params_; }
  Ops& ops() { return ops_; }
  const std::vector<DecoderLayer>& layers() const { return layers_; }
  const Tensor& inv_freq() const { return inv_freq_t_; }
  int head_group() const { return config_.num_layers; }  // the parameter group of embedding, norm, head

  // The dtype of the residual stream (the embedding output, every layer's sums, the final hidden state) and of
  // its gradient, next to bf16 activations on the GPU. fp32 is what PEFT under bf16 autocast computes (its
  // residual adds run on fp32 tensors; only matmul inputs are rounded, here the norms' outputs and a bf16 copy
  // of the gradient); bf16 is what transformers computes on a model held in bf16, and halves those tensors'
  // memory and traffic. Unset (nullopt) chooses per run: fp32 with LoRA, where the adapters' small gradients
  // are the whole update and the step is GEMM-bound (1.1% of a Qwen3-8B LoRA step, 2.3 GiB), bf16 for full
  // fine-tuning (fp32 costs 2.2% of a Qwen3-0.6B step and 1.8 GiB; bench/NOTES.md run 19). Set before
  // plan(); the CPU computes in fp32 either way.
  void set_residual_dtype(std::optional<DType> d) { residual_dtype_ = d; }
  DType residual_dtype() const {
    return residual_dtype_for(ops_.activation_dtype(), residual_dtype_, lora_.has_value());
  }
  // The MLP's token tile (model/activation_plan.h): at most this many tokens of a pass run through the MLP at
  // once, so long sequences need no [tokens, intermediate] buffer (with recompute). 0: automatic. Set before
  // plan(). Results equal the untiled pass's, but for the weight gradients' summation order across tiles.
  void set_token_tile(int64_t tokens) { token_tile_ = tokens; }
  // `offload_activations`: with recompute full, the layer-input checkpoints (the only activations kept across
  // the pass) go to pinned host memory as forward writes them and come back one layer ahead of backward's
  // recompute; the device keeps a ring of kCheckpointSlots (model/activation_plan.h). Results are the
  // resident run's, bit for bit (the same values are read). Set before plan(); plan() refuses it without
  // recompute full, and refuses host memory that would not fit.
  void set_offload_checkpoints(bool on) { offload_checkpoints_ = on; }
  // Expert parallelism (model/expert_parallel.h) over `group`, this rank's group of the job: every MoE layer
  // runs its share of the experts for the group's tokens. Set before plan(); refused in one line where the
  // model or backend cannot (no MoE layers, experts not divisible by the group, not on CPU ranks). `balance`:
  // LLEP's settings (with it on, every expert's weights must be held here).
  void set_expert_parallel(std::unique_ptr<Communicator> group, const LoadBalance& balance = {});
  const ExpertParallel* expert_parallel() const { return ep_.get(); }
  // Sizes and allocates every activation for batches of `rows` × `seq_len` tokens.
  void plan(int rows, int seq_len, Recompute recompute = Recompute::None);
  size_t activation_bytes() const;
  size_t checkpoint_host_bytes() const;           // the offloaded checkpoints' host memory (0 without offload)
  const ActivationPlan& activation_plan() const;  // what plan() allocated, by buffer
  size_t staging_bytes() const;                   // the batch's pinned host staging (both slots)
  // The fp8-hybrid recipe (model/fp8_recipe.h) for the decoder layers' projections; a UserError when the
  // backend cannot run FP8 GEMMs (with the GPU it needs) or the base is quantised. Call once, before training.
  void enable_fp8(const Fp8Settings& s);
  // The [out, in] shapes of the projections enable_fp8 puts under the recipe, from the config alone (it checks
  // that they are the ones it registered): `bench --plan-only` sizes the recipe's buffers with them.
  static std::vector<std::pair<int64_t, int64_t>> fp8_projection_shapes(const ModelConfig& c, const Fp8Settings& s);
  const Fp8Recipe* fp8() const { return fp8_.get(); }
  Fp8Recipe* fp8() { return fp8_.get(); }
  size_t fp8_bytes() const;  // device memory of the recipe's FP8 copies, scales and scratch
  // Quantisation-aware training (model/qat.h) over every projection and the LM head; a UserError for what it
  // does not combine with (adapters, MoE layers, the fp8 recipe, a quantised base, classifier heads). Call once,
  // before plan().
  void enable_qat(const QatSettings& s);
  const QatState* qat() const { return qat_.get(); }
  // The optimizer steps completed before the next pass (QAT's fake_quant_after_n_steps reads it).
  void set_completed_steps(int64_t steps) {
    if (qat_) qat_->set_step(steps);
  }
  // After every optimizer update (the trainer's step does it): the recipe's scales and weight copies follow.
  void after_update();
  void set_hooks(LayerHooks* hooks) { hooks_ = hooks; }
  // `offload_weights` (LoraConfig::offload_base): the frozen base's decoder layers stream from host memory
  // through two device slots (model/weight_stream.h); null when the base is resident.
  const WeightStream* weight_stream() const { return weight_stream_.get(); }

  // Forward of one micro-batch. With `objective` and `backward_follows`, the objective's token weights
  // are taken (before forward when it knows them, fusing the LM head's backward into forward's chunks)
  // and backward() must be called next. `logits_out` (host, [rows*seq_len, vocab]) receives the logits.
  // Nothing here waits for the device except copying logits out.
  void forward(const HostBatch& batch, Objective* objective, bool backward_follows, float* logits_out = nullptr);
  // Gradients of the objective's loss added into params().grad (every trainable parameter).
  void backward(Objective& objective);
  // What the last forward produced (on the device).
  const ForwardOutputs& outputs() const;

  // Mixture-of-Experts models: the load-balancing loss (router_aux_loss_coef × transformers' aux loss, model/moe.h)
  // of the training passes since reset_aux_loss(), as HF Trainer adds it to each micro-batch's loss: part of the
  // update's loss (the trainer adds it to the objective's) and of its gradient. 0 without MoE layers or with
  // the loss off (output_router_logits false). read_aux_loss waits for the device.
  void reset_aux_loss();
  double read_aux_loss() const;
  // The experts' load in the last micro-batch (what the step's metrics show): per MoE layer, its busiest expert's
  // (token, expert) pairs over the mean (1: even), as moe_load_imbalance (the largest over layers) and
  // moe_load_imbalance_mean; with expert parallelism also the group's ranks' (ExpertParallel::load:
  // ep_load_imbalance, ep_load_imbalance_mean). Empty without MoE layers (or a plan); reads the device (a sync).
  std::vector<std::pair<std::string, double>> moe_load() const;
  Tensor aux_loss_sum() const { return aux_loss_t_; }  // F64 [1] on the device (empty without MoE layers)

  // Forward (and backward) of one batch on its own under SFT's loss, read back: for tests and tools.
  StepResult step(const HostBatch& batch, bool backward, float* logits_out = nullptr);

  // The name of the tensor that holds the LM head (the embedding when tied).
  const std::string& lm_head_name() const;

 private:
  struct Activations;
  // plan()'s arena: every planned buffer allocated and bound to its tensor by name.
  static void bind_planned_buffers(Activations& a, Ops& ops);
  // Layer l's forward in two halves: attention (resid[l] → mid[l], and h2 = ln2(mid) fused with that add;
  // norm_input: normalise h1 from resid here, when no fused add before it has) and MLP (mid[l] → resid[l+1]
  // tile by tile, and the next norm fused with that add).
  void forward_attention(int64_t l, bool norm_input);
  void forward_mlp(int64_t l);
  // The MLP's backward, tile by tile (recomputing each tile first when recompute keeps no MLP tensors).
  void backward_mlp(int64_t l);
  void refill_qk(int64_t l);  // q, k from q_raw, k_raw: not kept per layer with q/k norms (the plan)
  void upload(const HostBatch& batch);
  // UserError when a document's scored tokens reach past Mistral's sliding window (ModelConfig::sliding_window).
  void refuse_past_window(const HostBatch& batch, int window) const;
  // The LM head over forward's final hidden states, chunk by chunk: logits, cross-entropy (NLL per token),
  // and with `weights` its backward into dhf and the head's gradient.
  // With `entropy`, each token's entropy too (the objective's out.token_entropy).
  void head_pass(const Tensor* weights, float* logits_out, bool entropy);
  void backward_layer(int64_t l);
  // Where a group's weights are first read in a pass: the weight stream's and the hooks' events, in that order.
  void weights_needed_forward(int group);
  void weights_needed_backward(int group);
  Tensor dres_rounded() const;  // where rmsnorm_backward also writes dres in the activation dtype (or none)
  QkvTensors qkv(int64_t l) const;
  MlpTensors mlp_tile(int64_t l, int64_t t0, int64_t t1) const;  // tokens [t0, t1) of layer l's MLP tensors
  MoeTensors moe_tensors(int64_t l) const;                       // MoE layer l's
  LoraPass lora_pass() const;
  Tensor lora_u(LoraTarget t, int64_t l) const;  // the adapter's saved u (empty without one)
  // The offloaded checkpoints' ring (set_offload_checkpoints; no-ops without it), transformer.cpp says how the
  // streams and marks guard each slot. Forward: before_checkpoint_write(j) before the kernel that writes
  // resid[j], checkpoint_written(j) after it. Backward: prefetch_checkpoints(l) before layer l's backward,
  // checkpoint_ready(j) before anything reads resid[j].
  void before_checkpoint_write(int64_t j);
  void checkpoint_written(int64_t j);
  void prefetch_checkpoints(int64_t l);
  void checkpoint_ready(int64_t j);

  ModelConfig config_;
  std::optional<LoraConfig> lora_;
  bool dropout_enabled_ = true, dropout_now_ = false, adapters_on_ = true;
  float inv_temperature_ = 1.0f;
  int64_t dropout_step_ = 0;
  Ops& ops_;
  ParameterStore params_;
  std::vector<DecoderLayer> layers_;
  std::unique_ptr<Activations> acts_;
  Buffer inv_freq_;
  Tensor inv_freq_t_;
  LayerHooks* hooks_ = nullptr;
  std::unique_ptr<WeightStream> weight_stream_;
  std::optional<DType> residual_dtype_;
  int64_t token_tile_ = kTokenTileAuto;
  bool offload_checkpoints_ = false;
  std::unique_ptr<SftObjective> own_sft_;  // step()'s objective
  std::unique_ptr<Fp8Recipe> fp8_;
  std::unique_ptr<QatState> qat_;
  void plan_qat();
  std::unique_ptr<ExpertParallel> ep_;
  Buffer aux_loss_;  // F64 [1]: the load-balancing loss of the passes since reset_aux_loss (MoE models)
  Tensor aux_loss_t_;
};

// The model's parameters by Hugging Face name, in the store's order (what the Transformer adds before allocating;
// `bench --plan-only` sizes a run from them without allocating): the base, frozen under `lora` (and kept in
// host memory with its offload_base), then the adapters.
void add_model_parameters(ParameterStore& ps, const ModelConfig& c, const std::optional<LoraConfig>& lora);

// Why `modules` (LoRA's modules_to_save) cannot train beside the adapters of a model of config `c`, or "" (the run's
// early check and the model's own say it alike).
std::string modules_to_save_refusal(const std::vector<std::string>& modules, const ModelConfig& c);

// Unties a tied model whose embedding or LM head trains beside the adapters (modules_to_save), as PEFT does: two
// copies, the LM head read from the stored embedding (the Transformer calls it on its own config).
void untie_for_modules_to_save(ModelConfig& c, const std::optional<LoraConfig>& lora);

// Checks every id and target against the vocabulary; errors name `source`.
// (`target_classes`: what a target may be, when not a token: a token classifier's labels)
void validate_batch(const HostBatch& b, int vocab_size, const std::string& source, int target_classes = 0);

}  // namespace soltrain
