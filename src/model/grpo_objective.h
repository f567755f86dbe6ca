// GRPO (TRL's GRPOTrainer) as an Objective: group-relative advantages from the rewards, then in one forward the
// policy's per-token NLL, and the op (kernels/ops.h policy_loss) turns it, with the advantages, the sampling
// policy's log-probs (num_iterations > 1) and the reference's (β > 0), into the loss, its metrics and d loss / d
// NLL per token for backward. The loss types differ only in each completion's share of the update's loss
// (grpo_document_scales): what TRL divides by.
#pragma once
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/buffer.h"
#include "model/dpo_objective.h"  // StagedUpload
#include "model/objective.h"
#include "model/reference_weights.h"
#include "model/transformer.h"

namespace soltrain {

// TRL's loss_type values soltrain builds. grpo: each completion's mean over its tokens, then the mean over the
// micro-batch's completions; bnpo: the micro-batch's token mean; dr_grpo: Σ over tokens / (completions ×
// max_completion_length); dapo (TRL's default): Σ over tokens / the update's completion tokens. All but dapo are
// then divided by the update's micro-batches, as TRL divides by gradient_accumulation_steps.
enum class GrpoLossType { Grpo, Bnpo, DrGrpo, Dapo };
GrpoLossType parse_grpo_loss_type(const std::string& s, const std::string& where);
const char* grpo_loss_type_name(GrpoLossType t);

// scale_rewards: the advantage r − mean(group) divided by the group's std (group), the whole batch's (batch), or
// not divided (none).
enum class ScaleRewards { Group, Batch, None };
ScaleRewards parse_scale_rewards(const std::string& s, const std::string& where);
const char* scale_rewards_name(ScaleRewards s);

// TRL's vllm_importance_sampling_mode (what TRL applies to vLLM's rollouts, soltrain to its decoder's): the ratio
// π(old) / π(sampling) of each completion token (token_*) or of the whole completion (sequence_*: the product over
// its tokens), clipped to [clip_min, clip_max] (*_truncate) or zeroed outside it (*_mask), multiplies the policy
// term. None: no correction (TRL without vLLM, or vllm_importance_sampling_correction false).
enum class SamplingCorrection { None, TokenTruncate, TokenMask, SequenceTruncate, SequenceMask };
SamplingCorrection parse_sampling_correction(const std::string& s, const std::string& where);
const char* sampling_correction_name(SamplingCorrection c);

struct GrpoConfig {
  GrpoLossType loss_type = GrpoLossType::Dapo;
  ScaleRewards scale_rewards = ScaleRewards::Group;
  float epsilon = 0.2f, epsilon_high = 0.2f, delta = 0, beta = 0;
  bool sequence_level = false;  // importance_sampling_level: sequence (GSPO) rather than token
  bool kl_ratio = true;         // use_bias_correction_kl: the KL term times the importance ratio (TRL's default)
  int max_completion_length = 512;
  // TRL's top_entropy_quantile: each micro-batch's policy term counts only at completion tokens whose entropy is
  // at least the (1 − q) quantile of its completion tokens' (torch.quantile, linear); 1: every token.
  float top_entropy_quantile = 1;
  SamplingCorrection sampling_correction = SamplingCorrection::None;
  float sampling_clip_min = NAN, sampling_clip_max = 3;  // NaN: no bound (TRL's None)
  // The values a config can hold, checked; UserErrors name `where`'s keys.
  void validate(const std::string& where) const;
};

// torch.nanmean and nanstd (unbiased) over `v`'s non-NaN values: NaN when there are none (std: fewer than two).
// The advantages' statistics and the logged reward / reward_std alike.
std::pair<double, double> nan_mean_std(std::span<const double> v);

// Advantages of a generation batch's completions, prompt by prompt in groups of `num_generations` (TRL's
// sum_then_normalize): the rewards (NaN: no reward function scored the completion) less their group's mean,
// divided by std + 1e-4 as scale_rewards says (unbiased std, NaNs left out); unscored completions get 0.
// `zero_std` (when given) receives, per completion, whether its std was 0 (TRL's frac_reward_zero_std).
std::vector<float> grpo_advantages(std::span<const double> rewards, int num_generations, ScaleRewards scale,
                                   std::vector<bool>* zero_std = nullptr);

// Each completion's share of the update's loss, per micro-batch (one completion per row, counted tokens from the
// targets), for the loss type: what TRL divides the summed token losses by.
std::vector<std::vector<float>> grpo_document_scales(const GrpoConfig& c, std::span<const HostBatch> micro_batches);

// TRL's get_high_entropy_mask on one micro-batch: 1 at counted tokens (targets != -100) whose entropy is >= the
// `threshold` quantile (torch.quantile's linear interpolation, in fp32) of the counted tokens' entropies (less
// 1e-6 of it: tied entropies computed in different rows may differ in their last bits), else 0; all 0 without
// counted tokens.
std::vector<float> high_entropy_mask(std::span<const float> entropy, std::span<const int32_t> targets, float threshold);

// TRL's importance_sampling_ratio for one micro-batch (one completion per row): per token, from its old_nll (the
// trainer's −log p when the completions were generated) and sampling_nll (the generation engine's), as `c`'s
// sampling_correction says; 1 at tokens that count nothing, and where a sampling log-prob is NaN (TRL's
// nan_to_num). Empty when the correction is off.
std::vector<float> sampling_correction_weights(const GrpoConfig& c, const HostBatch& b);

// TRL's sampling/* metrics over an update's micro-batches: |log p_old − log p_sampling| over counted tokens (mean,
// max), and the ratios (min, mean, max: over counted tokens, or per completion in the sequence modes).
struct SamplingCorrectionStats {
  double logp_diff_mean = 0, logp_diff_max = 0, ratio_min = 0, ratio_mean = 0, ratio_max = 0;
};
SamplingCorrectionStats sampling_correction_stats(const GrpoConfig& c, std::span<const HostBatch> micro_batches);

// What an update measured, under TRL's names; the means are over its micro-batches, as TRL averages them.
struct GrpoMetrics {
  double loss = 0, kl = 0, clip_low = 0, clip_high = 0, clip_region = 0, clip_low_min = 0, clip_high_max = 0;
  double entropy = 0;  // TRL's: the mean over each micro-batch's completion tokens, averaged over micro-batches
  int64_t tokens = 0, micro_batches = 0;
};

class GrpoObjective final : public Objective {
 public:
  // Buffers for micro-batches of up to `max_tokens` tokens in up to `max_rows` rows.
  GrpoObjective(Ops& ops, GrpoConfig cfg, int64_t max_tokens, int64_t max_rows);
  const GrpoConfig& config() const { return cfg_; }
  void begin_update();
  // The next micro-batch's completions' scales (grpo_document_scales), uploaded with its advantages and its
  // per-token old_nll / ref_token_nll.
  void set_micro_batch(Ops& ops, const HostBatch& b, std::span<const float> doc_scale);
  // The reference's per-token NLL from the device (LoRA: a forward with the adapters off), for the micro-batch
  // whose forward runs next; replaces the batch's ref_token_nll.
  void set_reference(Ops& ops, const Tensor& ref_token_nll);
  // Full fine-tuning with β > 0: the frozen weights the reference pass computes with (model/reference_weights.h);
  // with LoRA the reference is the base with the adapters off and none is needed.
  void set_reference_weights(ReferenceWeights* w) { reference_weights_ = w; }
  ReferenceWeights* reference_weights() const { return reference_weights_; }

  bool weights_before_forward() const override { return false; }
  bool wants_entropy() const override { return true; }
  void token_weights(Ops& ops, const ForwardOutputs& out, Tensor weight) override;
  void add_loss(Ops& ops, const ForwardOutputs& out) override;
  GrpoMetrics read(Ops& ops) const;  // a sync: call on logging steps

 private:
  Ops& ops_;
  GrpoConfig cfg_;
  int64_t max_tokens_, max_rows_;
  // stats_: F64 [kPolicyStats + 1], the policy loss's sums, then Σ over micro-batches of the mean entropy of their
  // completion tokens (read back together: one sync)
  Buffer old_, ref_, adv_, scale_, weight_, stats_;
  // top_entropy_quantile < 1 or a sampling_correction: this micro-batch's high_entropy_mask times its sampling
  // correction weights (F32 [max_tokens]); both multiply the policy term alone
  Buffer keep_;
  std::vector<float> host_entropy_;          // ... and the entropies and targets it is computed from, read back
  std::vector<float> host_correction_;       // sampling_correction: this micro-batch's weights (also into keep_)
  std::optional<StagedUpload> upload_keep_;  // ... staged into keep_ when no entropy mask waits for the forward
  std::vector<int32_t> host_targets_;
  StagedUpload upload_old_, upload_ref_, upload_adv_, upload_scale_;
  bool has_old_ = false, first_ = true, weights_ready_ = false;
  ReferenceWeights* reference_weights_ = nullptr;
  int64_t micro_batches_ = 0;
};

// The reference pass's objective (LoRA: adapters off): keeps forward's per-token NLL for the GRPO objective.
class GrpoReference final : public Objective {
 public:
  explicit GrpoReference(GrpoObjective& grpo) : grpo_(grpo) {}
  bool weights_before_forward() const override { return false; }
  void token_weights(Ops&, const ForwardOutputs&, Tensor) override {}
  void add_loss(Ops& ops, const ForwardOutputs& out) override { grpo_.set_reference(ops, out.token_nll); }

 private:
  GrpoObjective& grpo_;
};

// One micro-batch's passes under GRPO: the reference first when β > 0 and the batch carries no ref_token_nll
// (LoRA: the adapters off; full fine-tuning: the objective's reference weights lent), then forward (and
// backward).
void grpo_micro_batch(Transformer& model, GrpoObjective& grpo, const HostBatch& batch, std::span<const float> scale,
                      bool backward);

}  // namespace soltrain
