// A model held for step-level training from code (the Python API's soltrain.Model, and GRPO's trainer next):
// per-token log-probs, one optimizer update under per-token loss weights the caller chose, generation, and
// the save. It is built from a TrainConfig by the run builder, as every run is, and updates through
// TrainStep, so its clipping, AdamW, schedule-free learning rate and formats are a run's.
#pragma once
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "model/generation.h"
#include "model/transformer.h"
#include "train/train_config.h"
#include "train/train_step.h"

namespace soltrain {

// rows × seq_len token ids and their targets (-100: no target) as one batch, one document per row.
HostBatch rows_batch(int rows, int seq_len, std::vector<int32_t> input_ids, std::vector<int32_t> targets);

// An update whose loss is Σ_n weights[n] · (−log p(targets[n])) over the micro-batch's tokens: the caller's
// objective (GRPO's advantages, a distillation weight) as per-token weights, d loss / d NLL. A weight on a
// token whose target is -100 counts nothing.
class WeightedStep final : public StepObjective, private Objective {
 public:
  WeightedStep(Ops& ops, std::span<const float> weights);
  void begin_update(std::span<const HostBatch>) override {}
  bool trains(const HostBatch& b) const override { return b.counted() > 0; }
  void train_micro_batch(Transformer& model, const HostBatch& b) override;
  double loss() const { return loss_; }  // Σ w · nll, in double

 private:
  bool weights_before_forward() const override { return true; }
  void token_weights(Ops& ops, const ForwardOutputs& out, Tensor weight) override;
  void add_loss(Ops& ops, const ForwardOutputs& out) override;
  std::span<const float> weights_;
  double loss_ = 0;
};

class ModelSession {
 public:
  // c.model (with c's adapters and base storage), planned for `rows` × c.sequence_len, and its optimizer.
  ModelSession(const TrainConfig& c, Ops& ops, int rows);
  ~ModelSession();
  int rows() const { return rows_; }
  int seq_len() const { return config_.sequence_len; }
  const ModelConfig& model_config() const { return model_->config(); }

  // log p(target) of every token of the batch (0 where the target is -100), row-major [rows × seq_len].
  std::vector<float> logprobs(const HostBatch& b);
  // One update at `lr`: SFT's mean cross-entropy when `weights` is empty, else Σ weights · NLL (WeightedStep).
  // Returns the loss; grad_norm() is the update's norm before clipping.
  double step(const HostBatch& b, std::span<const float> weights, float lr);
  double grad_norm() const { return step_->grad_norm(); }
  // Greedy or sampled continuations of `prompts`, generated together as one batch (a KV cache sized for the
  // longest); prompt i's row samples with seed + i.
  std::vector<std::vector<int32_t>> generate(const std::vector<std::vector<int32_t>>& prompts,
                                             const GenerationOptions& o);
  // The model (HF folder) or adapter (PEFT folder) to `out`, as a run's final save.
  void save(const std::filesystem::path& out) const;

 private:
  void check_batch(const HostBatch& b) const;
  TrainConfig config_;
  Ops& ops_;
  int rows_;
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<TrainStep> step_;
};

}  // namespace soltrain
