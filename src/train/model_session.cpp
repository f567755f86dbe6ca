#include "train/model_session.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/checkpoint.h"
#include "model/decoder.h"
#include "model/peft_adapter.h"
#include "train/run_builder.h"
#include "train/trained_model.h"

namespace soltrain {

HostBatch rows_batch(int rows, int seq_len, std::vector<int32_t> input_ids, std::vector<int32_t> targets) {
  HostBatch b;
  b.rows = rows;
  b.seq_len = seq_len;
  b.input_ids = std::move(input_ids);
  b.targets = std::move(targets);
  return b;
}

WeightedStep::WeightedStep(Ops&, std::span<const float> weights) : weights_(weights) {}

void WeightedStep::train_micro_batch(Transformer& model, const HostBatch& b) {
  model.forward(b, this, /*backward_follows=*/true);
  model.backward(*this);
}

void WeightedStep::token_weights(Ops& ops, const ForwardOutputs&, Tensor weight) {
  ops.copy(weight, Tensor{const_cast<float*>(weights_.data()), DType::F32, {int64_t(weights_.size())}, Device::CPU});
}

void WeightedStep::add_loss(Ops& ops, const ForwardOutputs& out) {
  std::vector<float> nll(size_t(out.token_nll.numel()));
  ops.copy(Tensor{nll.data(), DType::F32, {int64_t(nll.size())}, Device::CPU}, out.token_nll);
  for (size_t i = 0; i < nll.size(); ++i) loss_ += double(weights_[i]) * double(nll[i]);
}

ModelSession::ModelSession(const TrainConfig& c, Ops& ops, int rows) : config_(c), ops_(ops), rows_(rows) {
  if (rows < 1) user_error("rows ", rows, ": expected >= 1");
  model_ = load_run_model(config_, ops, lora_config(config_), {});
  configure_model(*model_, config_, ops, rows);
  step_ = std::make_unique<TrainStep>(*model_, optimizer_config(config_));
}

ModelSession::~ModelSession() = default;

void ModelSession::check_batch(const HostBatch& b) const {
  if (b.rows != rows_ || b.seq_len != config_.sequence_len)
    user_error("a batch of ", b.rows, " x ", b.seq_len, " tokens: this model takes ", rows_, " x ",
               config_.sequence_len, " (the rows and sequence_len it was made with)");
  const size_t n = size_t(b.rows) * size_t(b.seq_len);
  if (b.input_ids.size() != n || b.targets.size() != n)
    user_error("input_ids and targets must each hold rows x seq_len = ", n, " tokens");
  const int32_t vocab = int32_t(model_->config().vocab_size);
  for (size_t i = 0; i < n; ++i) {
    if (b.input_ids[i] < 0 || b.input_ids[i] >= vocab)
      user_error("input_ids[", i, "] = ", b.input_ids[i], ": outside the model's vocabulary of ", vocab);
    if (b.targets[i] != -100 && (b.targets[i] < 0 || b.targets[i] >= vocab))
      user_error("targets[", i, "] = ", b.targets[i], ": expected a token id below ", vocab, " or -100");
  }
}

std::vector<float> ModelSession::logprobs(const HostBatch& b) {
  check_batch(b);
  std::vector<float> nll;
  NllReader reader(nll);
  model_->forward(b, &reader, /*backward_follows=*/false);
  for (float& v : nll) v = -v;
  return nll;
}

double ModelSession::step(const HostBatch& b, std::span<const float> weights, float lr) {
  check_batch(b);
  if (weights.empty()) {
    step_->run({&b, 1}, lr);
    return step_->loss();
  }
  if (weights.size() != b.input_ids.size())
    user_error("weights: ", weights.size(), " values for ", b.input_ids.size(), " tokens (one per token)");
  for (size_t i = 0; i < weights.size(); ++i)
    if (!std::isfinite(weights[i])) user_error("weights[", i, "] = ", weights[i], ": expected a finite number");
  WeightedStep objective(ops_, weights);
  step_->run({&b, 1}, lr, -1, &objective);
  return objective.loss();
}

std::vector<std::vector<int32_t>> ModelSession::generate(const std::vector<std::vector<int32_t>>& prompts,
                                                         const GenerationOptions& o) {
  if (prompts.empty()) user_error("generate: no prompts");
  o.sampling.validate();
  if (o.max_new_tokens < 1) user_error("max_new_tokens ", o.max_new_tokens, ": expected >= 1");
  const int64_t max_pos = model_->config().max_position_embeddings;
  size_t longest = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) user_error("generate: prompt ", i, " is empty");
    longest = std::max(longest, prompts[i].size());
  }
  if (int64_t(longest) + o.max_new_tokens > max_pos)
    user_error("generate: a prompt's ", longest, " tokens plus ", o.max_new_tokens,
               " new ones exceed the model's max_position_embeddings (", max_pos, ")");
  // Every prompt is a row of one batch: each fed at its own length, then one token per row per step.
  return generate_each(*model_, prompts, o);
}

void ModelSession::save(const std::filesystem::path& out) const {
  save_trained_model(config_, *model_, out);
}

}  // namespace soltrain
