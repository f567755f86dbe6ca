#include "train/grad_offload.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "core/error.h"

namespace soltrain {

GradOffload::Plan GradOffload::plan(const ParameterStore& ps, int layers) {
  std::map<int, int64_t> per_group;
  Plan p;
  for (const Parameter& q : ps.all()) {
    if (!q.trainable) continue;
    const size_t bytes = size_t(shape_numel(q.shape)) * 4;
    if (q.group < layers)
      per_group[q.group] += shape_numel(q.shape), p.host += bytes;
    else
      p.head += bytes;
  }
  int64_t widest = 1;
  for (const auto& [g, n] : per_group) widest = std::max(widest, n);
  p.slot = size_t(widest) * 4;
  return p;
}

GradOffload::GradOffload(Transformer& model) : model_(model), layers_(int(model.config().num_layers)) {
  ParameterStore& ps = model.params();
  Ops& ops = model.ops();
  const size_t slot = plan(ps, layers_).slot;
  ps.move_layer_grads_to_host(ops, layers_);
  for (Buffer& b : slot_) b = ops.alloc(slot);
}

Tensor GradOffload::slot_view(int group) const {
  const Buffer& b = slot_[group % 2];
  return Tensor{b.data(), DType::F32, {model_.params().group_numel(group)}, b.device()};
}

void GradOffload::begin_update() {
  passes_ = 0;
  sumsq_ = nullptr;
}

void GradOffload::fill(int group) {
  Ops& ops = model_.ops();
  const int k = group % 2;
  ops.use_stream(Ops::Stream::Upload);
  if (copied_home_[k]) ops.wait_mark(copied_home_[k]);  // the slot's last layer is home
  ops.upload_async(slot_view(group), model_.params().group_grads(group));
  filled_[k] = ops.mark();
  ops.use_stream(Ops::Stream::Main);
}

void GradOffload::before_backward(int group) {
  if (group >= layers_) return;
  Ops& ops = model_.ops();
  const int k = group % 2;
  const Tensor slot = slot_view(group);
  if (passes_ == 0) {
    if (copied_home_[k]) ops.wait_mark(copied_home_[k]);
    ops.zero(slot);
  } else {
    if (group == layers_ - 1) fill(group);  // the pass's first layer (later ones are filled a layer ahead)
    if (filled_[k]) ops.wait_mark(filled_[k]);
  }
  model_.params().bind_grads(group, slot);
}

void GradOffload::grads_ready(int group) {
  if (group >= layers_) {  // the head's group ends the pass
    ++passes_;
    return;
  }
  Ops& ops = model_.ops();
  ParameterStore& ps = model_.params();
  const int k = group % 2;
  const Tensor slot = slot_view(group), home = ps.group_grads(group);
  if (sumsq_) ops.reduce_sum(*sumsq_, slot, /*squares=*/true, /*accumulate=*/true);
  const uint64_t done = ops.mark();
  ops.use_stream(Ops::Stream::Side);
  if (done) ops.wait_mark(done);
  ops.download_async(home, slot);
  copied_home_[k] = ops.mark();
  ops.use_stream(Ops::Stream::Main);
  ps.bind_grads(group, home);
  if (passes_ > 0 && group > 0) fill(group - 1);  // accumulating: the next layer's host copy, while this one computes
}

void GradOffload::finish_update() {
  Ops& ops = model_.ops();
  ops.wait(Ops::Stream::Main, Ops::Stream::Side);  // the copies home, before the update reads them
  if (passes_ > 0) return;
  // Nothing trained: the resident run's gradients are its zeroing's; here the host copies are zeroed.
  ops.synchronize();
  ParameterStore& ps = model_.params();
  for (int g = 0; g < layers_; ++g) {
    const Tensor home = ps.group_grads(g);
    std::memset(home.data, 0, size_t(home.numel()) * 4);
  }
}

}  // namespace soltrain
