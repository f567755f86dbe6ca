// `optimizer_in_backward` (torchtune's optimizer_in_bwd): each decoder layer is updated the moment its backward
// ends, from gradients that lived only in one of two device slots, so no whole-model gradient exists anywhere
// (Qwen3-30B-A3B full fine-tuning: 2 x 2.4 GiB instead of 114 GiB of fp32 gradients). The store keeps no
// gradient buffer for the layers (ParameterStore::drop_layer_grads); before a layer's backward its slot is
// zeroed and bound as its gradients, and once the layer is done AdamW updates that layer's parameters
// (AdamW::step_part) from the slot on the main stream, before layer l-2 reuses it. The head's group (embedding,
// final norm, head) keeps its gradients and is updated after the pass. Each update has one backward pass
// (gradient_accumulation_steps 1) and no clipping (the global norm is known only after the last layer was
// updated): the config refuses the others. With those, the weights are the ordinary update's bit for bit.
#pragma once
#include <vector>

#include "core/buffer.h"
#include "model/transformer.h"
#include "train/optimizer.h"

namespace soltrain {

class BackwardUpdate final : public LayerHooks {
 public:
  // Drops the layers' gradient buffer and makes the two slots (the widest layer's gradients each).
  BackwardUpdate(Transformer& model, AdamW& adamw);
  size_t device_bytes() const { return slot_[0].bytes() + slot_[1].bytes(); }
  // An update begins: its layers are updated with these settings at this learning rate as their backward ends;
  // Σ g² of every layer is added into `sumsq` (F64 [1], zeroed by the caller) for the logged norm.
  void begin_update(const OptimizerConfig& cfg, float lr, const Tensor& sumsq);
  // After the pass: a layer no pass reached (an update with nothing to train) is updated from zero gradients,
  // as the ordinary update would, then the head's group; the update's host copies (offloaded state) are waited for.
  void finish_update();

  void before_backward(int group) override;
  void grads_ready(int group) override;

 private:
  Transformer& model_;
  AdamW& adamw_;
  int layers_;
  Buffer slot_[2];
  OptimizerConfig cfg_;
  float lr_ = 0;
  Tensor sumsq_;
  std::vector<bool> updated_;  // per layer: updated in this update
  bool in_update_ = false;
  Tensor slot_view(int group) const;
  void bind_zeroed(int group);
};

}  // namespace soltrain
