#include "train/backward_update.h"

#include "core/error.h"
#include "train/grad_offload.h"

namespace soltrain {

BackwardUpdate::BackwardUpdate(Transformer& model, AdamW& adamw)
    : model_(model), adamw_(adamw), layers_(int(model.config().num_layers)) {
  ParameterStore& ps = model.params();
  Ops& ops = model.ops();
  // (the slots are sized as offload_grads sizes its: the widest layer's fp32 gradients)
  const size_t slot = GradOffload::plan(ps, layers_).slot;
  ps.drop_layer_grads(ops, layers_);
  for (Buffer& b : slot_) b = ops.alloc(slot);
  updated_.assign(size_t(layers_), false);
}

Tensor BackwardUpdate::slot_view(int group) const {
  const Buffer& b = slot_[group % 2];
  return Tensor{b.data(), DType::F32, {model_.params().group_numel(group)}, b.device()};
}

void BackwardUpdate::begin_update(const OptimizerConfig& cfg, float lr, const Tensor& sumsq) {
  SOLTRAIN_CHECK(cfg.max_grad_norm <= 0, "optimizer_in_backward clips nothing (max_grad_norm 0)");
  cfg_ = cfg;
  lr_ = lr;
  sumsq_ = sumsq;
  updated_.assign(size_t(layers_), false);
  in_update_ = true;
  adamw_.begin_parts();
}

void BackwardUpdate::bind_zeroed(int group) {
  // (stream order: the slot's previous layer was updated on the main stream before this zeroing)
  const Tensor slot = slot_view(group);
  model_.ops().zero(slot);
  model_.params().bind_grads(group, slot);
}

void BackwardUpdate::before_backward(int group) {
  if (group >= layers_) return;
  SOLTRAIN_CHECK(in_update_ && !updated_[size_t(group)],
                 "optimizer_in_backward: a second backward pass in one update (gradient_accumulation_steps 1)");
  bind_zeroed(group);
}

void BackwardUpdate::grads_ready(int group) {
  if (group >= layers_) return;  // (the head's group is updated after the pass)
  model_.ops().reduce_sum(sumsq_, slot_view(group), /*squares=*/true, /*accumulate=*/true);
  adamw_.step_part(cfg_, lr_, group);
  model_.params().bind_grads(group, Tensor{});
  updated_[size_t(group)] = true;
}

void BackwardUpdate::finish_update() {
  ParameterStore& ps = model_.params();
  for (int g = 0; g < layers_; ++g) {
    if (updated_[size_t(g)]) continue;
    bind_zeroed(g);
    adamw_.step_part(cfg_, lr_, g);
    ps.bind_grads(g, Tensor{});
  }
  for (int g = layers_; g < ps.groups(); ++g) {  // the head's group
    model_.ops().reduce_sum(sumsq_, ps.group_grads(g), /*squares=*/true, /*accumulate=*/true);
    adamw_.step_part(cfg_, lr_, g);
  }
  Ops& ops = model_.ops();
  ops.wait(Ops::Stream::Main, Ops::Stream::Side);  // offloaded state: the parts' write-backs
  in_update_ = false;
}

}  // namespace soltrain
