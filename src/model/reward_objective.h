// A Bradley–Terry reward model's objective (TRL's RewardTrainer): a sequence classifier (ModelConfig::num_labels 1)
// scores each answer, prompt included, at its last token that is not the pad token (where transformers'
// *ForSequenceClassification pools), and the loss is −log σ(r_chosen − r_rejected) (+ center_rewards_coefficient ×
// (r_chosen + r_rejected)²), averaged over the update's pairs. Its batches are the preference loader's pairs
// (data/pair_loader.h: chosen and rejected as documents of their own); the op is kernels/ops.h reward_loss.
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "model/dpo_objective.h"  // StagedUpload, document_offsets
#include "model/objective.h"
#include "model/transformer.h"

namespace soltrain {

struct RewardConfig {
  float center_rewards_coefficient = 0;  // TRL's (None there: 0 here)
};

// What an update (or an evaluation) measured, as TRL's RewardTrainer logs it.
struct RewardMetrics {
  double loss = 0, accuracy = 0, margin = 0;               // means over the pairs
  double min_reward = 0, mean_reward = 0, max_reward = 0;  // over both answers of every pair
  double reward_chosen = 0, reward_rejected = 0;           // means over the pairs
  int64_t pairs = 0;
};

// The token whose score is the sequence's reward, for each document of `cu` (offsets into `ids`): its last token
// that is not `pad_token_id`, or its first when every token is (transformers' pooling, per document).
std::vector<int32_t> scored_tokens(const std::vector<int32_t>& ids, const std::vector<int32_t>& cu, int pad_token_id);

class RewardObjective final : public Objective {
 public:
  // Buffers for micro-batches of up to `max_tokens` tokens; `pad_token_id` as the model's config says it.
  RewardObjective(Ops& ops, RewardConfig cfg, int64_t max_tokens, int pad_token_id);
  void begin_update(int64_t pairs);  // the update's pairs over all its micro-batches (the loss's divisor)
  bool weights_before_forward() const override { return false; }
  bool reads_scores() const override { return true; }
  void token_weights(Ops& ops, const ForwardOutputs& out, Tensor weight) override;
  void add_loss(Ops& ops, const ForwardOutputs& out) override;
  RewardMetrics read(Ops& ops) const;  // a sync: logging steps
  const RewardConfig& config() const { return cfg_; }

 private:
  RewardConfig cfg_;
  int64_t max_tokens_;
  int pad_;
  Buffer pairs_, weight_, stats_;
  std::vector<int32_t> host_pairs_;
  StagedUpload upload_pairs_;
  int64_t tokens_ = 0, update_pairs_ = 0;
  bool first_ = true;
};

// The reward model's update: the pairs of all its micro-batches are the divisor.
void reward_begin_update(RewardObjective& objective, std::span<const HostBatch> micro_batches);

}  // namespace soltrain
