#include "model/reward_objective.h"

#include "core/error.h"

namespace soltrain {

std::vector<int32_t> scored_tokens(const std::vector<int32_t>& ids, const std::vector<int32_t>& cu, int pad_token_id) {
  std::vector<int32_t> out;
  for (size_t d = 0; d + 1 < cu.size(); ++d) {
    int32_t t = cu[d + 1] - 1;
    while (t > cu[d] && ids[size_t(t)] == pad_token_id) --t;
    // (all pad: transformers' argmax over an all-zero mask gives the first position)
    if (ids[size_t(t)] == pad_token_id) t = cu[d];
    out.push_back(t);
  }
  return out;
}

RewardObjective::RewardObjective(Ops& ops, RewardConfig cfg, int64_t max_tokens, int pad_token_id)
    : cfg_(cfg),
      max_tokens_(max_tokens),
      pad_(pad_token_id),
      // a pair takes two documents of at least a token each: at most max_tokens / 2 pairs
      pairs_(ops.alloc(size_t(max_tokens / 2 + 1) * 2 * sizeof(int32_t))),
      weight_(ops.alloc(size_t(max_tokens) * sizeof(float))),
      stats_(ops.alloc(kRewardStats * sizeof(double))),
      upload_pairs_(ops, size_t(max_tokens / 2 + 1) * 2 * sizeof(int32_t)) {
  if (!(cfg.center_rewards_coefficient >= 0))
    user_error("center_rewards_coefficient must be >= 0 (got ", cfg.center_rewards_coefficient, ")");
}

void RewardObjective::begin_update(int64_t pairs) {
  update_pairs_ = pairs;
  first_ = true;
}

void RewardObjective::add_loss(Ops& ops, const ForwardOutputs& out) {
  const HostBatch& b = *out.host;
  SOLTRAIN_CHECK(b.pairs.size() % 2 == 0 && b.desirable.empty(), "a reward batch holds pairs");
  const std::vector<int32_t> cu = document_offsets(b);
  const std::vector<int32_t> last = scored_tokens(b.input_ids, cu, pad_);
  tokens_ = out.scores.numel();
  SOLTRAIN_CHECK(tokens_ <= max_tokens_, "more tokens than planned");
  const size_t P = b.pairs.size() / 2;
  host_pairs_.resize(2 * P);
  for (size_t i = 0; i < 2 * P; ++i) {
    const int32_t d = b.pairs[i];
    SOLTRAIN_CHECK(d >= 0 && size_t(d) < last.size(), "a pair names a document outside the batch");
    host_pairs_[i] = last[size_t(d)];
  }
  const Tensor pairs{pairs_.data(), DType::I32, {int64_t(P), 2}, pairs_.device()};
  if (P > 0) upload_pairs_(ops, pairs, host_pairs_.data());
  const Tensor w{weight_.data(), DType::F32, {tokens_}, weight_.device()};
  ops.fill(w, 0.0f);
  RewardParams p;
  p.center_coef = cfg_.center_rewards_coefficient;
  p.pair_scale = update_pairs_ > 0 ? 1.0f / float(update_pairs_) : 0.0f;
  ops.reward_loss(w, Tensor{stats_.data(), DType::F64, {kRewardStats}, stats_.device()}, out.scores, pairs,
                  Tensor{nullptr, DType::F32, {0}, weight_.device()}, p, !first_);
  first_ = false;
}

void RewardObjective::token_weights(Ops& ops, const ForwardOutputs& out, Tensor weight) {
  // add_loss (in forward) has left d loss / d score at each pair's two scored tokens, 0 elsewhere
  SOLTRAIN_CHECK(tokens_ == weight.numel() && out.scores.numel() == tokens_,
                 "token_weights before this micro-batch's forward");
  ops.copy(weight, Tensor{weight_.data(), DType::F32, {tokens_}, weight_.device()});
}

RewardMetrics RewardObjective::read(Ops& ops) const {
  RewardMetrics m;
  if (first_) return m;
  std::array<double, kRewardStats> s{};
  ops.copy(Tensor{s.data(), DType::F64, {kRewardStats}, Device::CPU},
           Tensor{stats_.data(), DType::F64, {kRewardStats}, stats_.device()});
  m.pairs = int64_t(s[kRewPairs]);
  if (m.pairs == 0) return m;
  const double n = s[kRewPairs];
  m.loss = update_pairs_ > 0 ? s[kRewLoss] / double(update_pairs_) : 0.0;
  m.accuracy = s[kRewAccuracy] / n;
  m.margin = s[kRewMargin] / n;
  m.reward_chosen = s[kRewChosen] / n;
  m.reward_rejected = s[kRewRejected] / n;
  m.mean_reward = (s[kRewChosen] + s[kRewRejected]) / (2 * n);
  m.min_reward = s[kRewMin];
  m.max_reward = s[kRewMax];
  return m;
}

void reward_begin_update(RewardObjective& objective, std::span<const HostBatch> micro_batches) {
  int64_t pairs = 0;
  for (const HostBatch& b : micro_batches) pairs += int64_t(b.pairs.size() / 2);
  objective.begin_update(pairs);
}

}  // namespace soltrain
