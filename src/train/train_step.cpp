#include "train/train_step.h"

#include <cmath>

namespace soltrain {

TrainStep::TrainStep(Transformer& model, const OptimizerConfig& opt)
    : model_(model),
      opt_(opt),
      adamw_(model.params(), model.ops(), opt.moments),
      sft_(model.ops()),
      sumsq_(model.ops().alloc(sizeof(double))) {}

void TrainStep::run(std::span<const HostBatch> micro_batches, float lr) {
  Ops& ops = model_.ops();
  ops.zero(model_.params().all_grads());
  counted_ = 0;
  for (const HostBatch& b : micro_batches) counted_ += b.counted();
  // Every token weighs 1 / (the update's counted targets), so gradients accumulate without rescaling.
  sft_.begin_update(counted_);
  for (const HostBatch& b : micro_batches) {
    if (b.counted() == 0) continue;  // nothing trained in it: contributes nothing
    model_.forward(b, &sft_, /*backward_follows=*/true);
    model_.backward(sft_);
  }
  ops.wait(Ops::Stream::Main, Ops::Stream::Side);  // whatever the layer hooks queued
  const Tensor sumsq{sumsq_.data(), DType::F64, {1}, sumsq_.device()};
  ops.reduce_sum(sumsq, model_.params().all_grads(), /*squares=*/true, /*accumulate=*/false);
  adamw_.step(opt_, lr, 1.0f, &sumsq);
}

double TrainStep::loss() const {
  return sft_.read_loss(model_.ops());
}

double TrainStep::grad_norm() const {
  double s = 0;
  model_.ops().copy(Tensor{&s, DType::F64, {1}, Device::CPU}, Tensor{sumsq_.data(), DType::F64, {1}, sumsq_.device()});
  return std::sqrt(s);
}

}  // namespace soltrain
