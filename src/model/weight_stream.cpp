#include "model/weight_stream.h"

namespace soltrain {

WeightStream::WeightStream(ParameterStore& ps, Ops& ops, int layers) : ps_(ps), ops_(ops), layers_(layers) {
  SOLTRAIN_CHECK(ps.frozen_host_groups() >= layers, "offload_weights: the base's layers are not in host memory");
  const DType act = ops.activation_dtype();
  slot_bytes_ = size_t(ps.max_frozen_host_group_numel()) * dtype_size(act);
  for (Slot& s : slots_) s.buffer = ops.alloc(slot_bytes_);
}

void WeightStream::start_pass() {
  // A pass that ended early (an exception between forward and backward) may leave a copy Main never waited
  // for, its mark since recycled: order Main after all of Upload once instead of trusting it.
  for (Slot& s : slots_)
    if (!s.awaited) {
      ops_.wait(Ops::Stream::Main, Ops::Stream::Upload);
      for (Slot& t : slots_) t.awaited = true;
      break;
    }
}

WeightStream::Slot& WeightStream::fill(int g) {
  // Never the slot of the layer in use; of the others the one needed longest ago.
  const bool busy0 = current_ >= 0 && slots_[0].group == current_;
  const bool busy1 = current_ >= 0 && slots_[1].group == current_;
  Slot& s = slots_[busy0 ? 1 : busy1 ? 0 : slots_[0].used <= slots_[1].used ? 0 : 1];
  if (s.group >= 0) ps_.bind_frozen(s.group, Tensor{});  // back to its host copy
  const Tensor host = ps_.frozen_on_host(g);
  const Tensor dst{s.buffer.data(), host.dtype, host.shape, s.buffer.device()};
  // Main's reads of what the slot held are queued before this point: the copy starts after them.
  ops_.wait(Ops::Stream::Upload, Ops::Stream::Main);
  ops_.use_stream(Ops::Stream::Upload);
  ops_.upload_async(dst, host);  // the host copy never changes: nothing to wait for on the host
  s.ready = ops_.mark();
  ops_.use_stream(Ops::Stream::Main);
  s.group = g;
  s.awaited = false;
  ++copies_;
  ps_.bind_frozen(g, dst);
  return s;
}

void WeightStream::ensure(int g) {
  Slot* s = slots_[0].group == g ? &slots_[0] : slots_[1].group == g ? &slots_[1] : &fill(g);
  if (!s->awaited) {
    if (s->ready) ops_.wait_mark(s->ready);  // on Main: the layer's weights are on the device from here on
    s->awaited = true;
  }
  s->used = ++clock_;
  current_ = g;
}

void WeightStream::prefetch(int g) {
  if (g < 0 || g >= layers_ || slots_[0].group == g || slots_[1].group == g) return;
  fill(g);
}

void WeightStream::before_forward(int g) {
  if (g == layers_) {  // the head group (resident) starts forward: layer 0 comes next
    start_pass();
    return prefetch(0);
  }
  ensure(g);
  prefetch(g + 1);
}

void WeightStream::before_backward(int g) {
  if (g == layers_) {  // backward starts at the head, then the last layer
    start_pass();
    return prefetch(layers_ - 1);
  }
  ensure(g);
  prefetch(g - 1);
}

}  // namespace soltrain
