#include "model/weight_stream.h"

#include "core/error.h"

namespace soltrain {

std::vector<int> WeightStream::streamed_layers(int layers, int resident) {
  if (resident < 0 || resident >= layers)
    user_error("offload_weights_resident_layers ", resident, " must be between 0 and ", layers - 1, " (the model has ",
               layers, " decoder layers; keeping all of them means no offload_weights)");
  // Streamed layer i of S sits at floor((2i + 1)·L / 2S): the middle of the i-th of S equal spans.
  const int S = layers - resident;
  std::vector<int> out;
  for (int i = 0; i < S; ++i) out.push_back(int((2 * int64_t(i) + 1) * layers / (2 * int64_t(S))));
  return out;
}

WeightStream::WeightStream(ParameterStore& ps, Ops& ops, int layers)
    : ps_(ps), ops_(ops), layers_(layers), is_streamed_(size_t(layers), false) {
  for (int g = 0; g < layers; ++g)
    if (ps.frozen_group_on_host(g)) streamed_.push_back(g), is_streamed_[size_t(g)] = true;
  SOLTRAIN_CHECK(!streamed_.empty(), "offload_weights: none of the base's layers is in host memory");
  const DType act = ops.activation_dtype();
  slot_bytes_ = size_t(ps.max_frozen_host_group_numel()) * dtype_size(act);
  for (Slot& s : slots_) s.buffer = ops.alloc(slot_bytes_);
}

void WeightStream::start_pass() {
  // Weights uploaded since the slots were filled (a model reloaded between passes): copy them again.
  if (ps_.frozen_host_version() != version_) {
    for (Slot& s : slots_)
      if (s.group >= 0) ps_.bind_frozen(s.group, Tensor{}), s.group = -1;
    version_ = ps_.frozen_host_version();
  }
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
  if (g < 0 || slots_[0].group == g || slots_[1].group == g) return;
  fill(g);
}

int WeightStream::next_streamed(int g, bool forward) const {
  // (g == layers_: the head group, which starts either pass)
  if (forward) {
    for (int s : streamed_)
      if (g == layers_ || s > g) return s;
    return -1;
  }
  for (auto it = streamed_.rbegin(); it != streamed_.rend(); ++it)
    if (g == layers_ || *it < g) return *it;
  return -1;
}

void WeightStream::before_forward(int g) {
  if (g == layers_) start_pass();
  if (g < layers_ && is_streamed_[size_t(g)])
    ensure(g);
  else
    current_ = -1;  // a resident layer or the head: every read of the last streamed layer is queued
  prefetch(next_streamed(g, true));
}

void WeightStream::before_backward(int g) {
  if (g == layers_) start_pass();
  if (g < layers_ && is_streamed_[size_t(g)])
    ensure(g);
  else
    current_ = -1;
  prefetch(next_streamed(g, false));
}

}  // namespace soltrain
